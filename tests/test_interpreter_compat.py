"""The plugin's fixes to JAX's TPU interpreter (pytest_pallas._compat.interpreter_fixes), each
through
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


# A kernel over a TensorCore mesh that allocates HBM in run_scoped, which JAX's TPU
# interpreter allows only when the kernel's own InterpretParams say so.
CORE_MAP_WITH_OWN_PARAMS = textwrap.dedent('''
    import functools
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from pytest_pallas._compat.jax_internals import tensorcore_mesh

    @pytest.mark.pallas
    @pytest.mark.skipif("core_map" not in vars(pl), reason="pl.core_map is deprecated here")
    def test_hbm_in_run_scoped():
        mesh = tensorcore_mesh("core", 1)

        @jax.jit
        def f(x):
            def inner(refs):
                x_ref, y_ref = refs

                @pl.core_map(mesh, interpret=pltpu.InterpretParams(
                    allow_hbm_allocation_in_run_scoped=True))
                def _():
                    def copy(hbm):
                        pltpu.sync_copy(x_ref, hbm)
                        pltpu.sync_copy(hbm, y_ref)

                    pl.run_scoped(copy, pltpu.HBM(x_ref.shape, x_ref.dtype))

            _, y = pl.run_state(inner)((x, jnp.zeros_like(x)))
            return y

        np.testing.assert_array_equal(f(jnp.arange(8.0)), np.arange(8.0))

    @pytest.mark.pallas
    def test_hbm_in_run_scoped_of_pl_kernel():
        @functools.partial(
            pl.kernel, out_type=jax.ShapeDtypeStruct((8,), jnp.float32),
            mesh=tensorcore_mesh("core", 1),
            interpret=pltpu.InterpretParams(allow_hbm_allocation_in_run_scoped=True))
        def f(x_ref, y_ref):
            def copy(hbm):
                pltpu.sync_copy(x_ref, hbm)
                pltpu.sync_copy(hbm, y_ref)

            pl.run_scoped(copy, pltpu.HBM(x_ref.shape, x_ref.dtype))

        np.testing.assert_array_equal(f(jnp.arange(8.0)), np.arange(8.0))
''')


def test_core_map_keeps_its_own_interpret_params(pytester, run_pytest):
    pytester.makepyfile(test_core_map=CORE_MAP_WITH_OWN_PARAMS)
    result = run_pytest("--pallas-interpret=tpu", "-p", "no:xdist", "-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) + outcomes.get("skipped", 0) == 2, result.stdout.str()
    assert outcomes.get("passed", 0) >= 1 and not outcomes.get("failed"), result.stdout.str()


# A kernel that reads a DMA's destination before waiting on it, and a test that asks JAX's
# race detector (its own detect_races=True) to find that: the race is the test's to judge.
RACE_THE_TEST_DETECTS_ITSELF = textwrap.dedent('''
    import dataclasses
    import jax, jax.numpy as jnp, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as interpreter

    def reads_before_wait(x_hbm, o_ref, scratch, sem):
        copy = pltpu.make_async_copy(x_hbm, scratch, sem)
        copy.start()
        o_ref[...] = scratch[...]  # the race: the copy may still be writing scratch
        copy.wait()

    @pytest.mark.pallas
    def test_jax_detects_the_race():
        fields = {field.name for field in dataclasses.fields(pltpu.InterpretParams)}
        params = pltpu.InterpretParams(detect_races=True, **(
            {"on_race": "warn"} if "on_race" in fields else {}))
        x = jnp.ones((8, 128), jnp.float32)
        jax.block_until_ready(pl.pallas_call(
            reads_before_wait, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA],
            interpret=params)(x))
        assert interpreter.races.races_found
''')


def test_a_race_the_test_asked_jax_to_detect_is_the_tests_to_judge(pytester, run_pytest):
    pytester.makepyfile(test_race=RACE_THE_TEST_DETECTS_ITSELF)
    result = run_pytest("--pallas-interpret=tpu", "-p", "no:xdist")
    result.assert_outcomes(passed=1)
    # With --pallas-detect-races the run asks for races to be judged: the plugin fails it.
    judged = run_pytest("--pallas-interpret=tpu", "--pallas-detect-races", "-p", "no:xdist")
    judged.assert_outcomes(failed=1)
    judged.stdout.fnmatch_lines(["*[[]data-race[]]*"])


# The DMAs of a no-op tile sized to zero, as tpu-inference's ragged causal conv1d does: rows
# [start, start + size) with start = 3, the end of a 3-row input, and size 0, then a real copy
# on the same semaphore. The chip moves nothing for the first; it is neither an
# out-of-bounds access nor a DMA left unwaited. The TPU compiler (--pallas-compile, on by
# default where libtpu is installed) must accept the kernel.
ZERO_LENGTH_DMAS = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def no_op_tile_then_copy(start_ref, x_hbm, o_ref, buf, sem):
        start = start_ref[0]
        size = 0  # the no-op tile's: jnp.where(is_no_op, 0, tile) in the kernel it comes from
        empty = pltpu.make_async_copy(x_hbm.at[pl.ds(start, size)], buf.at[pl.ds(0, size)], sem)
        whole = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 1)], buf.at[pl.ds(0, 1)], sem)
        empty.start()
        whole.start()
        empty.wait()
        whole.wait()
        o_ref[...] = buf[0] * 2

    @pytest.mark.pallas
    def test_zero_length_dmas():
        x = jnp.arange(3 * 8 * 128, dtype=jnp.float32).reshape(3, 8, 128)
        out = pl.pallas_call(
            no_op_tile_then_copy, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
            scratch_shapes=[pltpu.VMEM((3, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
        )(jnp.array([3], jnp.int32), x)
        np.testing.assert_array_equal(out, np.asarray(x[0]) * 2)
''')


def test_a_zero_length_dma_at_the_end_of_an_array_is_no_finding(pytester, run_pytest):
    pytester.makepyfile(test_zero_length=ZERO_LENGTH_DMAS)
    result = run_pytest("--pallas-interpret=tpu", "-p", "no:xdist")
    result.assert_outcomes(passed=1)
    if "TPU compiler check for" in result.stdout.str():  # libtpu installed: it compiled
        result.stdout.fnmatch_lines(["pallas: TPU compiler check: 1 kernel compiles*"])


def _race_detector():
    """JAX's race detector and a write of one of two unordered cores, at either end of the range."""
    import inspect

    from jax._src.pallas.mosaic.interpret import race_detection_state, vector_clock

    fields = inspect.signature(race_detection_state.RaceDetectionState).parameters
    state = (race_detection_state.RaceDetectionState(num_cores=2) if "num_cores" in fields
             else race_detection_state.RaceDetectionState(on_race="warn"))

    def clock(core):  # each core has ticked once: the two are unordered
        if hasattr(vector_clock, "NpVectorClock"):
            tick = vector_clock.NpVectorClock(2)
            tick.inc(core)
        else:
            tick = vector_clock.make_vector_clock(2)
            vector_clock.inc_vector_clock(tick, core)
        return tick

    def write(core, rnge):
        if "thread" in inspect.signature(state.check_write).parameters:
            state.check_write((0, core), clock(core), ("vmem", 0, 0, 0), rnge)
        else:
            state.check_write(0, core, clock(core), ("vmem", 0, 0, 0), rnge)

    return state, write


