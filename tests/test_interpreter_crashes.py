"""Crashes inside JAX's TPU interpreter that suites met, each run through the plugin as a
suite's test meets it: fixed (the test passes), or a one-line skip naming JAX's limit; never a
failure presented as the kernel's bug, never a hang. The minimal repro of each, as an upstream
JAX issue states it, is in docs/interpreter-limits.md."""

import textwrap

import pytest

# A kernel a library wraps in custom_partitioning, called on one device, on eight (a sharded
# jit: XLA's partitioner traces the body on its own thread, with no token for the TPU
# interpreter's ordered effect), and beside an ordered io_callback of the test's own, which
# JAX refuses there on the chip too ("KeyError: OrderedIOEffect").
CUSTOM_PARTITIONING = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import io_callback, pallas as pl
    from jax.experimental.custom_partitioning import custom_partitioning
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    def add_one_kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    def add_one(x):
        return pl.pallas_call(add_one_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    def logged_add_one(x):
        x = io_callback(np.asarray, jax.ShapeDtypeStruct(x.shape, x.dtype), x, ordered=True)
        return add_one(x)

    def partitioned(body):
        wrapped = custom_partitioning(body)
        wrapped.def_partition(
            infer_sharding_from_operands=lambda mesh, args, result: args[0].sharding,
            partition=lambda mesh, args, result: (mesh, body, args[0].sharding,
                                                  (args[0].sharding,)),
            sharding_rule="i j -> i j")
        return wrapped

    def run(body, devices):
        mesh = Mesh(np.array(jax.devices()[:devices]), ("x",))
        x = jax.device_put(jnp.arange(64 * 128, dtype=jnp.float32).reshape(64, 128),
                           NamedSharding(mesh, P("x")))
        np.testing.assert_array_equal(jax.jit(partitioned(body))(x), x + 1)

    @pytest.mark.pallas
    @pytest.mark.devices(8)
    @pytest.mark.parametrize("devices", [1, 8])
    def test_kernel_in_custom_partitioning(devices):
        run(add_one, devices)

    @pytest.mark.pallas
    def test_own_ordered_callback_in_custom_partitioning():
        run(logged_add_one, 1)
''')


def test_a_kernel_in_a_custom_partitioning_body_runs_interpreted(pytester, run_pytest):
    pytester.makepyfile(test_partitioned=CUSTOM_PARTITIONING)
    result = run_pytest("--pallas-interpret=tpu", "--pallas-devices=8", "-p", "no:xdist",
                        "-W", "always", "-rfs")
    result.assert_outcomes(passed=2, failed=1)
    output = result.stdout.str()
    # One device: in the TPU interpreter. Eight: JAX's limit named, then the plain one.
    assert output.count("PallasInterpreterFallback: pallas:") == 1, output[-4000:]
    result.stdout.fnmatch_lines([
        "*InterpreterLimit: JAX's TPU interpreter cannot run a kernel inside a "
        "custom_partitioning body partitioned over several devices*",
        "*FAILED test_partitioned.py::test_own_ordered_callback_in_custom_partitioning*"])


# JAX's own PinnedBufferTest.test_basic (tpu_pallas_state_test.py): a kernel aliasing a buffer
# pinned with jax._src.state.primitives.pin, which neither interpreter nor the CPU runs.
PINNED_BUFFER = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax._src.state.primitives import pin, unpin
    from jax.experimental import pallas as pl

    @pytest.mark.pallas
    def test_pinned_buffer():
        @jax.jit
        def f(x):
            x_pinned = pin(x)
            x_pinned = pl.pallas_call(
                lambda *_: None, out_shape=x_pinned,
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec(memory_space=pl.ANY),
                input_output_aliases={0: 0})(x_pinned)
            return unpin(x_pinned)

        np.testing.assert_array_equal(f(jnp.arange(3.0)), np.arange(3.0))
''')


def test_a_kernel_taking_a_pinned_buffer_skips_with_one_line(pytester, run_pytest):
    pytester.makepyfile(test_pinned=PINNED_BUFFER)
    result = run_pytest("--pallas-interpret=tpu", "-p", "no:xdist", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([
        "SKIPPED*pallas: kernel '<lambda> at test_pinned.py:*' takes a pinned buffer "
        "(jax._src.state.primitives.pin), which neither of JAX's interpreters runs on the CPU*"])


# A SparseCore kernel gathering rows with a DMA indexed by a vector of indices (as JAX's
# SparseCore tests do), which runs in the TPU interpreter (_compat.sparsecore_copies), and a
# TensorCore kernel making the same DMA, which the chip's compiler rejects.
INDEXED_DMAS = textwrap.dedent('''
    import functools
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas import tpu_sc as plsc

    X = jnp.arange(16 * 8, dtype=jnp.int32).reshape(16, 8)
    INDICES = jnp.array(np.random.default_rng(0).permutation(16), jnp.int32)

    @pytest.mark.pallas
    @pytest.mark.parametrize("by", ["ref", "vector"])
    def test_sparse_core_gather(by):
        mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                      num_cores=1)

        @functools.partial(pl.kernel, out_type=jax.ShapeDtypeStruct(X.shape, X.dtype),
                           mesh=mesh, scratch_types=[pltpu.VMEM((16,), jnp.int32),
                                                     pltpu.VMEM(X.shape, X.dtype),
                                                     pltpu.SemaphoreType.DMA])
        def gather(x_hbm, indices_hbm, o_hbm, indices, o_vmem, sem):
            # Into VMEM: Mosaic gathers from HBM to VMEM, not from HBM to HBM.
            pltpu.sync_copy(indices_hbm, indices)
            rows = x_hbm.at[indices if by == "ref" else indices[...]]
            pltpu.async_copy(rows, o_vmem, sem).wait()
            pltpu.sync_copy(o_vmem, o_hbm)

        np.testing.assert_array_equal(gather(X, INDICES), X[INDICES])

    def tensor_core_gather(indices, x_hbm, o_hbm, sem):
        copy = pltpu.make_async_copy(x_hbm.at[indices[...]], o_hbm, sem)
        copy.start()
        copy.wait()

    @pytest.mark.pallas
    def test_tensor_core_gather():
        pl.pallas_call(
            tensor_core_gather, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype),
            in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM), pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA])(INDICES, X)
''')


def test_a_dma_indexed_by_a_vector_is_named_in_one_line(pytester, run_pytest):
    pytester.makepyfile(test_gathers=INDEXED_DMAS)
    # v5p has SparseCores; without the compile check, the interpreters' verdicts alone.
    result = run_pytest("--pallas-interpret=tpu", "--pallas-chip=v5p", "--pallas-compile=none",
                        "-p", "no:xdist", "-W", "always", "-rfs")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*ValueError: pallas: kernel 'tensor_core_gather at test_gathers.py:*': a DMA indexed "
        "by a vector of indices (its source, by 16 indices, at test_gathers.py:*) in a "
        "TensorCore kernel, which the TPU compiler rejects*"])
    result.stdout.no_fnmatch_line("*InterpreterLimit: *")  # the SparseCore gathers ran


