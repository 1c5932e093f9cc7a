"""A GPU's numbers on the CPU (--pallas-numerics=chip): a GPU kernel's float32 dot takes its
operands as TensorFloat-32, as a Hopper GPU's tensor cores do (Triton at precision None,
DEFAULT or HIGH; Mosaic GPU's wgmma always), and so do the test's own XLA dots; a test
whose first GPU kernel comes after an XLA reference runs again with the GPU's numbers from
its start, so that the reference is never the TPU's."""

import textwrap

import numpy as np
import pytest

pytest.importorskip("absl", reason="jax.experimental.pallas.mosaic_gpu imports absl-py")

KERNELS = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu
    from jax.experimental.pallas import triton as pltriton

    def triton_matmul(x, y, precision=None):
        def body(x_ref, y_ref, o_ref):
            o_ref[...] = jnp.dot(x_ref[...], y_ref[...], precision=precision)
        return pl.pallas_call(body, name="triton_matmul",
                              out_shape=jax.ShapeDtypeStruct((64, 128), jnp.float32),
                              compiler_params=pltriton.CompilerParams(num_warps=4))(x, y)

    def wgmma_matmul(x, y):
        def body(x_ref, y_ref, o_ref):
            def scope(acc_ref):
                plgpu.wgmma(acc_ref, x_ref, y_ref)
                return acc_ref[...]
            o_ref[...] = pl.run_scoped(scope, plgpu.ACC((64, 128), jnp.float32))
        return pl.pallas_call(body, name="wgmma_matmul",
                              out_shape=jax.ShapeDtypeStruct((64, 128), jnp.float32),
                              compiler_params=plgpu.CompilerParams())(x, y)

    def inputs():
        rng = np.random.default_rng(0)
        return (rng.standard_normal((64, 128)).astype(np.float32),
                rng.standard_normal((128, 128)).astype(np.float32))

    def float64_reference(x, y):
        return np.asarray(x, np.float64) @ np.asarray(y, np.float64)
''')

USER_TESTS = KERNELS + textwrap.dedent('''
    pytestmark = pytest.mark.pallas

    def test_triton_holds_only_in_float32():
        x, y = inputs()
        np.testing.assert_allclose(triton_matmul(x, y), float64_reference(x, y),
                                   rtol=1e-5, atol=1e-4)

    def test_wgmma_holds_only_in_float32():
        x, y = inputs()
        np.testing.assert_allclose(wgmma_matmul(x, y), float64_reference(x, y),
                                   rtol=1e-5, atol=1e-4)

    def test_triton_highest_keeps_float32():
        x, y = inputs()
        np.testing.assert_allclose(triton_matmul(x, y, lax.Precision.HIGHEST),
                                   float64_reference(x, y), rtol=1e-5, atol=1e-4)

    def test_triton_against_xla_dot():
        x, y = inputs()
        np.testing.assert_allclose(triton_matmul(x, y), jnp.dot(x, y), rtol=1e-6, atol=1e-5)

    def test_wgmma_against_xla_dot():
        x, y = inputs()
        np.testing.assert_allclose(wgmma_matmul(x, y), jax.jit(jnp.dot)(x, y),
                                   rtol=1e-6, atol=1e-5)
