"""Published TPU timings of Pallas kernels against ``pytest_pallas.estimate``, row by row.

Reads ``benchmarks/data/published_tpu_timings.csv`` (each row with its source),
estimates each Pallas row on the CPU from the TPU compiler's schedule, and prints
per row the published time, the estimate, their ratio, and the Spearman rank
correlation over the rows. Needs libtpu (``pip install 'pytest-pallas[tpu]'``);
no TPU.

The published times are ``timeit`` of whole calls, so they include the host's
dispatch. The same notebook's XLA matmul of 1024^3 (about 11 us of MXU work at
peak) took 119 us: that is the dispatch floor, and a row whose published time is
under three floors is marked "dispatch" and left out of the 1.3x target.

The TPU7x rows time tokamax's gmm_v2 (its perf test, tokamax 0.0.17): where tokamax
loads (Python >= 3.12, jax >= 0.11.1) each call is built as the test builds it and
estimated as written, with its data-dependent count of m tiles given, and with one
row bucket too (docs/estimate.md, "The TPU7x rows"); elsewhere they are listed as not
estimated, with the reason. ``--tokamax-only`` prints those rows alone.

    python benchmarks/estimate_calibration.py [--tokamax-only]
"""

from __future__ import annotations

import csv
import functools
import pathlib
import sys
from typing import Any

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / "benchmarks" / "data" / "published_tpu_timings.csv"
DISPATCH_ROWS = 3.0  # a row under this many dispatch floors is dominated by dispatch


def guide_matmul(x, y, *, bm, bk, bn, transpose_rhs=False, activation=lambda v: v):
    """The kernel of JAX's Pallas TPU matmul guide (docs/pallas/tpu/matmul.ipynb), as published."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_ref, y_ref, z_ref, acc_ref, *, nsteps):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        dims = (((1,), (1,)), ((), ())) if transpose_rhs else (((1,), (0,)), ((), ()))
        acc_ref[...] += jax.lax.dot_general(x_ref[...], y_ref[...], dims,
                                            preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == nsteps - 1)
        def _():
            z_ref[...] = activation(acc_ref[...]).astype(z_ref.dtype)

    if transpose_rhs:
        y = y.swapaxes(0, 1)
        y_spec = pl.BlockSpec((bn, bk), lambda i, j, k: (j, k))
    else:
        y_spec = pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))
    m, k = x.shape
    n = y.shape[0] if transpose_rhs else y.shape[1]
    return pl.pallas_call(
        functools.partial(kernel, nsteps=k // bk),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)), y_spec],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
            grid=(m // bm, n // bn, k // bk)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x, y)


def emit_pipeline_matmul(x, y, *, bm, bk, bn):
    """guide_matmul written as the TPU pipelining guide does: emit_pipeline in a pallas_call
    (the pipeline is the reference kernel's: guide_matmul's blocks, in the same order)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from pytest_pallas.reference_kernels.matmul import matmul_pipeline

    return pl.pallas_call(
        functools.partial(matmul_pipeline, block_m=bm, block_k=bk, block_n=bn),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), x.dtype))(x, y)