# A kernel only device 0 of eight runs (inside a lax.cond on lax.axis_index): JAX's TPU
# interpreter waits at its start for all eight. The same with a remote copy to device 1,
# which skips it: that hangs on the chip too, so it stays the timeout's failure.
KERNEL_ON_ONE_DEVICE = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from jax.sharding import Mesh, PartitionSpec as P

    def add_one(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    def send_right(x_ref, o_ref, send, receive):
        copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, receive, device_id=1,
                                            device_id_type=pl.DeviceIdType.LOGICAL)
        copy.start()
        copy.wait()

    def on_device_zero(kernel, x):
        def call(block):
            scratch = [pltpu.SemaphoreType.DMA] * (2 if kernel is send_right else 0)
            space = pl.ANY if kernel is send_right else pltpu.VMEM
            return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(block.shape, block.dtype),
                                  in_specs=[pl.BlockSpec(memory_space=space)],
                                  out_specs=pl.BlockSpec(memory_space=space),
                                  scratch_shapes=scratch)(block)

        mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
        per_device = lambda block: lax.cond(lax.axis_index("x") == 0, call, jnp.negative, block)
        return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                     check_vma=False))(x)

    @pytest.mark.pallas
    @pytest.mark.devices(8)
    @pytest.mark.parametrize("kernel", [add_one, send_right], ids=["alone", "talking"])
    def test_kernel_on_device_zero(kernel):
        jax.block_until_ready(on_device_zero(kernel, jnp.ones((64, 128), jnp.float32)))
''')


def test_a_kernel_only_some_devices_run_skips_naming_the_interpreters_barrier(pytester,
                                                                             run_pytest):
    pytester.makepyfile(test_some_devices=KERNEL_ON_ONE_DEVICE)
    # In the TPU interpreter for every kernel: the plain path would run add_one (no DMA,
    # no barrier), as the next test shows.
    result = run_pytest("--pallas-interpret=tpu-always", "--pallas-devices=8",
                        "--pallas-timeout=5", "--pallas-compile=none", "-p", "no:xdist", "-rfs",
                        timeout=180)
    result.assert_outcomes(skipped=1, failed=1)
    result.stdout.fnmatch_lines([
        "*KernelTimeout: pallas: kernel 'send_right at test_some_devices.py:*' * ran longer "
        "than --pallas-timeout=5s*",
        "SKIPPED*pallas: kernel 'add_one at test_some_devices.py:*' was run by 1 of the 8 "
        "devices of its mesh*JAX's TPU interpreter waits at its start for every device*"])


def test_a_kernel_only_some_devices_run_passes_in_the_plain_path(pytester, run_pytest):
    pytester.makepyfile(test_some_devices=KERNEL_ON_ONE_DEVICE)
    result = run_pytest("--pallas-interpret=tpu", "--pallas-devices=8", "--pallas-timeout=5",
                        "--pallas-compile=none", "-p", "no:xdist", "-rfs", timeout=180)
    # add_one runs as one XLA loop on device 0 alone, as on the chip; send_right still hangs.
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*KernelTimeout: pallas: kernel 'send_right at "
                                 "test_some_devices.py:*' * ran longer than --pallas-timeout=5s*"])


KERNEL_IN_A_CUSTOM_VJP = textwrap.dedent('''
    import jax, jax.numpy as jnp, pytest
    from jax.experimental import pallas as pl

    def double(x):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    @jax.custom_vjp
    def f(x):
        return double(x)

    f.defvjp(lambda x: (double(x), None), lambda _, g: (double(g),))

    @pytest.fixture(autouse=True)
    def jax_checks_on():
        jax.config.update("jax_enable_checks", True)  # as JAX's own tests have them
        yield
        jax.config.update("jax_enable_checks", False)

    @pytest.mark.pallas
    def test_value_and_grad():
        x = jnp.ones((8, 128))
        assert (jax.jit(f)(x) == 2).all()
        assert (jax.grad(lambda x: f(x).sum())(x) == 2).all()
''')


@pytest.mark.parametrize("mode", ["tpu", "tpu-always"])
def test_a_kernel_inside_a_custom_vjp_runs_interpreted(pytester, run_pytest, mode):
    pytester.makepyfile(test_custom_vjp=KERNEL_IN_A_CUSTOM_VJP)
    result = run_pytest(f"--pallas-interpret={mode}", "--pallas-compile=none", "-p", "no:xdist")
    result.assert_outcomes(passed=1)
