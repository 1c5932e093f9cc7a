"""--pallas-processes=N: each test in N jax.distributed processes on this host, one verdict.

One run of one module carries the behaviours that need the processes (each start of N JAX
processes costs seconds): a Pallas kernel in a shard_map across both processes, Hypothesis
draws under a collective, a test wrong in one process, a test that hangs in one, a remote
DMA across processes, a test one process did not collect, and a process that dies.
"""

import os
import textwrap

import pytest

from pytest_pallas._compat.interpreter_processes import local_participants

SHARDED_MODULE = textwrap.dedent('''
    import os

    import jax
    import numpy as np
    import pytest
    from hypothesis import given, strategies as st
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


    def double(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0


    def global_array(mesh, rows):
        """A (devices * rows, 128) array, each process giving its own rows of it."""
        whole = np.arange(jax.device_count() * rows * 128, dtype=np.float32)
        whole = whole.reshape(-1, 128)
        share = whole.shape[0] // jax.process_count()
        mine = whole[jax.process_index() * share:(jax.process_index() + 1) * share]
        return whole, jax.make_array_from_process_local_data(
            NamedSharding(mesh, P("x")), mine, whole.shape)


    def doubled_and_summed(rows):
        mesh = Mesh(np.array(jax.devices()), ("x",))

        def body(x):
            y = pl.pallas_call(double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
            return jax.lax.psum(y, "x")

        program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P(),
                                        check_vma=False))
        whole, x = global_array(mesh, rows)
        got = np.asarray(program(x).addressable_data(0))
        return got, 2 * whole.reshape(jax.device_count(), rows, 128).sum(0)


    @pytest.mark.pallas
    def test_a_kernel_across_both_processes():
        assert (jax.process_count(), jax.local_device_count(), jax.device_count()) == (2, 2, 4)
        got, expected = doubled_and_summed(8)
        np.testing.assert_allclose(got, expected)


    @pytest.mark.pallas
    @given(st.sampled_from([8, 16, 24, 32]))
    def test_drawn_shapes_under_a_collective(rows):
        got, expected = doubled_and_summed(rows)
        np.testing.assert_allclose(got, expected)


    @pytest.mark.pallas
    def test_wrong_in_one_process():
        assert jax.process_index() != 1, "process 1 sees a wrong value"


    @pytest.mark.pallas
    def test_one_process_never_reaches_the_collective():
        if jax.process_index() == 1:
            return
        doubled_and_summed(8)


    @pytest.mark.pallas
    def test_not_collected_in_process_1():
        pass


    @pytest.mark.pallas
    def test_a_remote_copy_to_the_next_device():
        mesh = Mesh(np.array(jax.devices()), ("x",))

        def kernel(x_ref, o_ref, send, receive):
            me = jax.lax.axis_index("x")
            copy = pltpu.make_async_remote_copy(
                x_ref, o_ref, send, receive, device_id=((me + 1) % 4,))
            copy.start()
            copy.wait()

        def body(x):
            return pl.pallas_call(
                kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec(memory_space=pl.ANY),
                scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA])(x)

        program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                        check_vma=False))
        program(global_array(mesh, 8)[1])


    @pytest.mark.pallas
    def test_process_1_dies():
        if jax.process_index() == 1:
            os._exit(3)


    @pytest.mark.pallas
    def test_the_run_goes_on():
        got, expected = doubled_and_summed(8)
        np.testing.assert_allclose(got, expected)
''')

# Process 1 leaves one test out, as a conftest that differs by process would.
DIFFERING_CONFTEST = textwrap.dedent('''
    import os

    def pytest_collection_modifyitems(items):
        if os.environ.get("PYTEST_PALLAS_PROCESS", "").startswith("1/"):
            items[:] = [item for item in items if "not_collected" not in item.name]
''')


def _workers_left_in(directory):
    """Processes running in ``directory`` with a --pallas-processes worker's environment."""
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd") != str(directory):
                continue
            with open(f"/proc/{pid}/environ", "rb") as file:
                if b"PYTEST_PALLAS_COORDINATOR=" in file.read():
                    left.append(pid)
        except OSError:
            continue
    return left