def mesh_kernel_matmul(x, y, *, bm, bk, bn):
    """guide_matmul as the 2026 tutorial writes it: pl.kernel on a TensorCore mesh."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from pytest_pallas.reference_kernels.matmul import matmul_pipeline
    from pytest_pallas.tpu import tensorcore_mesh

    mesh = tensorcore_mesh("core", pltpu.get_tpu_info().num_cores)
    axis = "core" if mesh.shape["core"] > 1 else None
    return pl.kernel(
        functools.partial(matmul_pipeline, block_m=bm, block_k=bk, block_n=bn,
                          core_axis_name=axis),
        out_type=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), x.dtype), mesh=mesh,
        scratch_types=[pltpu.VMEM((bm, bn), jnp.float32)], name="mesh_kernel_matmul")(x, y)


FORMULATIONS = {"emit_pipeline": emit_pipeline_matmul, "pl.kernel": mesh_kernel_matmul}


def sparse_dsd_matmul(indices_i, indices_k, x_blocks, y, zeros, *, blk=512):
    """JAX's Pallas TPU sparse guide (docs/pallas/tpu/sparse.ipynb): Dense = Sparse @ Dense."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    num_blocks = x_blocks.shape[0]
    m, n = zeros.shape

    def kernel(idxs_i_ref, idxs_k_ref, x_ref, y_ref, _, o_ref, accum_scratch):
        blk_idx = pl.program_id(1)
        is_start = blk_idx == 0
        changed = idxs_i_ref[blk_idx] != idxs_i_ref[jnp.maximum(blk_idx - 1, 0)]

        @pl.when(is_start | changed)
        def _():
            accum_scratch[...] = jnp.zeros_like(accum_scratch)

        accum_scratch[...] += jnp.dot(x_ref[0, :, :], y_ref[...],
                                      preferred_element_type=jnp.float32)
        next_change = idxs_i_ref[blk_idx] != idxs_i_ref[jnp.minimum(blk_idx + 1, num_blocks)]

        @pl.when((blk_idx == num_blocks - 1) | next_change)
        def _():
            o_ref[...] = accum_scratch[...].astype(o_ref.dtype)

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2, grid=(n // blk, num_blocks),
        in_specs=[pl.BlockSpec((1, blk, blk), lambda j, b, bi, bk: (b, 0, 0)),
                  pl.BlockSpec((blk, blk), lambda j, b, bi, bk: (bk[b], j)),
                  pl.BlockSpec((blk, blk), lambda j, b, bi, bk: (bi[b], j))],
        out_specs=pl.BlockSpec((blk, blk), lambda j, b, bi, bk: (bi[b], j)),
        scratch_shapes=[pltpu.VMEM((blk, blk), jnp.float32)])
    return pl.pallas_call(kernel, grid_spec=grid_spec,
                          out_shape=jax_struct((m, n), zeros.dtype),
                          input_output_aliases={4: 0})(indices_i, indices_k, x_blocks, y, zeros)