def test_a_zero_length_write_races_with_nothing():
    # tpu-inference's fused MoE: an all-to-all copy of zero rows (an expert no token chose)
    # into rows [2, 2), unordered with another device's copy into rows [2, 3). JAX's detector
    # (race_detection_state._slices_overlap) took slice(2, 2) as overlapping slice(2, 3).
    from pytest_pallas._compat import interpreter_fixes

    with interpreter_fixes.empty_accesses_race_with_nothing() as on:
        assert on
        state, write = _race_detector()
        write(0, (0, slice(2, 3, 1), slice(0, 128, 1)))
        write(1, (0, slice(2, 2, 1), slice(0, 128, 1)))
        assert not state.races_found
        write(1, (0, slice(2, 4, 1), slice(0, 128, 1)))  # a real overlap is still a race
        assert state.races_found


# The same no-op tile's copy on a semaphore of its own, under race detection: nothing ever
# signals that semaphore, and JAX's interpreter stopped at `assert clock is not None` in its
# wait (tpu-inference's ragged conv1d with --pallas-detect-races). A wait for 0 bytes returns.
ZERO_LENGTH_DMA_ALONE = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def no_op_tile_alone(start_ref, x_hbm, o_ref, buf, sems):
        empty = pltpu.make_async_copy(x_hbm.at[pl.ds(start_ref[0], 0)], buf.at[pl.ds(0, 0)],
                                      sems.at[0])
        whole = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 1)], buf.at[pl.ds(0, 1)], sems.at[1])
        empty.start()
        empty.wait()
        whole.start()
        whole.wait()
        o_ref[...] = buf[0] * 2

    @pytest.mark.pallas
    def test_zero_length_dma_alone():
        x = jnp.arange(3 * 8 * 128, dtype=jnp.float32).reshape(3, 8, 128)
        out = pl.pallas_call(
            no_op_tile_alone, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
            scratch_shapes=[pltpu.VMEM((3, 8, 128), jnp.float32),
                            pltpu.SemaphoreType.DMA((2,))],
        )(jnp.array([3], jnp.int32), x)
        np.testing.assert_array_equal(out, np.asarray(x[0]) * 2)
