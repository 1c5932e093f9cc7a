"""Every test ends, and the run goes on (``--pallas-timeout``): a test that hangs in a kernel,
in its own Python code or inside an XLA computation that never returns fails naming where
it was, the test after it still runs and passes, and the JUnit XML, ``--pallas-report`` and
the summary keep every test; in one process and under pytest-xdist."""

import json
import textwrap
import xml.etree.ElementTree as ElementTree

import pytest

HANGS = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, pytest
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def waits_for_a_dma_nobody_started(x_ref, o_ref, sem):
        pltpu.make_async_copy(x_ref, o_ref, sem).wait()

    @jax.jit
    def never_returns(x):
        # Even counts never reach -1, through int32's wrap too; the body changes x, so
        # that XLA keeps the loop.
        return lax.while_loop(lambda c: c[0] != -1, lambda c: (c[0] + 2, c[1] * 1.5),
                              (0, x))[1]

    @pytest.mark.pallas
    def test_1_hangs_in_a_kernel():
        x = jnp.ones((8, 128))
        pl.pallas_call(
            waits_for_a_dma_nobody_started, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA])(x)

    @pytest.mark.pallas
    def test_2_after_the_kernel():
        assert float(jnp.ones(3).sum()) == 3.0

    @pytest.mark.pallas
    def test_3_hangs_in_its_body():
        while True:
            pass

    @pytest.mark.pallas
    def test_4_after_the_body():
        assert float(jnp.ones(3).sum()) == 3.0

    @pytest.mark.pallas
    def test_5_hangs_in_xla():
        print("before XLA")
        never_returns(jnp.ones(4)).block_until_ready()

    @pytest.mark.pallas
    def test_6_after_xla():
        assert float(jnp.ones(3).sum()) == 3.0
    """
)

# How each mode runs the tests: one process, or two pytest-xdist workers.
MODES = {"one process": ("-p", "no:xdist"), "xdist": ("-n", "2")}


def _line_of(path, text: str) -> int:
    return next(number for number, line in enumerate(path.read_text().splitlines(), 1)
                if text in line)


def _junit_verdicts(path) -> dict[str, tuple[str, str]]:
    """Each test case of a JUnit XML file: (its verdict, its failure's message)."""
    verdicts = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        failure = case.find("failure")
        error = case.find("error")
        verdict = ("failed" if failure is not None else "error" if error is not None
                   else "passed")
        message = (failure if failure is not None else error if error is not None else case)
        verdicts[case.get("name")] = (verdict, message.get("message") or "")
    return verdicts


@pytest.mark.parametrize("mode", MODES)
def test_every_hang_fails_naming_where_it_was_and_the_run_goes_on(pytester, mode):
    source = pytester.makepyfile(test_hangs=HANGS)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", *MODES[mode], "--pallas-timeout=2", "--pallas-compile=none",
        f"--junitxml={junit}", timeout=300)
    result.assert_outcomes(passed=3, failed=3)
    verdicts = _junit_verdicts(junit)
    assert {name: verdict for name, (verdict, _) in verdicts.items()} == {
        "test_1_hangs_in_a_kernel": "failed", "test_2_after_the_kernel": "passed",
        "test_3_hangs_in_its_body": "failed", "test_4_after_the_body": "passed",
        "test_5_hangs_in_xla": "failed", "test_6_after_xla": "passed"}
    assert ("KernelTimeout: pallas: kernel 'waits_for_a_dma_nobody_started at test_hangs.py:"
            in verdicts["test_1_hangs_in_a_kernel"][1])
    body_line = _line_of(source, "while True:")
    assert (f"test_hangs.py::test_3_hangs_in_its_body ran longer than --pallas-timeout=2s "
            f"outside its kernels, in its own code at test_hangs.py:{body_line}, and was "
            "stopped" in verdicts["test_3_hangs_in_its_body"][1])
    xla_line = _line_of(source, "never_returns(jnp.ones(4))")
    xla_message = verdicts["test_5_hangs_in_xla"][1]
    assert (f"test_hangs.py::test_5_hangs_in_xla ran longer than --pallas-timeout=2s outside "
            f"its kernels, in XLA, running a computation of its own called at "
            f"test_hangs.py:{xla_line}" in xla_message)
    assert ("It could not be stopped in its process (inside XLA, which does not return to "
            "Python): the process was ended and the run went on with the next test"
            in xla_message)
    # The summary's section of the stuck test: its stack, what it printed, how to rerun it.
    result.stdout.fnmatch_lines([
        "*_ test_5_hangs_in_xla _*", "where the test's thread was (innermost last):",
        f'  File "*test_hangs.py", line {xla_line}, in test_5_hangs_in_xla',
        "*Captured stdout call*", "before XLA", "*pallas*", "seed *; reproduce with:",
        "  pytest test_hangs.py::test_5_hangs_in_xla --pallas-seed=* --pallas-timeout=2 *"])
    assert "crashed while running" not in result.stdout.str()  # xdist's report of a crash
    if mode == "xdist":
        result.stdout.fnmatch_lines([
            "pallas: pytest-xdist's worker gw* was ended: test_hangs.py::test_5_hangs_in_xla ran "
            "past --pallas-timeout and could not be stopped in it"])


