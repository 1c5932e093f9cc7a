"""Classes 6 and 7: a kernel JAX's own interpreter cannot run is not a failing kernel.

* Class 6: JAX's TPU interpreter crashes inside JAX on some kernels
  ("NotImplementedError: masked load_p", from ``pltpu.load(ref, mask=...)``; reads and
  writes through reshaped and bitcast refs, the first such crash, run under the plugin). The
  test says so in one paragraph and runs again in the plain interpreter, which checks the
  values, or is skipped naming both crashes when that one cannot run it either.
* Class 7: the plain interpreter, the conformance suite's fast path, cannot
  lower ``pl.program_id`` inside a ``pl.when`` body ("MLIR translation rule
  for primitive 'program_id' not found for platform cpu"); the suite runs the
  kernel in the TPU interpreter instead and says so once.
"""

import pathlib
import textwrap

import pytest

TESTS_DIR = pathlib.Path(__file__).resolve().parent.parent

MASKED_LOAD_TEST = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    import pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from pytest_pallas import assert_allclose


    def _kernel(x_ref, o_ref):
        # a masked load: the TPU interpreter has no rule for one ("masked load_p")
        rows = jax.lax.broadcasted_iota(jnp.int32, (8, 128), 0)
        o_ref[...] = jnp.where(rows < 4, pltpu.load(x_ref, mask=rows < 4), 0.0)


    def first_rows(x):
        return pl.pallas_call(_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(x)


    @pytest.mark.pallas
    def test_values():
        x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
        expected = np.where(np.arange(8)[:, None] < 4, np.asarray(x), 0.0)
        assert_allclose(first_rows(x), expected)
    """
)


def test_tpu_interpreter_crash_falls_back_to_the_plain_interpreter_and_says_why(run_pytest,
                                                                                pytester):
    pytester.makepyfile(test_masked_load=MASKED_LOAD_TEST)
    # The interpreters' verdicts alone: libtpu 0.0.42 rejects this masked load's lowering.
    result = run_pytest("-W", "always", "-rs", "--pallas-compile=none")
    output = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, output[-4000:]
    assert "JAX's TPU interpreter crashed inside JAX" in output
    assert "NotImplementedError: masked load_p" in output
    assert "not a bug of the kernel" in output
    # The plain interpreter runs the masked load and checks the values; were it to crash
    # too, the test is skipped saying so.
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
