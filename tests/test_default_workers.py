"""A conformance run of several ops uses pytest-xdist's workers by default, where installed."""

import json
import re
import textwrap
from types import SimpleNamespace

import pytest

from pytest_pallas.checks import compile_check

pytest.importorskip("xdist")

# Four cheap ops, one example each, every test deselected but the value property's.
SUITE = ("--pallas-conformance", "--pallas-ops=add,copy,softmax,sum", "--pallas-examples=1",
         "-k", "test_value", "--pallas-seed=0")
COMPILES_LINE = re.compile(r"pallas: TPU compiler check: (\d+) kernel compiles in [\d.]+ s")
WORKERS_LINE = re.compile(r"pallas: the conformance suite runs on (\d+) pytest-xdist workers")


@pytest.fixture
def cores(monkeypatch):
    """xdist's count of this machine's cores (its -n auto), with nobody's
    PYTEST_XDIST_AUTO_NUM_WORKERS."""
    from xdist.plugin import pytest_xdist_auto_num_workers

    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS")
    count = pytest_xdist_auto_num_workers(SimpleNamespace(option=SimpleNamespace(
        numprocesses=None)))
    if count < 2:
        pytest.skip(f"one core here ({count}): the plugin starts no workers")
    return count


def _verdicts(report_path):
    document = json.loads(report_path.read_text())
    assert document["complete"] is True
    return {op: {name: (prop["verdict"], prop["examples"], prop["worst_error_in_tolerances"])
                 for name, prop in data["properties"].items()}
            for op, data in document["ops"].items()}


def test_several_ops_run_on_the_cores_with_the_verdicts_of_one_process(run_pytest, pytester,
                                                                        cores):
    # Whether the controller has Hypothesis when the workers are done: it imports it while
    # they start, not after them in Hypothesis's terminal summary (0.7 s more of the run),
    # and without a thread's exception on the way.
    pytester.makeconftest("""
        import sys

        def pytest_sessionfinish(session):
            if not hasattr(session.config, "workerinput"):
                print("controller has hypothesis:", "hypothesis" in sys.modules)
    """)
    parallel = run_pytest(*SUITE, "--pallas-report=parallel.json", timeout=400)
    assert parallel.ret == 0, parallel.stdout.str()[-3000:]
    expected = min(cores, 4)
    header = [m for line in parallel.stdout.lines if (m := WORKERS_LINE.search(line))]
    assert [int(m.group(1)) for m in header] == [expected], parallel.stdout.lines[:12]
    parallel.stdout.fnmatch_lines(["*-n 0 runs it in one process*",
                                   f"created: {expected}/{expected} workers"])
    parallel.stdout.fnmatch_lines(["*controller has hypothesis: True*"])
    assert "Exception in thread" not in parallel.stderr.str(), parallel.stderr.str()[-2000:]

    serial = run_pytest(*SUITE, "-n", "0", "--pallas-report=serial.json", timeout=400)
    assert serial.ret == 0, serial.stdout.str()[-3000:]
    assert not any(WORKERS_LINE.search(line) for line in serial.stdout.lines)
    one, two = _verdicts(pytester.path / "serial.json"), _verdicts(pytester.path / "parallel.json")
    assert one == two and set(one) == {"add", "copy", "softmax", "sum"}
    # The end-of-run table lists the ops in the same order, however the workers finished.
    table = lambda result: [line.split()[0] for line in result.stdout.lines  # noqa: E731
                            if re.match(r"(add|copy|softmax|sum) ", line)]
    assert table(parallel) == table(serial) == ["add", "sum", "softmax", "copy"]  # the registry's
    if compile_check.libtpu_version() is not None:
        # The workers compiled; the controller's summary line adds up their compiles.
        for result in (serial, parallel):
            line = COMPILES_LINE.search(result.stdout.str())
            assert line and int(line.group(1)) > 0, result.stdout.str()[-2000:]


@pytest.mark.parametrize("args", [
    pytest.param(("-n", "0"), id="-n 0"),
    pytest.param(("-p", "no:xdist"), id="-p no:xdist"),
    pytest.param(("--pallas-ops=add",), id="one op: the edit-and-rerun loop"),
])
def test_no_workers_where_the_user_chose_or_they_cannot_pay_off(run_pytest, cores, args):
    # Every test deselected: the run configures (and would start its workers) and stops.
    result = run_pytest("--pallas-conformance", "-k", "no_such_test", *args, timeout=300)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stdout.str()[-3000:]
    output = result.stdout.str()
    assert not WORKERS_LINE.search(output) and "created:" not in output, output[-3000:]