HANGS_IN_TEST_VALUE = textwrap.dedent(
    """
    import os
    import numpy as np
    import jax, jax.numpy as jnp
    from jax import lax

    def _in_test_value():
        return np.bool_("test_value" in os.environ.get("PYTEST_CURRENT_TEST", ""))

    def copy(x):
        # Loops inside XLA for ever when the value property calls it; returns x otherwise.
        hang = jax.pure_callback(_in_test_value, jax.ShapeDtypeStruct((), jnp.bool_),
                                 vmap_method="broadcast_all")
        return lax.while_loop(lambda c: c[0] & (c[1] != -1),
                              lambda c: (c[0], c[1] + 2, c[2] + c[2]), (hang, 0, x))[2]
    """
)


@pytest.mark.parametrize("mode", MODES)
def test_the_report_keeps_every_property_after_a_hang_inside_xla(pytester, mode):
    pytester.makepyfile(hangs=HANGS_IN_TEST_VALUE)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        # Long enough for the suite's own work on a busy host: the hang is the one to stop.
        "-p", "no:cacheprovider", *MODES[mode], "--pallas-timeout=8", "--pallas-seed=0",
        "--pallas-examples=2", "--pallas-impl", "copy=hangs:copy",
        f"--pallas-report={report}", timeout=300)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["FAILED *test_value[[]copy[]] - pallas: *"])
    document = json.loads(report.read_text())
    assert document["complete"] is True, document["incomplete_reasons"]
    properties = document["ops"]["copy"]["properties"]
    # The value property's test hung at its first example: its shape and finiteness have none.
    assert {name: found["verdict"] for name, found in properties.items()} == {
        "value": "fail", "written": "pass", "deterministic": "pass", "vmap": "pass"}
    assert properties["value"]["first_failure"].startswith(
        "pallas: test_dma.py::test_value[copy] ran longer than --pallas-timeout=8s outside its "
        "kernels, in XLA")


def test_a_worker_ended_for_a_stuck_test_does_not_count_as_a_crash():
    # pytest-xdist's controller keeps its limit on restarts where the plugin raises it.
    from xdist.dsession import DSession

    from pytest_pallas._compat import xdist_internals

    class Plugins:
        def get_plugin(self, name):
            return dsession if name == "dsession" else None

    dsession = DSession.__new__(DSession)
    dsession._max_worker_restart = 8
    config = type("Config", (), {"pluginmanager": Plugins()})()
    assert xdist_internals.allow_one_more_worker_restart(config)
    assert dsession._max_worker_restart == 9
    assert "self._max_worker_restart = " in __import__("inspect").getsource(DSession.__init__)
    dsession._max_worker_restart = None  # restarts without a limit
    assert not xdist_internals.allow_one_more_worker_restart(config)