''')


def test_a_float32_only_gpu_kernel_fails_and_the_others_pass(pytester):
    pytester.makepyfile(test_gpu_matmuls=USER_TESTS)
    # A backend flag opts the session in: the header says which numbers it computes.
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist",
                                "--pallas-interpret=tpu")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines([
        "*FAILED test_gpu_matmuls.py::test_triton_holds_only_in_float32*",
        "*FAILED test_gpu_matmuls.py::test_wgmma_holds_only_in_float32*"], consecutive=False)
    text = result.stdout.str()
    for kernel in ("triton_matmul", "wgmma_matmul"):
        assert (f"pallas: kernel '{kernel}' had a default-precision float32 dot: a Hopper "
                "GPU's tensor cores round these operands to TF32") in text
    assert "numbers: TPU v5e's" in text and "a Hopper GPU's, with TF32 operands" in text


def test_exact_numerics_keep_float32_products_in_gpu_kernels(pytester):
    pytester.makepyfile(test_gpu_matmuls=USER_TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist",
                                "--pallas-numerics=exact")
    result.assert_outcomes(passed=5)


def test_a_reference_computed_before_the_first_gpu_kernel_is_the_gpus(pytester):
    # The kernels come from a module of the user's (the test module imports no Pallas GPU
    # module), and the XLA reference is computed before the first GPU kernel, at a tight
    # tolerance. On the GPU both sides take TF32 operands: the test passes there, and here.
    pytester.makepyfile(gpu_kernels=KERNELS, test_reference_first=textwrap.dedent('''
        import jax, jax.numpy as jnp, numpy as np, pytest
        import gpu_kernels

        pytestmark = pytest.mark.pallas
        RUNS = []

        @pytest.mark.parametrize("kernel", ["triton_matmul", "wgmma_matmul"])
        def test_kernel_against_a_reference_computed_first(kernel):
            RUNS.append(kernel)
            x, y = gpu_kernels.inputs()
            reference = jnp.dot(x, y)
            np.testing.assert_allclose(getattr(gpu_kernels, kernel)(x, y), reference,
                                       rtol=1e-6, atol=1e-5)

        def test_runs():
            # The first test met its GPU kernel with the TPU's numbers and ran again with
            # the GPU's; the second started with them (a test of its file ran GPU kernels).
            assert RUNS == ["triton_matmul", "triton_matmul", "wgmma_matmul"]
    '''))
    # The same as a unittest.TestCase test (unittest records the stop, the plugin reads it).
    pytester.makepyfile(test_reference_first_unittest=textwrap.dedent('''
        import unittest
        import jax.numpy as jnp, numpy as np, pytest
        import gpu_kernels

        @pytest.mark.pallas
        class ReferenceFirst(unittest.TestCase):
            def test_triton_kernel_against_a_reference_computed_first(self):
                x, y = gpu_kernels.inputs()
                reference = jnp.dot(x, y)
                np.testing.assert_allclose(gpu_kernels.triton_matmul(x, y), reference,
                                           rtol=1e-6, atol=1e-5)
    '''))
    pytester.syspathinsert()
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(passed=4)


def _tf32_reference(value: np.float32) -> np.float32:
    """float32 ``value`` to TF32, bit by bit: keep 10 of the 23 mantissa bits, rounding the
    13 dropped to nearest, a tie to the even kept one (NaN and infinities unchanged)."""
    if not np.isfinite(value):
        return value
    bits = int(np.float32(value).view(np.uint32))
    dropped, kept = bits & 0x1FFF, bits >> 13
    if dropped > 0x1000 or (dropped == 0x1000 and kept & 1):
        kept += 1  # a carry out of the mantissa steps the exponent (to infinity at the top)
    return np.uint32(kept << 13).view(np.float32)


def test_tf32_rounding_is_round_to_nearest_even_bit_for_bit():
    import jax
    from jax import lax

    from pytest_pallas._compat.chip_matmuls import round_mantissa

    rng = np.random.default_rng(3)
    ties = [(kept << 13) | 0x1000 for kept in (0x3F800, 0x3F801, 0x40123, 0x40124)]
    specials = np.array(ties + [0x7F7FFFFF, 0xFF7FF000, 0x00000001, 0x00001FFF, 0x80001000,
                                0x3F801FFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0],
                        np.uint32).view(np.float32)
    values = np.concatenate([specials, rng.standard_normal(4096).astype(np.float32),
                             rng.integers(0, 2**32, 4096, dtype=np.uint32).view(np.float32)])
    expected = np.array([_tf32_reference(v) for v in values], np.float32)
    with jax.default_device(jax.devices("cpu")[0]):
        xla = np.asarray(lax.reduce_precision(values, exponent_bits=8, mantissa_bits=10))
    for computed in (xla, round_mantissa(values, "tensorfloat32")):
        same = (computed.view(np.uint32) == expected.view(np.uint32)) | (
            np.isnan(computed) & np.isnan(expected))
        assert same.all(), values[~same][:5]


def test_gpu_numbers_round_triton_and_xla_dots_as_the_gpu():
    import jax
    import jax.numpy as jnp
    from jax import lax

    from pytest_pallas._compat.chip_matmuls import float32_dots_rounded, round_mantissa

    rng = np.random.default_rng(4)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    y = rng.standard_normal((256, 8)).astype(np.float32)
    tf32 = (round_mantissa(x, "tensorfloat32").astype(np.float64)
            @ round_mantissa(y, "tensorfloat32").astype(np.float64))
    exact = x.astype(np.float64) @ y
    with float32_dots_rounded("tensorfloat32"):
        assert jax.config.jax_default_matmul_precision == "tensorfloat32"
        for precision in (None, lax.Precision.DEFAULT, lax.Precision.HIGH,
                          (lax.Precision.HIGHEST, lax.Precision.DEFAULT)):
            np.testing.assert_allclose(jnp.dot(x, y, precision=precision), tf32,
                                       rtol=1e-6, atol=1e-5)
        highest = jnp.dot(x, y, precision=lax.Precision.HIGHEST)
        np.testing.assert_allclose(highest, exact, rtol=1e-5, atol=1e-5)
        assert np.abs(np.asarray(jnp.dot(x, y)) - exact).max() > 1e-4
    assert jax.config.jax_default_matmul_precision is None


def test_a_gpu_interpreter_that_moved_its_wgmma_is_named(monkeypatch):
    import inspect

    from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks

    from pytest_pallas._compat import chip_matmuls, jax_internals

    # A GPU interpreter whose products are no longer NumPy's matmul over its module's np.
    real_getsource = inspect.getsource
    monkeypatch.setattr(inspect, "getsource", lambda target: (
        "def wgmma(a, b):\n    return jnp.dot(a, b)\n" if target is gpu_callbacks
        else real_getsource(target)))
    with pytest.raises(jax_internals.JaxInternalsChanged, match="no longer computes with "
                       "np.matmul; Mosaic GPU's wgmma of float32 operands computes float32"):
        with chip_matmuls.gpu_wgmma_rounded():
            pass