FAILING_TESTS = textwrap.dedent(
    """
    import pytest

    @pytest.mark.pallas
    @pytest.mark.parametrize("n", range(4))
    def test_fails(n):
        assert n < 0
    """
)


def test_workers_draw_with_the_seed_the_header_prints(pytester, monkeypatch):
    """Without --pallas-seed each process would pick its own: the reproduce lines would lie."""
    monkeypatch.delenv("CI", raising=False)  # the dev profile: a fresh seed each run
    pytester.makepyfile(test_user=FAILING_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2",
                                           "--pallas-interpret=plain", timeout=300)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    output = result.stdout.str()
    header_seed = re.search(r"pallas: .*; seed (\d+) \(reproduce with", output).group(1)
    reproduce_seeds = re.findall(r"seed (\d+); reproduce with", output)
    assert len(reproduce_seeds) == 4 and set(reproduce_seeds) == {header_seed}, (
        header_seed, reproduce_seeds)


# --- The longest tests first ------------------------------------------------------------


def _item(nodeid, name):
    return SimpleNamespace(nodeid=nodeid, name=f"{name}[op]", originalname=name)


def test_workers_take_the_longest_tests_of_the_last_run_first():
    from pytest_pallas.plugin.conformance_order import longest_first

    items = [_item("a::test_value[add]", "test_value"), _item("a::test_vmap[add]", "test_vmap"),
             _item("a::test_value[sum]", "test_value"), _item("user::test_mine", "test_mine"),
             _item("a::test_written_and_deterministic[add]", "test_written_and_deterministic"),
             _item("a::test_vmap[new]", "test_vmap"), _item("a::test_value[new]", "test_value")]
    seconds = {"a::test_value[add]": 0.8, "a::test_vmap[add]": 2.5, "a::test_value[sum]": 1.5,
               "a::test_written_and_deterministic[add]": 1.1}
    ordered = longest_first(items, seconds, lambda item: not item.nodeid.startswith("user"))
    assert [item.nodeid for item in ordered] == [
        "a::test_value[new]", "a::test_vmap[new]",  # never timed: first, value first
        "a::test_vmap[add]", "a::test_value[sum]", "a::test_written_and_deterministic[add]",
        "a::test_value[add]",
        "user::test_mine",  # not a conformance test: after them, as collected
    ]


# --- Every worker's first chunk about as long as the others ------------------------------


class _Node:
    """What pytest-xdist's scheduler sees of a worker: the tests it is sent."""

    def __init__(self, name):
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent = []

    def send_runtest_some(self, indices):
        self.sent.extend(indices)

    def shutdown(self):
        self.shutting_down = True


