"""The plugin's fixes to JAX's TPU interpreter (pytest_pallas._interpreter_compat), each through
a Pallas test as a user writes it, at whichever end of the supported JAX range is installed."""

import textwrap

# A ring reduce-scatter on 8 simulated devices whose blocks are past the 100 KiB at which
# XLA's CPU client copies a callback operand on its thread pool: before the fix, every pool
# thread waited in an interpreter callback for that copy, and the run hung past any timeout.
RING_OF_EIGHT = textwrap.dedent('''
    import functools
    import jax, numpy as np, pytest
    from jax.sharding import Mesh, PartitionSpec
    from pytest_pallas import assert_allclose
    from pytest_pallas.reference_kernels import collectives

    @pytest.mark.pallas
    @pytest.mark.devices(8)
    def test_reduce_scatter_of_large_blocks():
        mesh = Mesh(np.array(jax.devices()[:8]), ("ring",))
        rows, cols = 64, 512  # 128 KiB per block, 1 MiB per device
        x = np.random.default_rng(0).standard_normal((8 * 8 * rows, cols)).astype(np.float32)
        sharded = jax.shard_map(functools.partial(collectives.reduce_scatter, axis_name="ring"),
                                mesh=mesh, in_specs=PartitionSpec("ring"),
                                out_specs=PartitionSpec("ring"), check_vma=False)
        out = np.asarray(sharded(x)).reshape(8, rows, cols)
        expected = collectives.reduce_scatter_reference(np.split(x, 8))
        assert_allclose(out, expected.reshape(8, rows, cols), reduction_length=8)
''')


def test_a_collective_of_large_blocks_on_eight_devices_ends(pytester, run_pytest):
    pytester.makepyfile(test_ring=RING_OF_EIGHT)
    result = run_pytest("--pallas-interpret=tpu", "--pallas-devices=8", "--pallas-timeout=120",
                        "-p", "no:xdist", timeout=180)
    result.assert_outcomes(passed=1)