def sparse_mask_matmul(block_mask, prefetch_mask, prefetch_i, prefetch_j, x, y, mask_data, *,
                       bm=512, bk=1024, bn=512):
    """JAX's Pallas TPU sparse guide: dense @ dense with a block-sparse output mask."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    m, k = x.shape
    n = y.shape[1]

    def kernel(block_mask_ref, _pm, _pi, _pj, x_ref, y_ref, mask_ref, o_ref, accum_scratch):
        i, j, kk = pl.program_id(0), pl.program_id(1), pl.program_id(2)
        should_compute = block_mask_ref[i, j] != 0

        @pl.when(kk == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)
            accum_scratch[...] = jnp.zeros_like(accum_scratch[...])

        @pl.when(should_compute)
        def _():
            accum_scratch[...] += jnp.dot(x_ref[...], y_ref[...],
                                          preferred_element_type=jnp.float32)

            @pl.when(kk == pl.num_programs(2) - 1)
            def _():
                o_ref[...] = (mask_ref[0, ...] * accum_scratch[...]).astype(o_ref.dtype)

    def x_map(i, j, kk, block_mask, prefetch_mask, prefetch_i, prefetch_j):
        return (prefetch_i[i, j], (block_mask[i, j] != 0) * kk)

    def y_map(i, j, kk, block_mask, prefetch_mask, prefetch_i, prefetch_j):
        return ((block_mask[i, j] != 0) * kk, prefetch_j[i, j])

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=4, grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), x_map), pl.BlockSpec((bk, bn), y_map),
                  pl.BlockSpec((1, bm, bn), lambda i, j, kk, bmask, pm, *_: (pm[i, j], 0, 0))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk, *_: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)])
    return pl.pallas_call(kernel, grid_spec=grid_spec,
                          out_shape=jax_struct((m, n), jnp.bfloat16))(
        block_mask, prefetch_mask, prefetch_i, prefetch_j, x, y, mask_data)


def jax_struct(shape, dtype):
    import jax

    return jax.ShapeDtypeStruct(shape, dtype)


def sparse_row(row: dict[str, str]) -> tuple[Any, tuple[Any, ...]]:
    """The kernel and abstract arguments of a row of the sparse guide, sized as published."""
    import jax
    import jax.numpy as jnp

    size, blk = int(row["size"]), int(row["bm"])
    bf16 = jnp.bfloat16
    if row["kernel"] == "sparse_dsd_matmul":
        # The guide samples the block mask with jax.random.key(0) at p=0.1: the same count here.
        mask_key, _ = jax.random.split(jax.random.key(0))
        count = int(jnp.sum(jax.random.bernoulli(mask_key, p=0.1, shape=(size // blk,) * 2)))
        index = jax_struct((count,), jnp.int32)
        return sparse_dsd_matmul, (index, index, jax_struct((count, blk, blk), bf16),
                                   jax_struct((size, size), bf16), jax_struct((size, size), bf16))
    grid = (size // blk, size // int(row["bn"]))
    prefetch = jax_struct(grid, jnp.int32)
    # A lower-triangular mask has two kinds of nonzero blocks: full and diagonal.
    return sparse_mask_matmul, (prefetch, prefetch, prefetch, prefetch,
                                jax_struct((size, size), bf16), jax_struct((size, size), bf16),
                                jax_struct((2, blk, int(row["bn"])), jnp.int32))


# --- tokamax's gmm_v2 perf-test rows (TPU7x) ------------------------------------------------

# The calls of tokamax's gmm_v2_perf_test.py (tokamax 0.0.17, tokamax/_src/ops/gmm_v2/), by
# test case: sizes, weight dtype and quantisation block along k, fused activation, expert
# routing. "maxtext" rows draw their group sizes with gmm_util.get_group_sizes (uniform,
# key 0); "ullm" rows route m evenly over 512 experts and run experts 256-319 of them.
TOKAMAX_GMM_CASES: dict[str, dict[str, Any]] = {
    "test_gmm_perf_regression_maxtext": dict(
        op="gmm", m=262144, k=7168, n=1024, groups=256, weight="float8_e4m3fn", block=256,
        fuse_act=None, routing="maxtext"),
    "test_tgmm_perf_regression_maxtext": dict(
        op="tgmm", m=262144, k=7168, n=1024, groups=256, lhs="float8_e4m3fn",
        grad="float8_e5m2", routing="maxtext"),
    # The same test at openxla/tokamax 1cac2df: bfloat16 lhs and gradient, unquantised.
    "test_tgmm_perf_regression_maxtext@1cac2df": dict(
        op="tgmm", m=262144, k=7168, n=1024, groups=256, lhs="bfloat16", grad=None,
        routing="maxtext"),
    **{f"ullm_{w}_{phase}_{proj}": dict(
        op="gmm", m=81920 if phase == "prefill" else 1280,
        k=4096 if proj == "gate_up" else 1024, n=2048 if proj == "gate_up" else 4096,
        groups=64, weight="float8_e4m3fn" if w == "fp8" else "float4_e2m1fn",
        block=(4096 if proj == "gate_up" else 1024) if w == "fp8" else 64,
        fuse_act="silu" if proj == "gate_up" else None, routing="ullm")
       for w in ("fp8", "fp4") for phase in ("prefill", "decode")
       for proj in ("gate_up", "down")},
}


def tokamax_case(row: dict[str, str]) -> dict[str, Any]:
    """The perf test's configuration a ``tokamax_gmm_v2`` row was published for."""
    return TOKAMAX_GMM_CASES[row["variant"]]


def load_tokamax_gmm_v2() -> tuple[Any, Any, Any]:
    """tokamax's gmm_v2, tgmm_v2 and its test util, loaded without tokamax's ``__init__``.

    Raises ``ModuleNotFoundError`` / ``SyntaxError`` / ``ImportError`` where this
    environment cannot load them (tokamax missing, Python < 3.12).
    """
    import importlib.util

    # By path: an installed package may own the top-level name "tests".
    spec = importlib.util.spec_from_file_location(
        "_kernel_modules", ROOT / "tests" / "real_kernels" / "kernel_modules.py")
    kernel_modules = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernel_modules)
    load_kernel_module = kernel_modules.load_kernel_module

    def load(name: str) -> Any:
        return load_kernel_module(f"tokamax._src.ops.gmm_v2.{name}",
                                  skip_init=("tokamax", "tokamax._src"))
    return load("gmm_v2"), load("tgmm_v2"), load("util")


