"""The gate on the TPU compiler's estimates: seeded regressions fail it, an unchanged kernel never.

Each benchmark file here is what ``pallas_benchmark`` writes with libtpu, its
``extra_info["tpu_estimate"]`` made by the same function from real compiles of a
matmul and of seeded regressions of it (a halved block, float32 operands where
bfloat16 were, a lost double buffer, an extra relayout, a grid that no longer
splits across v5p's two TensorCores).
"""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas.bench import gate as benchmark_gate
from pytest_pallas.bench.benchmark_estimate import tpu_estimates
from pytest_pallas.checks import compile_check

needs_libtpu = pytest.mark.skipif(
    compile_check.libtpu_version() is None,
    reason="needs libtpu, the TPU compiler (pip install 'pytest-pallas[tpu]')")

PARALLEL = ("parallel", "parallel", "arbitrary")


def matmul(x, y, *, bm=512, bk=512, bn=512, buffers=None, semantics=PARALLEL):
    nsteps = x.shape[1] // bk

    def kernel(x_ref, y_ref, z_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == nsteps - 1)
        def _():
            z_ref[...] = acc_ref[...].astype(z_ref.dtype)

    mode = {} if buffers is None else {"pipeline_mode": pl.Buffered(buffers)}
    m, n = x.shape[0], y.shape[1]
    return pl.pallas_call(
        kernel, grid=(m // bm, n // bn, nsteps),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k), **mode),
                  pl.BlockSpec((bk, bn), lambda i, j, k: (k, j), **mode)],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics))(x, y)


def matmul_with_relayout(x, y, *, bm=512, bk=512, bn=512):
    """``matmul`` with an extra relayout per step: the rhs block stored transposed in VMEM, then
    transposed back for the dot (the same product; the transposes cost the XLU every step)."""
    nsteps = x.shape[1] // bk

    def kernel(x_ref, y_ref, z_ref, acc_ref, yt_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        yt_ref[...] = y_ref[...].T
        acc_ref[...] += jnp.dot(x_ref[...], yt_ref[...].T, preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == nsteps - 1)
        def _():
            z_ref[...] = acc_ref[...].astype(z_ref.dtype)

    m, n = x.shape[0], y.shape[1]
    return pl.pallas_call(
        kernel, grid=(m // bm, n // bn, nsteps),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                  pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32), pltpu.VMEM((bn, bk), y.dtype)],
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=PARALLEL))(x, y)


def bench_file(path, estimate, *, jax_version=jax.__version__):
    """A pytest-benchmark JSON file of one pallas_benchmark (no XLA time: the estimate alone)."""
    entry = {"fullname": "bench_mine.py::bench_matmul", "name": "bench_matmul",
             "stats": {"median": 1.0},
             "extra_info": {"jax": jax_version, "shapes": [[2048, 2048]] * 2,
                            "tpu_estimate": estimate}}
    path.write_text(json.dumps({"benchmarks": [entry]}))
    return str(path)


def gate(tmp_path, baseline, current, capsys):
    status = benchmark_gate.main(["--baseline", bench_file(tmp_path / "base.json", baseline),
                                  "--current", bench_file(tmp_path / "now.json", current)])
    return status, capsys.readouterr().out


BF16 = jax.ShapeDtypeStruct((2048, 2048), jnp.bfloat16)
F32 = jax.ShapeDtypeStruct((2048, 2048), jnp.float32)


@pytest.fixture(scope="module")
def baseline():
    return tpu_estimates(matmul, (BF16, BF16), ("v5e", "v5p"))


@needs_libtpu
def test_an_unchanged_kernel_passes_on_every_rerun(tmp_path, baseline, capsys):
    for _ in range(2):
        status, out = gate(tmp_path, baseline, tpu_estimates(matmul, (BF16, BF16),
                                                             ("v5e", "v5p")), capsys)
        assert status == 0, out
        assert "estimate gate: 0 regressed of 8 metrics compared" in out


@needs_libtpu
@pytest.mark.parametrize("seeded, chip, metric", [
    (functools.partial(matmul, bm=256), ("v5e",), "seconds"),  # a halved block
    ("float32", ("v5e",), "hbm_bytes"),  # float32 operands where bfloat16 were
    (functools.partial(matmul, buffers=1), ("v5e",), "seconds"),  # a lost double buffer
    (matmul_with_relayout, ("v5e",), "cycles"),  # an extra relayout
    (functools.partial(matmul, semantics=("arbitrary",) * 3), ("v5p",), "seconds"),  # no split
], ids=["halved-block", "float32", "single-buffer", "extra-relayout",
         "no-megacore-split"])
def test_a_seeded_regression_fails_naming_kernel_metric_and_change(tmp_path, baseline, capsys,
                                                                   seeded, chip, metric):
    if seeded == "float32":
        current = tpu_estimates(matmul, (F32, F32), chip)
    else:
        current = tpu_estimates(seeded, (BF16, BF16), chip)
    status, out = gate(tmp_path, {c: baseline[c] for c in chip}, current, capsys)
    assert status == 1, out
    line = next(line for line in out.splitlines()
                if line.startswith("ESTIMATE REGRESSED") and f" {metric} " in line)
    assert f"on {chip[0]}: kernel 'kernel'" in line and line.endswith("x)")


def test_another_jax_or_libtpu_rebaselines_in_one_line_and_never_fails(tmp_path, capsys):
    kernel = {"name": "k", "grid_steps": 4, "seconds": 1e-3, "critical_path_per_step": 100,
              "dma_bytes_per_step": 10, "spills": 0}
    then = {"v5e": {"seconds": 1e-3, "libtpu": "0.0.42.1", "kernels": [kernel]}}
    slower = {"v5e": {"seconds": 9e-3, "libtpu": "0.0.50.1",
                      "kernels": [{**kernel, "seconds": 9e-3}]}}
    status, out = gate(tmp_path, then, slower, capsys)
    assert status == 0
    [line] = [line for line in out.splitlines() if "save a new baseline" in line]
    assert "libtpu 0.0.42.1 in the baseline" in line and "libtpu 0.0.50.1 now" in line
    # The same versions: the same numbers are judged, and fail.
    slower["v5e"]["libtpu"] = "0.0.42.1"
    status, out = gate(tmp_path, then, slower, capsys)
    assert status == 1 and "kernel 'k' seconds 0.001 -> 0.009 (9.00x)" in out
