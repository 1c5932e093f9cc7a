"""estimate() on kernels whose loop is not (only) the pallas_call grid.

The formulations of one tiled bfloat16 matmul: the grid (``matmul_blocked``),
``pl.kernel`` on a TensorCore mesh with ``pltpu.emit_pipeline`` inside
(``matmul_emit_pipeline``), ``emit_pipeline`` inside a grid-less ``pallas_call``
over HBM refs, and ``pl.core_map``; plus a ``fori_loop`` inside a grid step, one
whose trip count is data, the gate on seeded regressions of the mesh kernel, and
``rank_blocks`` on it. The parser runs on a checked-in libtpu 0.0.42.1 dump of
``matmul_emit_pipeline`` (256^2 bfloat16, 128 blocks, v5e: 8 pipeline steps).
"""

from __future__ import annotations

import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas._compat import libtpu_dump
from pytest_pallas.bench import gate as benchmark_gate
from pytest_pallas.bench.benchmark_estimate import tpu_estimates
from pytest_pallas.bench.estimate import estimate, rank_blocks
from pytest_pallas.checks import compile_check
from pytest_pallas.reference_kernels.matmul import (
    matmul_blocked,
    matmul_emit_pipeline,
    matmul_pipeline,
)
from pytest_pallas.tpu import tensorcore_mesh

# Two files of libtpu 0.0.42.1's dump of matmul_emit_pipeline (256^2 bfloat16, 128
# blocks, v5e), the numeric prefix shortened to 1-.
DUMP = pathlib.Path(__file__).parent / "data" / "libtpu_dump_emit_pipeline_v5e"
needs_libtpu = pytest.mark.skipif(
    compile_check.libtpu_version() is None,
    reason="needs libtpu, the TPU compiler (pip install 'pytest-pallas[tpu]')")

BF16 = jax.ShapeDtypeStruct((2048, 2048), jnp.bfloat16)
BLOCKS = {"block_m": 512, "block_k": 512, "block_n": 512}


def hbm_pipeline_matmul(x, y, *, block_m, block_k, block_n):
    """The TPU pipelining guide's way: emit_pipeline inside a pallas_call over HBM refs."""
    return pl.pallas_call(
        functools.partial(matmul_pipeline, block_m=block_m, block_k=block_k, block_n=block_n),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.VMEM((block_m, block_n), jnp.float32)],
        out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), x.dtype))(x, y)


def mesh_matmul(x, y, *, block_m, block_k, block_n, split=True):
    """pl.kernel on a TensorCore mesh; ``split=False`` seeds a lost megacore split (each
    TensorCore runs the whole pipeline)."""
    mesh = tensorcore_mesh("core", pltpu.get_tpu_info().num_cores)
    axis = "core" if split and mesh.shape["core"] > 1 else None
    return pl.kernel(
        functools.partial(matmul_pipeline, block_m=block_m, block_k=block_k, block_n=block_n,
                          core_axis_name=axis),
        out_type=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), x.dtype), mesh=mesh,
        scratch_types=[pltpu.VMEM((block_m, block_n), jnp.float32)], name="mesh_matmul")(x, y)


def core_map_matmul(x, y, *, block_m, block_k, block_n):
    """pl.core_map inside pl.run_state, the pipeline in a pl.run_scoped accumulator."""
    blocks = {"block_m": block_m, "block_k": block_k, "block_n": block_n}
    mesh = tensorcore_mesh("core", pltpu.get_tpu_info().num_cores)
    axis = "core" if mesh.shape["core"] > 1 else None

    def body(refs):
        x_ref, y_ref, o_ref = refs

        @pl.core_map(mesh)
        def _():
            pl.run_scoped(lambda acc: matmul_pipeline(x_ref, y_ref, o_ref, acc, **blocks,
                                                      core_axis_name=axis),
                          pltpu.VMEM((block_m, block_n), jnp.float32))

    _, _, out = pl.run_state(body)((x, y, jnp.zeros((x.shape[0], y.shape[1]), x.dtype)))
    return out


