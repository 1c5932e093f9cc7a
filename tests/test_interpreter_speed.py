"""What makes an interpreted kernel cheaper changes neither what it computes nor what is
checked of the test's own program (``_compat/interpreter_speed.py``)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from pytest_pallas._compat.interpreter_speed import jax_checks_off_in_kernels


def test_jax_s_own_checks_are_off_inside_kernels_only():
    seen = {}

    def kernel(x_ref, o_ref):
        seen["kernel"] = jax.config.jax_enable_checks
        o_ref[...] = x_ref[...] * 2

    def program(x):
        seen["program"] = jax.config.jax_enable_checks
        return pl.pallas_call(kernel, out_shape=jax.typeof(x), interpret=True)(x) + 1

    x = jnp.ones((8, 128), jnp.float32)
    with jax.enable_checks(True):
        with jax_checks_off_in_kernels():
            out = jax.jit(program)(x)
        assert seen == {"kernel": False, "program": True}
        np.testing.assert_array_equal(out, 3 * np.ones((8, 128)))
        # Restored: the next kernel is traced with the checks, as JAX's test cases set them.
        jax.jit(program)(jnp.ones((16, 128), jnp.float32))
        assert seen == {"kernel": True, "program": True}


def test_an_opted_in_test_traces_its_kernels_without_jax_s_checks(pytester, run_pytest):
    pytester.makepyfile(test_checks='''
        import jax, jax.numpy as jnp
        from jax.experimental import pallas as pl

        def test_kernel():
            seen = []
            def kernel(x_ref, o_ref):
                seen.append(jax.config.jax_enable_checks)
                o_ref[...] = x_ref[...]
            with jax.enable_checks(True):
                x = jnp.ones((8, 128), jnp.float32)
                pl.pallas_call(kernel, out_shape=jax.typeof(x))(x)
            assert seen == [False]
    ''')
    run_pytest("--pallas-interpret=tpu", "-p", "no:xdist").assert_outcomes(passed=1)