''')


def test_a_zero_length_dma_waited_alone_under_race_detection_returns(pytester, run_pytest):
    pytester.makepyfile(test_zero_length_alone=ZERO_LENGTH_DMA_ALONE)
    result = run_pytest("--pallas-detect-races", "-p", "no:xdist")
    result.assert_outcomes(passed=1)


# An operand of pl.kernel constrained to SMEM, as tokamax's gmm_v2 passes its group sizes:
# the TPU interpreter refused it ("Unsupported memory space: smem").
SMEM_OPERAND = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from pytest_pallas.tpu import tensorcore_mesh

    def body(scale_ref, x_hbm, o_hbm, buf, sem):
        copy_in = pltpu.make_async_copy(x_hbm, buf, sem)
        copy_in.start()
        copy_in.wait()
        buf[...] = buf[...] * scale_ref[1].astype(jnp.float32)
        copy_out = pltpu.make_async_copy(buf, o_hbm, sem)
        copy_out.start()
        copy_out.wait()

    @jax.jit
    def scaled(scale, x):
        scale = pltpu.with_memory_space_constraint(scale, pltpu.SMEM)
        return pl.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                         mesh=tensorcore_mesh("core", 1),
                         scratch_types=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA],
                         )(scale, x)

    @pytest.mark.pallas
    def test_smem_operand():
        x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
        out = scaled(jnp.asarray([2, 3], jnp.int32), x)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(x) * 3)
''')


def test_an_operand_constrained_to_smem_runs_in_the_tpu_interpreter(pytester, run_pytest):
    pytester.makepyfile(test_smem_operand=SMEM_OPERAND)
    result = run_pytest(
        "--pallas-interpret=tpu", "--pallas-detect-races", "-p", "no:xdist",
        "-W", "error::pytest_pallas.supervision.kernel_run.PallasInterpreterFallback")
    result.assert_outcomes(passed=1)


# pltpu.pack_elementwise and unpack_elementwise, which JAX gives no CPU rule: the values of
# JAX's own tests' construction (tests/pallas/tpu_ops_test.py), low bits first.
PACKING = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    @pytest.mark.pallas
    @pytest.mark.parametrize("wide, narrow", [(jnp.float32, jnp.bfloat16), (jnp.int32, jnp.int8),
                                              (jnp.int16, jnp.int8)])
    def test_pack_then_unpack(wide, narrow):
        bits = 8 * jnp.dtype(narrow).itemsize
        factor = jnp.dtype(wide).itemsize * 8 // bits
        rng = np.random.default_rng(0)
        xs = (rng.standard_normal((factor, 8, 128)) * 50).astype(wide)
        word = f"uint{8 * jnp.dtype(wide).itemsize}"

        def pack(xs_ref, o_ref):
            o_ref[...] = pltpu.pack_elementwise([xs_ref[i] for i in range(factor)],
                                                packed_dtype=narrow)

        packed = pl.pallas_call(pack, out_shape=jax.ShapeDtypeStruct((8, 128), word))(xs)
        expected = np.zeros((8, 128), np.uint64)
        for i in range(factor):
            low = np.asarray(jnp.asarray(xs[i]).astype(narrow).view(f"uint{bits}"))
            expected |= low.astype(np.uint64) << np.uint64(i * bits)
        np.testing.assert_array_equal(np.asarray(packed).astype(np.uint64), expected)
        for index in range(factor):
            def unpack(x_ref, o_ref):
                o_ref[...] = pltpu.unpack_elementwise(x_ref[...], index=index,
                                                      packed_dtype=narrow, unpacked_dtype=wide)
            out = pl.pallas_call(unpack, out_shape=jax.ShapeDtypeStruct((8, 128), wide))(packed)
            np.testing.assert_array_equal(out, jnp.asarray(xs[index]).astype(narrow).astype(wide))