def _describe(pid):
    try:
        with open(f"/proc/{pid}/status") as status, open(f"/proc/{pid}/cmdline", "rb") as line:
            return status.read().splitlines()[:8], line.read().replace(b"\0", b" ")[:300]
    except OSError as error:
        return str(error)


def test_two_processes_one_verdict_per_test(run_pytest, pytester):
    pytester.makepyfile(test_sharded=SHARDED_MODULE)
    pytester.makeconftest(DIFFERING_CONFTEST)
    result = run_pytest("-p", "no:xdist", "--pallas-processes=2", "--pallas-devices=4",
                        "--pallas-timeout=8", "--pallas-examples=4", "-rfs", timeout=400)
    output = result.stdout.str()
    assert output.count("pallas: 2 JAX processes joined by jax.distributed") == 1, output
    outcomes = result.parseoutcomes()
    assert (outcomes.get("passed"), outcomes.get("failed"), outcomes.get("skipped")) == (
        3, 4, 1), output
    # Each failure under the name of the process it happened in.
    for expected in (
            "process 1: AssertionError: process 1 sees a wrong value",
            "process 0 did not finish this test within --pallas-timeout=8s",
            "process 0: Failed: the processes disagree on test 4",
            "process 1: did not collect test_sharded.py::test_not_collected_in_process_1",
            "process 1 exited (code 3) before finishing this test"):
        assert expected in output, output
    assert "process 0: AssertionError" not in output
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_sharded.py:*: a kernel copies to or "
                                 "signals another device (dma_start)*--pallas-processes=1"])
    left = _workers_left_in(pytester.path)
    assert not left, [_describe(pid) for pid in left]  # no worker outlives the run


@pytest.mark.parametrize(("args", "message"), [
    (["--pallas-processes=0"], "--pallas-processes='0' must be a whole number of processes"),
    (["--pallas-processes=2", "--pallas-devices=3"],
     "--pallas-devices=3 cannot be split among --pallas-processes=2"),
    (["--pallas-processes=2", "-n", "2"], "does not combine with pytest-xdist's -n"),
    (["--pallas-processes=2", "--pallas-tpu"], "start `pytest --pallas-tpu` on every host"),
])
def test_usage_errors(pytester, args, message):
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])


@pytest.mark.parametrize(("mesh", "local", "total", "expected"), [
    (4, 2, 4, 2),   # a mesh over every device of 2 processes: this process's 2
    (8, 4, 8, 4),
    (2, 2, 4, 2),   # a mesh within this process
    (4, 4, 4, 4),   # one process
])
def test_the_interpreter_waits_for_this_processes_devices(mesh, local, total, expected):
    assert local_participants(mesh, local, total) == expected


def _kernel_jaxprs(kernel, **call):
    """The kernel bodies of a pallas_call traced inside a shard_map over 2 devices."""
    import jax
    import numpy as np
    from jax.experimental import pallas as pl
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from pytest_pallas._compat.pallas_call_hooks import observe_pallas_calls

    seen = []
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))

    def body(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              interpret=True, **call)(x)

    program = jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                            check_vma=False)
    with observe_pallas_calls(lambda params: seen.append(params["jaxpr"])):
        jax.make_jaxpr(program)(np.zeros((16, 128), np.float32))
    return seen


def test_a_remote_copy_is_found_and_a_local_one_is_not():
    import jax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from pytest_pallas._compat.interpreter_processes import remote_device_operations

    if len(jax.devices()) < 2:
        pytest.skip("needs 2 devices")
    memory = {"in_specs": [pl.BlockSpec(memory_space=pl.ANY)],
              "out_specs": pl.BlockSpec(memory_space=pl.ANY),
              "scratch_shapes": [pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA]}

    def remote(x_ref, o_ref, send, receive):
        copy = pltpu.make_async_remote_copy(
            x_ref, o_ref, send, receive, device_id=(1 - jax.lax.axis_index("x"),))
        copy.start()
        copy.wait()

    def local(x_ref, o_ref, send, receive):
        copy = pltpu.make_async_copy(x_ref, o_ref, send)
        copy.start()
        copy.wait()

    [remote_body] = _kernel_jaxprs(remote, **memory)
    [local_body] = _kernel_jaxprs(local, **memory)
    assert remote_device_operations(remote_body) == ["dma_start"]
    assert remote_device_operations(local_body) == []
