"""Class 8: a kernel that passes its own ``pltpu.InterpretParams`` keeps them under the plugin.

JAX's own ``tpu_pallas_interpret_test.py`` passes explicit parameters
(``out_of_bounds_reads``, ``buffer_bounds``, ``random_seed``, ``detect_races``,
...); the plugin's forced interpreter used to replace them. Now the kernel
keeps what it asked for, the run adds only race detection when
``--pallas-detect-races`` asks, and a failing test says what was changed.
"""

import textwrap

OWN_PARAMS_TEST = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    import pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu


    def _copy_out_of_bounds(x_hbm, o_ref, buf, sem):
        start = pl.program_id(0) * 0 + 8          # rows 8..15 of an 8-row array
        copy = pltpu.make_async_copy(x_hbm.at[pl.ds(start, 8)], buf, sem)
        copy.start()
        copy.wait()
        o_ref[...] = buf[...]


    def read_past_the_end(x, params):
        return pl.pallas_call(
            _copy_out_of_bounds, grid=(1,), out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
            scratch_shapes=[pltpu.VMEM((8, 128), x.dtype), pltpu.SemaphoreType.DMA],
            interpret=params)(x)


    @pytest.mark.pallas
    def test_own_params_are_kept():
        # out_of_bounds_reads="uninitialized": the read past the end gives NaN instead of raising
        params = pltpu.InterpretParams(out_of_bounds_reads="uninitialized")
        out = read_past_the_end(jnp.ones((8, 128), jnp.float32), params)
        assert np.isnan(np.asarray(out)).all()


    @pytest.mark.pallas
    def test_failure_says_what_the_run_changed():
        params = pltpu.InterpretParams(out_of_bounds_reads="uninitialized")
        read_past_the_end(jnp.ones((8, 128), jnp.float32), params)
        assert False, "fails on purpose"
    """
)


def test_a_kernels_own_interpret_params_are_kept_and_changes_named(run_pytest, pytester):
    pytester.makepyfile(test_own=OWN_PARAMS_TEST)
    result = run_pytest("--pallas-detect-races")
    output = result.stdout.str()
    result.assert_outcomes(passed=1, failed=1)
    assert ("kept its own pltpu.InterpretParams; the run changed detect_races=False -> True "
            "(--pallas-detect-races)") in output
    assert "simulated, for multi-device kernels" in output   # the header's device count