''')


def test_pack_and_unpack_elementwise_run_in_the_tpu_interpreter(pytester, run_pytest):
    pytester.makepyfile(test_packing=PACKING)
    run_pytest("-p", "no:xdist", "--pallas-compile=none").assert_outcomes(passed=3)


# pltpu.trace_value: a scalar for the chip's xprof trace. JAX gives it no CPU rule, and on a
# chip of two TensorCores its effect stopped the per-core program's lowering ("Cannot lower
# jaxpr with effects").
TRACED_KERNEL = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_ref, o_ref):
        pltpu.trace_value("total", jnp.sum(x_ref[...]))
        o_ref[...] = x_ref[...] + 1

    @pytest.mark.pallas
    def test_a_traced_value_changes_nothing():
        x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
        out = pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                                 has_side_effects=True))(x)
        np.testing.assert_array_equal(out, np.asarray(x) + 1)
''')


def test_trace_value_runs_on_one_and_two_tensorcores(pytester, run_pytest):
    pytester.makepyfile(test_traced=TRACED_KERNEL)
    result = run_pytest("-p", "no:xdist", "--pallas-compile=none", "--pallas-interpret=tpu",
                        "--pallas-chip=v5e,v5p")
    result.assert_outcomes(passed=2)


# A row broadcast as tokamax's grouped matmul loads it: pl.ds(i, n, stride=0) reads row i n
# times on the chip (the TPU compiler accepts it); the interpreter read nothing.
ZERO_STRIDE_LOAD = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl

    @pytest.mark.pallas
    def test_zero_stride_load_broadcasts_a_row():
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[pl.ds(3, 8, stride=0), :] + x_ref[pl.ds(0, 8), :]
        x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
        out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(x)
        np.testing.assert_array_equal(out, np.asarray(x)[3] + np.asarray(x)[:8])
''')


def test_a_zero_stride_load_broadcasts_in_the_tpu_interpreter(pytester, run_pytest):
    pytester.makepyfile(test_broadcast=ZERO_STRIDE_LOAD)
    run_pytest("-p", "no:xdist").assert_outcomes(passed=1)


# JAX's pipeline tests run each case once more with jax_use_emit_pipeline_primitive on
# (tests/pallas/tpu_pallas_pipeline_test.py's *PrimitiveTest classes). Before JAX 0.12 its
# TPU interpreter has no rule for that primitive, and JAX's tracing refused the kernel.
EMIT_PIPELINE_PRIMITIVE = textwrap.dedent('''
    import functools
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax._src import config
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    @pytest.mark.pallas
    def test_pipeline_primitive_copies_and_scales_blocks():
        def kernel(x_hbm_ref, o_hbm_ref):
            def body(x_ref, o_ref):
                o_ref[...] = x_ref[...] * (pl.program_id(0) + 1)
            pltpu.emit_pipeline(
                body, grid=(4,),
                in_specs=pl.BlockSpec((8, 128), lambda i: (0, i)),
                out_specs=pl.BlockSpec((8, 128), lambda i: (0, i)),
            )(x_hbm_ref, o_hbm_ref)

        x = jnp.arange(8 * 512, dtype=jnp.int32).reshape(8, 512)
        with config.use_emit_pipeline_primitive(True):
            out = pl.pallas_call(
                kernel, out_shape=jax.ShapeDtypeStruct((8, 512), jnp.int32),
                in_specs=[pl.BlockSpec(memory_space=pltpu.HBM)],
                out_specs=pl.BlockSpec(memory_space=pltpu.HBM))(x)
        np.testing.assert_array_equal(out, np.asarray(x) * np.repeat(np.arange(1, 5), 128))