def panels_matmul(x, y, *, block_m, block_k, block_n, panel=1024):
    """pl.kernel whose fori_loop over row panels runs a pipeline per panel: loops nest."""
    m, n = x.shape[0], y.shape[1]

    def kernel(x_hbm, y_hbm, o_hbm, acc_ref):
        def one_panel(p, carry):
            rows = pl.ds(pl.multiple_of(p * panel, panel), panel)
            matmul_pipeline(x_hbm.at[rows], y_hbm, o_hbm.at[rows], acc_ref, block_m=block_m,
                            block_k=block_k, block_n=block_n)
            return carry

        jax.lax.fori_loop(0, m // panel, one_panel, 0)

    return pl.kernel(kernel, out_type=jax.ShapeDtypeStruct((m, n), x.dtype),
                     mesh=tensorcore_mesh("core", 1),
                     scratch_types=[pltpu.VMEM((block_m, block_n), jnp.float32)],
                     name="panels_matmul")(x, y)


def fori_kernel(x, *, trips):
    """A grid step whose work is a fori_loop of ``trips`` iterations."""
    def kernel(x_ref, o_ref):
        o_ref[...] = jax.lax.fori_loop(
            0, trips, lambda i, acc: jnp.tanh(acc) * 1.01 + x_ref[...], x_ref[...])

    return pl.pallas_call(
        kernel, grid=(x.shape[0] // 256,),
        in_specs=[pl.BlockSpec((256, 512), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((256, 512), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def data_trips_kernel(trips, x):
    """As fori_kernel, the trip count read from scalar prefetch."""
    def kernel(trips_ref, x_ref, o_ref):
        o_ref[...] = jax.lax.fori_loop(
            0, trips_ref[0], lambda i, acc: jnp.tanh(acc) * 1.01 + x_ref[...], x_ref[...])

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(x.shape[0] // 256,),
            in_specs=[pl.BlockSpec((256, 512), lambda i, t: (i, 0))],
            out_specs=pl.BlockSpec((256, 512), lambda i, t: (i, 0))))(trips, x)


# --- The parser, on a real emit_pipeline dump -----------------------------------------


def test_parser_finds_the_pipeline_loop_and_its_trip_count():
    schedule = libtpu_dump.read_kernel_schedules(str(DUMP), delay_slots=4)["call.1"]
    # pl.kernel's grid is its one core: no grid loop, the whole kernel is one step.
    assert schedule.loop_steps == 1 and (schedule.loop_start, schedule.loop_end) == (0, 223)
    [loop] = schedule.loops
    assert not loop.grid and loop.trips == 2 * 2 * 2  # the pipeline's grid
    assert (loop.start, loop.end) == (0x10, 0xd9 + 4)  # LB to the backward sbr.rel + 4 slots
    # Every copy a step may issue (x, y in; the output out): 3 blocks of 128^2 bf16.
    assert loop.dma_bytes == 3 * 128 * 128 * 2
    # The prologue copies the first x and y blocks before the loop.
    assert schedule.dma_in_bytes_outside_loops == 2 * 128 * 128 * 2
    # The two pl.when bodies of the pipeline's step, inside the loop.
    kernel_regions = [(r.start, r.end) for r in schedule.regions if not r.has_dma]
    assert kernel_regions == [(0x5b, 0x6c), (0xa5, 0xb0)]


def test_a_trip_count_held_in_a_register_is_unknown_and_noted():
    text = (DUMP / "1-call.1-71-final_bundles.txt").read_text()
    changed = text.replace(", 8 /* loop exit test */", ", %s9999_s9 /* loop exit test */")
    assert changed != text
    schedule = libtpu_dump.parse_schedule({"final_bundles": changed}, delay_slots=4)
    [loop] = schedule.loops
    assert loop.trips is None
    assert any("trip count is read from data" in note for note in schedule.notes)


# --- estimate() of each formulation -----------------------------------------------------


@needs_libtpu
def test_the_reference_emit_pipeline_matmul_is_estimated_deterministically():
    first = estimate(matmul_emit_pipeline, BF16, BF16, chip="v5e", **BLOCKS)
    again = estimate(matmul_emit_pipeline, BF16, BF16, chip="v5e", **BLOCKS)
    assert first == again  # a jitted kernel traced again: its pipeline seen both times
    [kernel] = first.kernels
    assert kernel.name == "matmul_emit_pipeline" and kernel.notes == ()
    # 64 pipeline steps of a 512^3 product: at least the MXU's 64 x 512^3 / (4 x 128^2)
    # cycles of v5e's four 128-wide MXUs.
    assert kernel.critical_path_per_step >= 64 * 512 ** 3 / (4 * 128 ** 2)


@needs_libtpu
@pytest.mark.parametrize("chip", ["v5e", "v5p"])
@pytest.mark.parametrize("formulation", [
    pytest.param(matmul_emit_pipeline, id="pl.kernel-reference"),
    pytest.param(hbm_pipeline_matmul, id="emit_pipeline-in-pallas_call"),
    pytest.param(mesh_matmul, id="pl.kernel"),
    # jax 0.12 deprecates pl.core_map for pl.kernel; kernels written with it still run,
    # and the estimate still reads them.
    pytest.param(core_map_matmul, id="pl.core_map", marks=pytest.mark.filterwarnings(
        "ignore:jax.experimental.pallas.core_map is deprecated:DeprecationWarning")),
])
def test_each_formulation_agrees_with_its_grid_twin_within_ten_percent(formulation, chip):
    grid = estimate(matmul_blocked, BF16, BF16, chip=chip, **BLOCKS).seconds
    written = estimate(formulation, BF16, BF16, chip=chip, **BLOCKS)
    # Its copies are counted (what the gate's hbm_bytes judges): x and y read at least once.
    assert written.kernels[0].dma_bytes_per_step >= 2 * 2048 * 2048 * 2
    if formulation is hbm_pipeline_matmul and chip == "v5p":
        # A pallas_call without a core axis runs on one of v5p's TensorCores: twice
        # the split grid's time, as it would on the chip.
        assert 1.8 < written.seconds / grid < 2.2
        return
    assert abs(written.seconds / grid - 1) < 0.10, (written.seconds, grid)


@needs_libtpu
def test_a_pipeline_inside_a_fori_loop_is_weighed_by_both_trip_counts():
    flat = estimate(mesh_matmul, BF16, BF16, chip="v5e", **BLOCKS).seconds
    nested = estimate(panels_matmul, BF16, BF16, chip="v5e", **BLOCKS)
    # Two panels of 32 pipeline steps each: the flat pipeline's 64 steps.
    assert abs(nested.seconds / flat - 1) < 0.10, (nested.seconds, flat)


@needs_libtpu
def test_a_fori_loop_is_weighed_by_its_trip_count():
    x = jax.ShapeDtypeStruct((1024, 512), jnp.float32)
    times = [estimate(fori_kernel, x, chip="v5e", trips=t).seconds for t in (4, 16)]
    # The loop body is most of the step: four times the trips, well over twice the time.
    assert times[1] / times[0] > 2.5


@needs_libtpu
def test_a_trip_count_read_from_data_is_counted_once_and_noted():
    x = jax.ShapeDtypeStruct((1024, 512), jnp.float32)
    est = estimate(data_trips_kernel, jax.ShapeDtypeStruct((1,), jnp.int32), x, chip="v5e")
    assert est.seconds is not None
    assert any("trip count is read from data" in note for note in est.notes)


# --- The gate and rank_blocks on these kernels ----------------------------------------


def _gate(tmp_path, baseline, current, capsys):
    def bench_file(path, found):
        entry = {"fullname": "bench_mine.py::bench_matmul", "name": "bench_matmul",
                 "stats": {"median": 1.0},
                 "extra_info": {"jax": jax.__version__, "shapes": [[2048, 2048]] * 2,
                                "tpu_estimate": found}}
        path.write_text(json.dumps({"benchmarks": [entry]}))
        return str(path)

    status = benchmark_gate.main(["--baseline", bench_file(tmp_path / "base.json", baseline),
                                  "--current", bench_file(tmp_path / "now.json", current)])
    return status, capsys.readouterr().out


@needs_libtpu
@pytest.mark.parametrize("seeded, chip", [
    (functools.partial(mesh_matmul, **{**BLOCKS, "block_k": 256}), "v5e"),  # a halved block
    (functools.partial(mesh_matmul, **BLOCKS, split=False), "v5p"),  # a lost megacore split
], ids=["halved-emit_pipeline-block", "lost-megacore-split"])
def test_a_seeded_regression_of_a_mesh_kernel_fails_the_gate(tmp_path, capsys, seeded, chip):
    baseline = tpu_estimates(functools.partial(mesh_matmul, **BLOCKS), (BF16, BF16), (chip,))
    unchanged = tpu_estimates(functools.partial(mesh_matmul, **BLOCKS), (BF16, BF16), (chip,))
    status, out = _gate(tmp_path, baseline, unchanged, capsys)
    assert status == 0, out
    status, out = _gate(tmp_path, baseline, tpu_estimates(seeded, (BF16, BF16), (chip,)),
                        capsys)
    assert status == 1, out
    line = next(line for line in out.splitlines()
                if line.startswith("ESTIMATE REGRESSED") and " seconds " in line)
    assert f"on {chip}: kernel 'mesh_matmul'" in line


@needs_libtpu
def test_rank_blocks_ranks_an_emit_pipeline_kernels_candidates():
    candidates = [{"block_m": 128, "block_k": 128, "block_n": 128},
                  {"block_m": 512, "block_k": 512, "block_n": 512},
                  {"block_m": 256, "block_k": 256, "block_n": 256}]
    ranked = rank_blocks(matmul_emit_pipeline, candidates, BF16, BF16, chip="v5e")
    assert [c.blocks["block_m"] for c in ranked] == [512, 256, 128]
    assert ranked[0].within_resolution_of_best and not ranked[-1].within_resolution_of_best
    assert ranked[-1].seconds > 2 * ranked[0].seconds  # 128 blocks: the per-step overhead


@needs_libtpu
def test_inside_a_test_standing_in_for_v5e_an_estimate_for_v5p_sees_v5ps_two_cores():
    from pytest_pallas._compat import device_kinds, interpreter_fixes
    from pytest_pallas.backend import chip_info

    alone = estimate(matmul_emit_pipeline, BF16, BF16, chip="v5p", **BLOCKS).seconds
    kind = jax.devices()[0].device_kind
    v5e = chip_info("v5e")
    with (device_kinds.device_kind_answers_as(kind, lambda: v5e),
          interpreter_fixes.chip_as_abstract_device(kind, v5e.num_cores)):
        inside = estimate(matmul_emit_pipeline, BF16, BF16, chip="v5p", **BLOCKS).seconds
        assert pltpu.get_tpu_info().num_cores == 1  # the test's own stand-in, restored
    assert inside == alone


# --- The emit_pipeline observer: guarded, and JAX put back as it was ----------------------


def test_the_pipeline_observer_sees_grid_blocks_and_body_then_restores_emit_pipeline():
    from pytest_pallas._compat import device_kinds, pallas_call_hooks
    from pytest_pallas.backend import chip_info
    from pytest_pallas.bench import kernel_grid

    original = pltpu.emit_pipeline
    seen = []
    x = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16)
    v5e = chip_info("v5e")
    with (device_kinds.device_kind_answers_as(jax.devices()[0].device_kind, lambda: v5e),
          pallas_call_hooks.observe_emit_pipelines(seen.append) as observing):
        assert observing and pltpu.emit_pipeline is not original
        jax.make_jaxpr(functools.partial(hbm_pipeline_matmul, block_m=128, block_k=128,
                                         block_n=128))(x, x)
    assert pltpu.emit_pipeline is original
    [pipeline] = seen
    assert pipeline.grid == (4, 4, 4) and pipeline.in_shapes[0] == ((512, 512), jnp.bfloat16)
    loop = kernel_grid.pipeline_loop(pipeline)
    block = 128 * 128 * 2
    # x and y: 63 changes each after the first blocks (copied before the loop); the
    # output: 16 blocks written back, each once.
    assert (loop.steps, loop.copied) == (64, (63 + 63 + 16) * block)
    assert loop.when_shares == (0.25, 0.25)  # k == 0 and k == last, of 4 k steps


def test_without_jaxs_pipeline_module_the_observer_is_off_not_an_error(monkeypatch):
    from pytest_pallas._compat import jax_internals, pallas_call_hooks

    def missing(module_name, attribute=None):
        raise jax_internals.JaxInternalsChanged(f"{module_name} is gone")

    monkeypatch.setattr(jax_internals, "private_attribute", missing)
    original = pltpu.emit_pipeline
    with pallas_call_hooks.observe_emit_pipelines(lambda seen: None) as observing:
        assert observing is False and pltpu.emit_pipeline is original


# --- A 2026 kernel whose pipeline runs a data-dependent number of steps -----------------


def _tokamax_gmm_v2():
    """tokamax's gmm_v2 module, or a pytest skip saying why it cannot be loaded here."""
    if compile_check.libtpu_version() is None:
        pytest.skip("needs libtpu, the TPU compiler (pip install 'pytest-pallas[tpu]')")
    try:
        from real_kernels.kernel_modules import load_kernel_module

        return load_kernel_module("tokamax._src.ops.gmm_v2.gmm_v2",
                                  skip_init=("tokamax", "tokamax._src"))
    except (ImportError, SyntaxError) as error:  # tokamax >= 0.0.13 needs Python 3.12, jax 0.11.1
        pytest.skip(f"tokamax's gmm_v2 does not load here: {str(error).splitlines()[0]}")


def test_tokamax_gmm_v2_is_estimated_for_7x_with_its_data_trip_count_noted():
    """tokamax's grouped matmul (pl.kernel on a TensorCore mesh, an emit_pipeline over m tiles
    whose count the kernel computes from the group sizes) is estimated for TPU7x, and the
    report says that loop's trip count is data (counted once: the estimate is low)."""
    gmm_v2 = _tokamax_gmm_v2()
    lhs = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((4, 256, 256), jnp.bfloat16)
    group_sizes = jax.ShapeDtypeStruct((4,), jnp.int32)
    est = estimate(gmm_v2.gmm_v2, lhs, rhs, group_sizes, chip="7x")
    [kernel] = est.kernels
    assert kernel.name.startswith("gmm_v2") and est.chip == "7x"
    assert kernel.seconds is not None and kernel.seconds > 0
    assert kernel.bundles_per_step > 0 and kernel.critical_path_per_step > 0
    assert any("trip count is read from data" in note and "group sizes" in note
               for note in kernel.notes), kernel.notes
