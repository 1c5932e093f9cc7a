"""Classes 6 and 7: a kernel JAX's own interpreter cannot run is not a failing kernel.

* Class 6: JAX's TPU interpreter crashes inside JAX on some kernels
  ("'ReshapeTransform' object has no attribute 'indices'", from writing through
  a reshaped VMEM ref; reading through one runs under the plugin). The test says so in one
  paragraph and runs again in the plain interpreter, which checks the values, or is skipped
  naming both crashes when that one cannot run it either.
* Class 7: the plain interpreter, the conformance suite's fast path, cannot
  lower ``pl.program_id`` inside a ``pl.when`` body ("MLIR translation rule
  for primitive 'program_id' not found for platform cpu"); the suite runs the
  kernel in the TPU interpreter instead and says so once.
"""

import pathlib
import textwrap

import pytest

TESTS_DIR = pathlib.Path(__file__).resolve().parent.parent

RESHAPED_REF_TEST = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    import pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from pytest_pallas import assert_allclose


    def _kernel(x_ref, o_ref, buf):
        buf[...] = x_ref[...]
        # a write through a reshaped VMEM ref: the plugin lets the TPU interpreter read
        # through one (as ragged paged attention does), not yet write
        buf.reshape(2, 8, 128)[1] = buf[pl.ds(8, 8)] + 1.0
        o_ref[...] = buf[pl.ds(8, 8)]


    def second_half_plus_one(x):
        return pl.pallas_call(_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                              scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32)])(x)


    @pytest.mark.pallas
    def test_values():
        x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
        assert_allclose(second_half_plus_one(x), np.asarray(x)[8:] + 1.0)
    """
)


def test_tpu_interpreter_crash_falls_back_to_the_plain_interpreter_and_says_why(run_pytest,
                                                                                pytester):
    pytester.makepyfile(test_reshaped=RESHAPED_REF_TEST)
    result = run_pytest("-W", "always", "-rs")
    output = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, output[-4000:]
    assert "JAX's TPU interpreter crashed inside JAX" in output
    assert "'ReshapeTransform' object has no attribute 'indices'" in output
    assert "not a bug of the kernel" in output
    # jax 0.12's plain interpreter writes through the reshape and checks the values; jax
    # 0.10's cannot either, and the test is skipped saying so.
    assert "run again in the plain interpreter" in output or (
        "tried again in the plain interpreter" in output
        and "neither of JAX's interpreters can run this kernel" in output), output[-4000:]


WHEN_PROGRAM_ID = textwrap.dedent(
    """
    import functools

    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from pytest_pallas import supports


    def _kernel(x_ref, y_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            # program_id read inside the body: legal on the TPU, beyond the plain interpreter
            acc_ref[...] = jnp.zeros_like(acc_ref) * pl.program_id(2).astype(jnp.float32)

        acc_ref[...] += jnp.dot(x_ref[...].astype(jnp.float32), y_ref[...].astype(jnp.float32),
                                preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)


    @supports(dtypes=("float32",), multiple_of={"m": 8, "k": 128, "n": 128},
              max_size={"m": 40, "k": 640, "n": 384})
    def matmul_program_id_in_when(x, y):
        m, k = x.shape
        n = y.shape[1]
        bm = m
        return pl.pallas_call(
            _kernel, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
            grid=(m // bm, n // 128, k // 128),
            in_specs=[pl.BlockSpec((bm, 128), lambda i, j, l: (i, l)),
                      pl.BlockSpec((128, 128), lambda i, j, l: (l, j))],
            out_specs=pl.BlockSpec((bm, 128), lambda i, j, l: (i, j)),
            scratch_shapes=[pltpu.VMEM((bm, 128), jnp.float32)],
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "arbitrary")),
        )(x, y)
    """
)


def test_plain_interpreter_crash_runs_the_suite_in_the_tpu_interpreter(pytester, monkeypatch):
    pytester.makepyfile(user_kernels=WHEN_PROGRAM_ID)
    monkeypatch.setenv("PYTHONPATH", str(TESTS_DIR))  # for -p _pallas_no_shrink
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "_pallas_no_shrink", "--pallas-seed=0",
        "--pallas-examples=2", "-W", "always",
        "--pallas-impl", "matmul=user_kernels:matmul_program_id_in_when", timeout=400)
    output = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, output[-5000:]
    assert "JAX's plain interpreter cannot run this kernel" in output