def _scheduler(workers, tests, most_per_send=None):
    from xdist.scheduler import LoadScheduling

    options = {"tx": [f"{workers}*popen"], "maxschedchunk": most_per_send}
    config = SimpleNamespace(getvalue=options.get, getoption=options.get)
    scheduler = LoadScheduling(config)
    nodes = [_Node(f"gw{k}") for k in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
    for node in nodes:
        scheduler.add_node_collection(node, [f"t{i}" for i in range(tests)])
    scheduler.schedule()
    return scheduler, nodes


@pytest.mark.parametrize("tests,workers,most_per_send", [
    (46, 16, None), (46, 8, None), (46, 4, None), (46, 2, None), (20, 16, None),
    (300, 3, None), (300, 3, 4), (46, 2, 1)])
def test_the_first_chunk_is_the_one_pytest_xdist_sends(tests, workers, most_per_send):
    from pytest_pallas.plugin.conformance_order import first_chunk_size

    chunk = first_chunk_size(tests, workers, most_per_send)
    _, nodes = _scheduler(workers, tests, most_per_send)
    # The first worker starts on tests 0 .. chunk-1, the second on the test after them.
    assert nodes[0].sent[:chunk] == list(range(chunk))
    assert nodes[1].sent[0] == chunk
    assert chunk == 1 or len(nodes[0].sent) == chunk


def _simulated_wall(order_seconds, workers):
    """The seconds until the last of ``workers`` finishes, pytest-xdist's load scheduler
    handing out tests of these durations in this order (a worker runs a test once it holds
    the next one, or is told to stop, as xdist's workers do)."""
    scheduler, nodes = _scheduler(workers, len(order_seconds))
    clock, running, done = 0.0, {}, 0
    while done < len(order_seconds):
        for node in nodes:
            queue = scheduler.node2pending[node]
            if node not in running and queue and (len(queue) > 1 or node.shutting_down):
                running[node] = (clock + order_seconds[queue[0]], queue[0])
        node = min(running, key=lambda each: running[each][0])
        clock, index = running.pop(node)
        scheduler.mark_test_complete(node, index, order_seconds[index])
        done += 1
    return clock


def _main_job_items():
    from pytest_pallas.plugin.conformance_order import typical_seconds

    return [SimpleNamespace(nodeid=f"conformance/x.py::{name}", name=name,
                            originalname=name.partition("[")[0])
            for name in sorted(typical_seconds())]


@pytest.mark.parametrize("workers", [4, 8, 16])
def test_the_main_job_on_many_workers_ends_near_its_longest_test(workers):
    """Longest first, xdist's first chunk of two would hand one worker the two longest
    tests; dealt out, the simulated run ends within 20% of the best any order could do
    (its longest test, or its seconds shared evenly, whichever is more)."""
    from pytest_pallas.plugin.conformance_order import (
        balanced_first_chunks,
        first_chunk_size,
        longest_first,
        typical_seconds,
    )

    typical = typical_seconds()
    items = _main_job_items()
    assert len(items) == 46
    ordered = longest_first(items, {}, lambda item: True, typical)
    dealt = balanced_first_chunks(ordered, lambda item: typical[item.name], workers,
                                  first_chunk_size(len(items), workers, None))
    assert sorted(item.name for item in dealt) == sorted(item.name for item in ordered)
    best = max(max(typical.values()), sum(typical.values()) / workers)
    longest_first_wall = _simulated_wall([typical[i.name] for i in ordered], workers)
    dealt_wall = _simulated_wall([typical[i.name] for i in dealt], workers)
    assert dealt_wall <= 1.2 * best, (dealt_wall, best)
    if workers == 16:
        assert longest_first_wall > 1.5 * best  # what the dealing mends


def test_every_packaged_conformance_test_has_a_typical_time():
    """A new op or property without one would be ordered as never timed in a fresh clone:
    rerun benchmarks/main_job_durations.py --typical (its docstring says how)."""
    from pytest_pallas.ops.builtins import BUILT_IN
    from pytest_pallas.plugin.conformance_order import typical_seconds

    names = set(typical_seconds())
    properties = {name.partition("[")[0] for name in names}
    assert properties == {"test_value", "test_written_and_deterministic", "test_vmap"}
    expected = {f"{test}[{op.name}]" for op in BUILT_IN
                for test in ("test_value", "test_written_and_deterministic")}
    expected |= {f"test_vmap[{op.name}]" for op in BUILT_IN if op.vmap}
    assert names == expected


def test_a_run_on_workers_keeps_each_conformance_tests_time_for_the_next(pytester):
    pytester.makeini("[pytest]\n")
    result = pytester.runpytest_subprocess(*SUITE, "-n", "2", "--junitxml=junit.xml",
                                           timeout=400)
    assert result.ret == 0, result.stdout.str()[-3000:]
    stored = json.loads((pytester.path / ".pytest_cache" / "v" / "pallas" /
                         "conformance-seconds").read_text())
    assert {nodeid.rpartition("::")[2] for nodeid in stored} == {
        f"test_value[{op}]" for op in ("add", "copy", "softmax", "sum")}
    assert all(seconds > 0 for seconds in stored.values())
    # The times stay out of the test reports: JUnit XML's properties among them.
    junit = (pytester.path / "junit.xml").read_text()
    assert "test_value" in junit and "pallas_conformance_seconds" not in junit

    # The next run deals the two longest to different workers. xdist sends each of the two
    # workers two consecutive tests first; taken longest first, the two longest would share
    # one (a worker's own --dist is "no": the controller's must reach it).
    longest = sorted(stored)
    seconds = dict(zip(longest, (40.0, 30.0, 20.0, 10.0)))
    (pytester.path / ".pytest_cache" / "v" / "pallas" / "conformance-seconds").write_text(
        json.dumps(seconds))
    result = pytester.runpytest_subprocess(*SUITE, "-n", "2", "-v", "-p", "no:randomly",
                                           timeout=400)
    assert result.ret == 0, result.stdout.str()[-3000:]
    worker_of = {match.group(2): match.group(1) for match in re.finditer(
        r"\[(gw\d+)\].* PASSED \S*::(test_value\[\w+\])", result.stdout.str())}
    first, second = (nodeid.rpartition("::")[2] for nodeid in longest[:2])
    assert len(worker_of) == 4 and worker_of[first] != worker_of[second], worker_of
