"""estimate(): a kernel's time on a TPU from the TPU compiler's schedule, on a CPU.

The parser runs on a checked-in dump of libtpu 0.0.42.1 (JAX's Pallas TPU
matmul guide kernel, 4096^2 bfloat16, 128 blocks, v5e) and on a dump it cannot
read; ``estimate`` itself compiles a small kernel with the installed libtpu
(jax 0.10.2 with libtpu 0.0.42.1, jax 0.12.0.1 with libtpu 0.0.50.1 on the
newest leg) and is skipped without libtpu.
"""

from __future__ import annotations

import functools
import pathlib

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas._compat import libtpu_dump, pallas_call_hooks
from pytest_pallas.backend import chip_timing
from pytest_pallas.bench import kernel_grid
from pytest_pallas.bench.estimate import EstimateUnavailable, estimate, rank_blocks
from pytest_pallas.checks import compile_check

# Four files of libtpu 0.0.42.1's dump (LIBTPU_INIT_ARGS="--xla_jf_dump_to=DIR") of
# guide_matmul below, 4096^2 bfloat16 with 128 blocks, compiled for v5e: the numeric
# prefix shortened to 1-, the serialized kernel in the schedule analysis elided, only
# the allocation lines of post-delay-converter kept.
DUMP = pathlib.Path(__file__).parent / "data" / "libtpu_dump_matmul_v5e"
needs_libtpu = pytest.mark.skipif(
    compile_check.libtpu_version() is None,
    reason="needs libtpu, the TPU compiler (pip install 'pytest-pallas[tpu]')")