''')


def test_a_pipeline_built_as_the_emit_pipeline_primitive_runs_in_the_tpu_interpreter(
        pytester, run_pytest):
    pytester.makepyfile(test_pipeline_primitive=EMIT_PIPELINE_PRIMITIVE)
    run_pytest("-p", "no:xdist").assert_outcomes(passed=1)


def test_a_two_core_kernels_per_core_computations_run_on_the_last_device(monkeypatch):
    # JAX's paged-attention tests as a v5p hung: each core's computation, dispatched from
    # inside the kernel's callback to the default device, queued behind the test's own work,
    # which waited for the kernel. The computations go to the last simulated device.
    import jax

    from pytest_pallas._compat import interpreter_fixes, jax_internals

    thread_map = jax_internals.private_attribute("jax._src.pallas.mosaic.interpret.thread_map")
    devices_seen = []

    def run_jaxpr(*args):
        devices_seen.append(jax.numpy.zeros(()).devices())

    monkeypatch.setattr(thread_map, "_run_jaxpr", run_jaxpr)
    with interpreter_fixes.core_threads_off_the_kernels_device() as on:
        assert on
        thread_map._run_jaxpr()
    thread_map._run_jaxpr()
    assert len(jax.local_devices()) > 1
    assert devices_seen == [{jax.local_devices()[-1]}, {jax.local_devices()[0]}]


# pltpu.stochastic_round has no CPU rule in JAX: JAX's tpu_ops_test.py::test_stochastic_round
# skipped, neither interpreter able to run it. Rounded, each value is one of its two
# neighbours, and over many draws their mean is the value (stochastic rounding's promise).
STOCHASTIC_ROUND = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    @pytest.mark.pallas
    def test_stochastic_round_to_bfloat16():
        def kernel(x_ref, bits_ref, o_ref):
            o_ref[...] = pltpu.stochastic_round(x_ref[...], bits_ref[...],
                                                target_dtype=jnp.bfloat16)
        x = jnp.full((64, 128), 1.0 + 2.0 ** -9, jnp.float32)  # a quarter of a bf16 gap up
        bits = jax.random.bits(jax.random.key(0), x.shape, jnp.uint32)
        out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.bfloat16))(
            x, bits)
        values = np.asarray(out.astype(jnp.float32))
        assert set(np.unique(values)) == {1.0, 1.0 + 2.0 ** -7}
        assert abs(values.mean() - (1.0 + 2.0 ** -9)) < 2.0 ** -11
''')


def test_stochastic_rounding_runs_in_the_tpu_interpreter(pytester, run_pytest):
    pytester.makepyfile(test_stochastic_round=STOCHASTIC_ROUND)
    run_pytest("-p", "no:xdist", "--pallas-compile=none").assert_outcomes(passed=1)


# With pl.enable_poison_buffers on, the chip poisons a pipeline's unwritten integer output
# with only the top bit set (JAX's tpu_pallas_pipeline_test.py::test_poison_buffers, TPU
# v5+); JAX's interpreter filled the maximum. Off, the interpreter's maximum stays.
POISONED_INTEGERS = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def unwritten_half(dtype, poison):
        def body(x_ref, o_ref):
            o_ref[:4, :] = x_ref[:4, :]

        @pl.kernel(out_type=jax.ShapeDtypeStruct((8, 128), dtype),
                   mesh=pltpu.create_tensorcore_mesh("core"))
        def kernel(x_hbm_ref, o_hbm_ref):
            pltpu.emit_pipeline(body, grid=(1,),
                                in_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
                                out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)))(
                x_hbm_ref, o_hbm_ref)

        with pl.enable_poison_buffers(poison):
            out = np.asarray(jax.jit(kernel)(jnp.ones((8, 128), dtype)))
        np.testing.assert_array_equal(out[:4], 1)
        return np.unique(out[4:])

    @pytest.mark.pallas
    @pytest.mark.parametrize("dtype, chip_poison", [
        (jnp.int32, -2**31), (jnp.int8, -128), (jnp.uint8, 128), (jnp.uint32, 2**31)])
    def test_poisoned_buffers_read_the_chips_poison(dtype, chip_poison):
        assert unwritten_half(dtype, True).tolist() == [chip_poison]

    @pytest.mark.pallas
    def test_without_the_option_fresh_integers_stay_far_from_zero():
        assert unwritten_half(jnp.int32, False).tolist() == [2**31 - 1]
''')


def test_poisoned_integers_read_the_chips_poison(pytester, run_pytest):
    pytester.makepyfile(test_poison=POISONED_INTEGERS)
    run_pytest("-p", "no:xdist", "--pallas-compile=none").assert_outcomes(passed=5)
