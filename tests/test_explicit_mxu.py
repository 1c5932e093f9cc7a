"""TPU 7x's explicit MXU runs in JAX's TPU interpreter on the CPU (_compat/explicit_mxu.py): a
kernel that pushes a right-hand side, multiplies into an accumulator and pops it computes what
jnp.matmul computes in a kernel, and one that loads an empty staging register fails saying so."""

import textwrap

import pytest
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas._compat.explicit_mxu import addressed_accumulators

pytestmark = pytest.mark.skipif(
    not hasattr(pltpu, "matmul_push_rhs") or not addressed_accumulators(),
    reason="this JAX's explicit MXU takes accumulator refs (jax 0.12), not supplied")

EXPLICIT_MXU = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    M, K, N = 192, 256, 256

    def mxu_matmul(x, y, *, load=0, mxus=1):
        def kernel(x_ref, y_ref, o_ref):
            for mxu in range(mxus):
                pltpu.matmul_push_rhs(y_ref[...], staging_register=0, mxu_index=mxu)
            for step in range(2):  # two passes into the same accumulator add up
                for mxu in range(mxus):
                    pltpu.matmul_acc_lhs(acc_addr=0, lhs=x_ref[...], mxu_index=mxu,
                                         load_staged_rhs=load if step == 0 else None)
            total = pltpu.matmul_pop(acc_addr=0, shape=(M, N), dtype=jnp.float32,
                                     mxu_index=0)
            for mxu in range(1, mxus):
                total += pltpu.matmul_pop(acc_addr=0, shape=(M, N), dtype=jnp.float32,
                                          mxu_index=mxu)
            o_ref[...] = total
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32))(x, y)

    def by_jnp(x, y):
        def kernel(x_ref, y_ref, o_ref):
            o_ref[...] = jnp.matmul(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32))(x, y)

    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.normal(size=(M, K)), jnp.bfloat16)
    Y = jnp.asarray(rng.normal(size=(K, N)), jnp.bfloat16)

    def test_two_passes_on_two_mxus_are_four_products():
        np.testing.assert_array_equal(mxu_matmul(X, Y, mxus=2), 4 * by_jnp(X, Y))

    def test_loading_an_empty_staging_register_is_the_kernel_s_error():
        mxu_matmul(X, Y, load=1)
''')


def test_the_explicit_mxu_runs_as_jnp_matmul_does(pytester, run_pytest):
    pytester.makepyfile(test_mxu=EXPLICIT_MXU)
    result = run_pytest("--pallas-chip=7x", "-p", "no:xdist")
    result.assert_outcomes(passed=1, failed=1)
    assert "matmul_acc_lhs(load_staged_rhs=1) on MXU 0, whose staging register is empty" in (
        result.stdout.str())