def guide_matmul(x, y, *, bm, bk, bn, out_dtype=None):
    """JAX's Pallas TPU matmul guide kernel: init and write-back under pl.when."""
    nsteps = x.shape[1] // bk

    def kernel(x_ref, y_ref, z_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == nsteps - 1)
        def _():
            z_ref[...] = acc_ref[...].astype(z_ref.dtype)

    m, n = x.shape[0], y.shape[1]
    return pl.pallas_call(
        kernel,
        grid=(m // bm, n // bn, nsteps),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                  pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        out_shape=jax.ShapeDtypeStruct((m, n), out_dtype or x.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x, y)


# --- The parser, on a real dump and on one it cannot read ----------------------------


def test_parser_reads_the_grid_loop_of_a_real_dump():
    schedule = libtpu_dump.read_kernel_schedules(str(DUMP), delay_slots=4)["matmul.1"]
    assert schedule.notes == [] and schedule.custom_call
    assert schedule.loop_steps == 32 ** 3  # "loop exit test" 32770 = steps + 2
    assert schedule.total_bundles == 210
    # LB at 0x10 to the backward sbr.rel at 0xc7, then v5e's 4 delay slots.
    assert (schedule.loop_start, schedule.loop_end) == (0x10, 0xc8 + 4)
    kernel_regions = [(r.start, r.end) for r in schedule.regions if not r.has_dma]
    assert kernel_regions == [(0x52, 0x63), (0x9b, 0xa6)]  # the two pl.when bodies
    # The MXU block's critical path (192 cycles) runs past its bundles.
    assert max(block.cycles for block in schedule.blocks) == 192
    # Two 128x128 bfloat16 blocks in and one out per step: 3 x 32 KiB.
    assert schedule.dma_bytes_in_loop == 3 * 128 * 128 * 2
    assert schedule.vmem_bytes and schedule.vmem_bytes >= 4 * 128 * 128 * 2


def test_an_unreadable_dump_gives_none_and_one_line_notes_never_an_error():
    texts = {kind: (DUMP / name).read_text() for kind, name in [
        ("final_bundles", "1-matmul.1-71-final_bundles.txt"),
        ("critical_path", "1-matmul.1-35-critical-path.txt"),
        ("schedule_analysis_final_bundles", "1-matmul.1-70-schedule-analysis_final_bundles.txt")]}
    # Another libtpu's words for the same things.
    changed = {kind: text.replace("{", "[").replace("Length to end", "Distance")
               .replace("total scheduled bundles", "bundles") for kind, text in texts.items()}
    schedule = libtpu_dump.parse_schedule(changed, delay_slots=4)
    assert schedule.total_bundles is None and schedule.loop_steps is None
    assert schedule.blocks == []
    assert len(schedule.notes) == 4  # three unread files and the missing VMEM file
    assert all("\n" not in note for note in schedule.notes)


def test_pl_when_regions_are_weighted_by_the_share_of_steps_that_run_them():
    x = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16)
    seen = []
    with pallas_call_hooks.observe_pallas_calls(lambda p, a: seen.append(p), with_avals=True):
        jax.jit(functools.partial(guide_matmul, bm=128, bk=128, bn=128)).trace(x, x)
    assert kernel_grid.when_frequencies(seen[0], (4, 4, 4)) == [0.25, 0.25]
    copies = kernel_grid.copied_bytes(seen[0])
    block = 128 * 128 * 2
    # x and y change every step (64 copies each), the output once per (i, j): 16.
    assert copies == kernel_grid.Copies((64 + 64 + 16) * block, 2 * block, block, 0, [])


# --- estimate() ----------------------------------------------------------------------


def test_without_libtpu_estimate_names_the_install(monkeypatch):
    monkeypatch.setattr(compile_check, "libtpu_version", lambda: None)
    x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
    with pytest.raises(EstimateUnavailable, match=r"pip install 'pytest-pallas\[tpu\]'"):
        estimate(functools.partial(guide_matmul, bm=128, bk=128, bn=128), x, x)


@needs_libtpu
def test_an_unknown_chip_is_a_usage_error_naming_the_chips():
    x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
    with pytest.raises(EstimateUnavailable, match="v5e.*pytest-pallas"):
        estimate(functools.partial(guide_matmul, bm=128, bk=128, bn=128), x, x, chip="v3")


@needs_libtpu
def test_estimate_reads_the_schedule_deterministically_and_sees_a_halved_block():
    x = jax.ShapeDtypeStruct((2048, 2048), jnp.bfloat16)
    big = functools.partial(guide_matmul, bm=512, bk=1024, bn=1024)
    first = estimate(big, x, x, chip="v5e")
    assert first == estimate(big, x, x, chip="v5e")  # same kernel, chip, libtpu: same numbers
    assert first.chip == "v5e" and first.libtpu == compile_check.libtpu_version()
    (kernel,) = first.kernels
    assert kernel.grid_steps == 4 * 2 * 2 and kernel.notes == ()
    assert kernel.critical_path_per_step >= kernel.bundles_per_step > 0
    # Per step a 1 MiB block of x and a 2 MiB block of y; the 1 MiB output every 2 steps.
    assert kernel.dma_bytes_per_step == pytest.approx(3.5 * 2 ** 20)
    assert kernel.bound == "compute"
    # 512 x 1024 x 1024 multiply-adds per step take at least that many cycles at peak.
    timing = chip_timing("v5e")
    assert kernel.critical_path_per_step >= 512 * 1024 * 1024 * 2 / (
        timing.peak_flops_per_second / timing.clock_hz)
    halved = estimate(functools.partial(guide_matmul, bm=128, bk=128, bn=128), x, x, chip="v5e")
    assert halved.seconds > 2 * first.seconds
    assert halved.kernels[0].bound in ("memory", "overhead")


# Published bfloat16 peak per chip (Google Cloud's TPU pages: v4, v5e, v5p, v6e, TPU7x) and
# the TensorCores one chip holds; a JAX device is one chip, or one TensorCore of a 7x.
PUBLISHED_BF16_PEAK = {"v4": (275e12, 2), "v5e": (197e12, 1), "v5p": (459e12, 2),
                       "v6e": (918e12, 1), "7x": (2307e12, 2)}


@needs_libtpu
@pytest.mark.parametrize("chip", sorted(PUBLISHED_BF16_PEAK))
def test_a_dense_matmul_is_never_estimated_faster_than_the_published_peak(chip):
    """The schedule's cycles at the chip's clock: a large bfloat16 matmul block's compute
    term stays at or under the published peak (and within 2x of it), on every chip."""
    x = jax.ShapeDtypeStruct((2048, 2048), jnp.bfloat16)
    (kernel,) = estimate(functools.partial(guide_matmul, bm=512, bk=1024, bn=1024), x, x,
                         chip=chip).kernels
    peak, tensorcores_per_chip = PUBLISHED_BF16_PEAK[chip]
    timing = chip_timing(chip)
    per_core = peak / tensorcores_per_chip
    step_seconds = kernel.critical_path_per_step / timing.clock_hz
    at_peak = 2 * 512 * 1024 * 1024 / per_core
    assert at_peak <= step_seconds <= 2 * at_peak, (chip, step_seconds / at_peak)


@needs_libtpu
def test_float32_operands_cost_more_than_bfloat16():
    shapes = {dtype: jax.ShapeDtypeStruct((1024, 1024), dtype)
              for dtype in (jnp.bfloat16, jnp.float32)}
    kernel = functools.partial(guide_matmul, bm=256, bk=256, bn=256)
    bf16 = estimate(kernel, shapes[jnp.bfloat16], shapes[jnp.bfloat16]).kernels[0]
    f32 = estimate(kernel, shapes[jnp.float32], shapes[jnp.float32]).kernels[0]
    assert f32.dma_bytes_per_step == 2 * bf16.dma_bytes_per_step
    assert f32.critical_path_per_step > bf16.critical_path_per_step


@needs_libtpu
def test_rank_blocks_orders_candidates_and_puts_rejected_ones_last_with_the_reason():
    x = jax.ShapeDtypeStruct((1024, 1024), jnp.float32)
    candidates = [{"bm": 128, "bk": 128, "bn": 128}, {"bm": 100, "bk": 128, "bn": 128},
                  {"bm": 512, "bk": 512, "bn": 512}]
    ranked = rank_blocks(guide_matmul, candidates, x, x, chip="v5e")
    assert [c.blocks["bm"] for c in ranked] == [512, 128, 100]
    best, small, rejected = ranked
    assert best.within_resolution_of_best and best.seconds < small.seconds
    assert not small.within_resolution_of_best
    # 100 rows: not a multiple of the (8, 128) tile; the compiler's reason is kept.
    assert rejected.seconds is None and "divisible by 8 and 128" in rejected.problem


@needs_libtpu
def test_a_kernel_copying_between_devices_is_a_one_line_error_not_a_crash():
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec

    from pytest_pallas.reference_kernels.collectives import ppermute

    mesh = Mesh(np.array(jax.devices()[:2]), ("ring",))
    body = functools.partial(ppermute, axis_name="ring", shift=1)
    ring = jax.shard_map(body, mesh=mesh, in_specs=PartitionSpec("ring"),
                         out_specs=PartitionSpec("ring"), check_vma=False)
    x = jax.ShapeDtypeStruct((16, 128), jnp.float32)
    with pytest.raises(EstimateUnavailable, match="copies between devices inside shard_map"):
        estimate(ring, x, chip="v5e")