def tokamax_group_sizes(case: dict[str, Any]) -> tuple[np.ndarray, int]:
    """The group sizes and group offset the perf test passes, as the test draws them."""
    if case["routing"] == "maxtext":
        _, _, gmm_util = load_tokamax_gmm_v2()
        return np.asarray(gmm_util.get_group_sizes(case["m"], case["groups"])), 0
    return np.full((512,), case["m"] // 512, np.int32), 256


def tokamax_tiles(sizes: np.ndarray, offset: int, cfgs: Any) -> int:
    """The gm tiles gmm_v2's ``fill_metadata`` counts for these group sizes (its loop, on the host).

    That count is the trip count of the kernel's ``emit_pipeline`` over m tiles; the
    kernel reads it from the group sizes at run time.
    """
    sublane, tile_m = cfgs.dims.size_lhs_sublane, cfgs.tiles.tile_m
    tiles = start = 0
    for group in range(offset + cfgs.dims.size_group):
        size = int(sizes[group])
        if size > 0 and group >= offset:
            tiles += -(-(size + start % sublane) // tile_m)
        start += size
    return tiles


def tokamax_gmm_call(row: dict[str, str], *, known_trips: bool = False,
                     one_branch: bool = False) -> tuple[Any, tuple[Any, ...], dict[str, int]]:
    """The function, abstract arguments and (filled on trace) tiling of a row's call.

    The tiling: ``tiles`` (the m tiles the test's group sizes make), ``tile_m`` and
    ``bucket_base`` (the rows of the smallest of the switch's row buckets).

    Built as tokamax's op (``PallasMosaicTpuV2RaggedDot._fwd``) calls the kernel for
    the perf test's arguments. With ``known_trips`` the kernel's count of m tiles,
    which it computes from the group sizes at run time, is given as the constant
    those group sizes make (the metadata is still filled as the kernel does), so
    the pipeline's trip count is in the compiled code. With ``one_branch`` too, the
    tiles the kernel's heuristic picks keep one row bucket (``bucket_base = tile_m``):
    its ``lax.switch`` over buckets of rows, chosen per tile from the group sizes,
    then holds the full-tile branch alone.
    """
    import dataclasses

    import jax.numpy as jnp

    gmm_backend, tgmm_backend, _ = load_tokamax_gmm_v2()

    def tiling(heuristic: Any) -> Any:
        if not one_branch:
            return heuristic

        def full_tile_branch(*args: Any, **kwargs: Any) -> Any:
            tiles = heuristic(*args, **kwargs)
            return dataclasses.replace(tiles, bucket_base=tiles.tile_m)
        return full_tile_branch
    case = tokamax_case(row)
    sizes, offset = tokamax_group_sizes(case)
    m, k, n, groups = case["m"], case["k"], case["n"], case["groups"]
    tiles: dict[str, int] = {}
    original_fill = gmm_backend.fill_metadata

    def fill_metadata(group_sizes_ref, group_offset_ref, metadata_ref, *, cfgs):
        counted = original_fill(group_sizes_ref, group_offset_ref, metadata_ref, cfgs=cfgs)
        tiles.update(tiles=tokamax_tiles(sizes, offset, cfgs), tile_m=cfgs.tiles.tile_m,
                     bucket_base=cfgs.tiles.bucket_base)
        return tiles["tiles"] if known_trips else counted

    def traced_with(fill: Any, call: Any) -> Any:
        gmm_backend.fill_metadata = fill
        try:
            return call()
        finally:
            gmm_backend.fill_metadata = original_fill

    if case["op"] == "tgmm":
        lhs = jax_struct((m, k), jnp.dtype(case["lhs"]))
        if case["grad"] is None:
            def call(lhs, grad, group_sizes):
                return traced_with(fill_metadata, lambda: tgmm_backend.tgmm_v2(
                    lhs, grad, group_sizes, groups, preferred_element_type=jnp.bfloat16,
                    tile_info=tiling(tgmm_backend.calculate_tgmm_tiling)))
            return call, (lhs, jax_struct((m, n), jnp.bfloat16),
                          jax_struct(sizes.shape, jnp.int32)), tiles

        def call(lhs, grad_q, grad_scale, group_sizes):
            return traced_with(fill_metadata, lambda: tgmm_backend.tgmm_v2(
                lhs, grad_q, group_sizes, groups, rhs_scale=grad_scale.reshape(1, 1, -1),
                preferred_element_type=jnp.bfloat16,
                tile_info=tiling(tgmm_backend.calculate_tgmm_tiling)))
        return call, (lhs, jax_struct((m, n), jnp.dtype(case["grad"])),
                      jax_struct((1, 1, n), jnp.float32),
                      jax_struct(sizes.shape, jnp.int32)), tiles

    weight = jnp.dtype(case["weight"])

    def call(lhs, rhs_q, rhs_scale, group_sizes, group_offset):
        # AsQArray(lhs, float8_e4m3fn): quantised inside the kernel; the maxtext row's
        # calibration "fixed,-224,224" is a per-tensor scale of 224 / 448.
        lhs_scale = (jnp.full((1, 1), 224.0 / float(jnp.finfo(jnp.float8_e4m3fn).max),
                              jnp.float32) if case["routing"] == "maxtext" else None)
        return traced_with(fill_metadata, lambda: gmm_backend.gmm_v2(
            lhs, rhs_q, group_sizes, rhs_scale, None,
            group_offset if case["routing"] == "ullm" else None, lhs_scale,
            tile_info=tiling(gmm_backend.calculate_tiling),
            preferred_element_type=jnp.bfloat16, maybe_quantize_lhs=True,
            zero_initialize=False, fuse_act=case["fuse_act"],
            lhs_quant_dtype=jnp.dtype(jnp.float8_e4m3fn), rhs_quant_dtype=weight))
    return call, (jax_struct((m, k), jnp.bfloat16), jax_struct((groups, k, n), weight),
                  jax_struct((groups, k // case["block"], 1, n), jnp.float32),
                  jax_struct(sizes.shape, jnp.int32), jax_struct((1,), jnp.int32)), tiles


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(values: list[float]) -> np.ndarray:
        order = np.argsort(values, kind="stable")
        result = np.empty(len(values))
        sorted_values = np.asarray(values)[order]
        i = 0
        while i < len(values):
            j = i
            while j + 1 < len(values) and sorted_values[j + 1] == sorted_values[i]:
                j += 1
            result[order[i:j + 1]] = (i + j) / 2
            i = j + 1
        return result
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def estimate_row(row: dict[str, str], formulation: str = "grid") -> float:
    import jax
    import jax.numpy as jnp

    from pytest_pallas import estimate

    if row["kernel"].startswith("sparse_"):
        fn, abstract = sparse_row(row)
        return estimate(fn, *abstract, chip=row["chip"]).seconds
    size = int(row["size"])
    shape = jax.ShapeDtypeStruct((size, size), jnp.dtype(row["dtype"]))
    if formulation != "grid":
        fn = functools.partial(FORMULATIONS[formulation], bm=int(row["bm"]), bk=int(row["bk"]),
                               bn=int(row["bn"]))
        return estimate(fn, shape, shape, chip=row["chip"]).seconds
    fn = functools.partial(guide_matmul, bm=int(row["bm"]), bk=int(row["bk"]), bn=int(row["bn"]),
                           transpose_rhs=row["variant"] == "transpose_rhs",
                           activation=jax.nn.relu if row["variant"] == "relu" else (lambda v: v))
    if row["variant"] == "transpose_rhs":  # y arrives in the transposed layout, as published
        def call(x, y_t):
            return fn(x, y_t.swapaxes(0, 1))
        return estimate(call, shape, shape, chip=row["chip"]).seconds
    return estimate(fn, shape, shape, chip=row["chip"]).seconds


def cannot_estimate(row: dict[str, str]) -> str | None:
    """Why a row cannot be estimated in this environment, or None when it can."""
    if not row["kernel"].startswith("tokamax_"):
        return None
    import importlib.util

    import jax

    # The published rows time tokamax's own kernel; the project keeps no copy of it.
    if "tokamax" not in sys.modules and importlib.util.find_spec("tokamax") is None:
        return ("tokamax's gmm_v2 is not installed; the releases that ship it (0.0.13 on) "
                f"need Python >= 3.12 and jax >= 0.11.1 (here: Python "
                f"{sys.version_info.major}.{sys.version_info.minor}, jax {jax.__version__})")
    try:
        load_tokamax_gmm_v2()
    except (ImportError, SyntaxError) as error:
        return f"tokamax's gmm_v2 does not load here: {str(error).splitlines()[0]}"
    return None


def tokamax_limits(notes: tuple[str, ...]) -> str:
    """What limits a tokamax row's estimate, from its kernel's notes, in a few words."""
    said = []
    for note in notes:
        count = note.split(" ", 1)[0]
        if "trip count is read from data" in note:
            said.append(f"{count} data-trip loop(s) once")
        elif "inside loops" in note:
            said.append(f"{count} data pl.when(s) every step")
        elif "upper bound" in note:
            said.append("copies every step")
    return "; ".join(said)


def tokamax_rows(rows: list[dict[str, str]]) -> None:
    """The TPU7x rows of tokamax's gmm_v2 perf test, estimated three ways (see the legend)."""
    from pytest_pallas import estimate
    from pytest_pallas.backend import chip_timing

    print("\nTPU7x rows: tokamax's gmm_v2 perf test, each call built as the test builds it.\n"
          "  estimate: estimate() of the call as written; the loops whose trip count the "
          "kernel reads from the group sizes are counted once.\n"
          "  at m tiles: the kernel given, as a constant, the count of m tiles the test's "
          "group sizes make; every row-bucket branch of its lax.switch counted each tile.\n"
          "  one branch: as 'at m tiles', with one row bucket (the full tile) in the switch.\n"
          "  copies: 'at m tiles' copies alone (bytes over HBM bandwidth, a DMA latency "
          "per m tile).")
    header = (f"{'case':<42} {'published ms':>12} {'estimate':>8} {'ratio':>7} "
              f"{'m tiles':>7} {'ratio':>5} {'1 branch':>8} {'ratio':>5} {'copies':>6} "
              f"{'ratio':>5} {'tiles':>5} {'buckets':>7}  limits")
    print(header)
    print("-" * len(header))
    for row in rows:
        measured = float(row["published_seconds"])
        timing = chip_timing(row["chip"])
        fn, args, _ = tokamax_gmm_call(row)
        as_is = estimate(fn, *args, chip=row["chip"]).seconds
        fn, args, tiles = tokamax_gmm_call(row, known_trips=True)
        [kernel] = estimate(fn, *args, chip=row["chip"]).kernels
        fn, args, _ = tokamax_gmm_call(row, known_trips=True, one_branch=True)
        one = estimate(fn, *args, chip=row["chip"]).seconds
        copies = (kernel.dma_bytes_per_step / timing.hbm_bytes_per_second
                  + tiles["tiles"] * timing.dma_latency_seconds)
        buckets = f"{tiles['tile_m'] // tiles['bucket_base']}x{tiles['bucket_base']}"
        print(f"{row['variant']:<42} {measured * 1e3:>12.4f} {as_is * 1e3:>8.4f} "
              f"{measured / as_is:>7.1f} {kernel.seconds * 1e3:>7.4f} "
              f"{measured / kernel.seconds:>5.2f} {one * 1e3:>8.4f} {measured / one:>5.2f} "
              f"{copies * 1e3:>6.4f} {measured / copies:>5.2f} {tiles['tiles']:>5} {buckets:>7}  "
              f"{tokamax_limits(kernel.notes)}")


def main() -> None:
    rows = list(csv.DictReader(DATA.open()))
    if "--tokamax-only" in sys.argv[1:]:  # the TPU7x rows alone (where tokamax loads)
        tokamax_rows([r for r in rows if r["kernel"].startswith("tokamax_")
                      and cannot_estimate(r) is None])
        return
    floor = min(float(r["published_seconds"]) for r in rows if r["kernel"] == "jnp.matmul")
    print(f"dispatch floor (XLA 1024^3 matmul, same notebook): {floor * 1e3:.3f} ms")
    header = (f"{'kernel':<18} {'variant':<13} {'size':>5} {'blocks':<14} {'published ms':>12} "
              f"{'estimate ms':>11} {'ratio':>6}  note")
    print(header)
    print("-" * len(header))
    published, estimated, ratios, skipped = [], [], [], []
    for row in rows:
        if row["kernel"] == "jnp.matmul" or (row["kernel"].startswith("tokamax_")
                                             and cannot_estimate(row) is None):
            continue
        reason = cannot_estimate(row)
        if reason is not None:
            skipped.append((row, reason))
            continue
        seconds = estimate_row(row)
        measured = float(row["published_seconds"])
        ratio = measured / seconds
        dispatch = measured < DISPATCH_ROWS * floor
        note = "dispatch" if dispatch else ("" if 1 / 1.3 <= ratio <= 1.3 else "outside 1.3x")
        if not dispatch:
            ratios.append(ratio)
        published.append(measured)
        estimated.append(seconds)
        blocks = f"{row['bm']}/{row['bk']}/{row['bn']}"
        print(f"{row['kernel']:<18} {row['variant']:<13} {row['size']:>5} {blocks:<14} "
              f"{measured * 1e3:>12.3f} {seconds * 1e3:>11.3f} {ratio:>6.2f}  {note}")
    if skipped:
        print(f"\nnot estimated here ({len(skipped)} rows):")
        for reason in dict.fromkeys(reason for _, reason in skipped):
            print(f"  {reason}:")
            for row, why in skipped:
                if why == reason:
                    print(f"    {row['kernel']} {row['variant']} on {row['chip']}: "
                          f"published {float(row['published_seconds']) * 1e3:.4f} ms")
    print("\nThe plain rows written with emit_pipeline (in a pallas_call over HBM refs) and with "
          "pl.kernel on a TensorCore mesh, at the same blocks:")
    header = (f"{'formulation':<14} {'size':>5} {'blocks':<14} {'published ms':>12} "
              f"{'estimate ms':>11} {'ratio':>6} {'vs grid':>7}  note")
    print(header)
    print("-" * len(header))
    for row in rows:
        if row["kernel"] != "guide_matmul" or row["variant"] != "plain":
            continue
        measured = float(row["published_seconds"])
        grid = estimate_row(row)
        for formulation in FORMULATIONS:
            seconds = estimate_row(row, formulation)
            ratio = measured / seconds
            note = "dispatch" if measured < DISPATCH_ROWS * floor else (
                "" if 1 / 1.3 <= ratio <= 1.3 else "outside 1.3x")
            blocks = f"{row['bm']}/{row['bk']}/{row['bn']}"
            print(f"{formulation:<14} {row['size']:>5} {blocks:<14} {measured * 1e3:>12.3f} "
                  f"{seconds * 1e3:>11.3f} {ratio:>6.2f} {seconds / grid:>7.2f}  {note}")
    tokamax = [r for r in rows if r["kernel"].startswith("tokamax_") and cannot_estimate(r) is None]
    if tokamax:
        tokamax_rows(tokamax)
    print(f"\nSpearman rank correlation over {len(published)} rows: "
          f"{spearman(published, estimated):.3f}")
    print(f"rows not dominated by dispatch: {len(ratios)}, ratio range "
          f"{min(ratios):.2f}-{max(ratios):.2f}, within 1.3x: "
          f"{sum(1 / 1.3 <= r <= 1.3 for r in ratios)}/{len(ratios)}")


if __name__ == "__main__":
    main()
