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


# Each of 8 devices waits for a remote copy that no device sends: --pallas-timeout must end
# the collective and fail the test with its message, on every device at once.
NEVER_SIGNALLED_ON_EIGHT = textwrap.dedent('''
    import functools
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from jax.sharding import Mesh, PartitionSpec

    def waits_forever(x_ref, o_ref, recv_sem):
        copy = pltpu.make_async_copy(x_ref, o_ref, recv_sem)
        copy.wait()  # never started, by this device or another

    def per_device(x):
        return pl.pallas_call(
            waits_forever, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
        )(x)

    @pytest.mark.pallas
    @pytest.mark.devices(8)
    def test_stuck_collective():
        mesh = Mesh(np.array(jax.devices()[:8]), ("ring",))
        sharded = jax.shard_map(per_device, mesh=mesh, in_specs=PartitionSpec("ring"),
                                out_specs=PartitionSpec("ring"), check_vma=False)
        jax.block_until_ready(sharded(jnp.ones((8 * 8, 128), jnp.float32)))
''')


def test_the_timeout_ends_a_stuck_kernel_on_eight_devices(pytester, run_pytest):
    pytester.makepyfile(test_stuck=NEVER_SIGNALLED_ON_EIGHT)
    result = run_pytest("--pallas-interpret=tpu", "--pallas-devices=8", "--pallas-timeout=5",
                        "-p", "no:xdist", timeout=120)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*KernelTimeout: pallas: kernel 'waits_forever at test_stuck.py:*' (in "
        "test_stuck.py::test_stuck_collective) ran longer than --pallas-timeout=5s and was "
        "stopped.*"])
