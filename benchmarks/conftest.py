"""pytest-benchmark suites of the reference kernels, and of yours beside them.

    pytest benchmarks --benchmark-only                       # small sizes, interpreted on the CPU
    pytest benchmarks --benchmark-only --pallas-tpu          # the seed sizes, compiled for the TPU
    pytest benchmarks --benchmark-only --pallas-impl matmul=my_kernels:matmul

The modules are named ``bench_<family>.py`` and their functions ``bench_*``:
this conftest collects them, so they run only when ``benchmarks`` is named on
the command line, never in the project's ``pytest`` run (``testpaths = tests``).

With ``--pallas-impl OP=MODULE:ATTR`` only the benchmarks of those ops run,
each twice: ``[reference]`` and ``[user]``.

On the CPU, XLA runs single-threaded (the plugin does that for every run of
``pallas_benchmark``; see docs/benchmarks.md), a run that includes a
multi-device benchmark (marked ``devices(n)``) keeps to one core, and the fixture
times in process CPU time unless ``--benchmark-timer`` is given: together they
keep the kernel/XLA ratio of a run independent of the runner's cores and
neighbours.

``--bench-slowdown OP=FACTOR`` makes each benchmarked call of OP's kernels run
the kernel FACTOR times in a row: a known regression, to check that the gate
(``python -m pytest_pallas.benchmark_gate``) catches it. See regression_study.py.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import pytest

from pytest_pallas.bench.table import request_single_threaded_xla
from pytest_pallas.ops.registry import OP_NAMES, get_operation
from pytest_pallas.plugin.run_state import benchmark_run

BENCHMARKS_DIRECTORY = os.path.dirname(os.path.abspath(__file__))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bench-slowdown", metavar="OP=FACTOR", action="append", default=[],
        help="run OP's kernel FACTOR times per benchmarked call (an injected regression, for "
        "checking the benchmark gate); repeatable.",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "bench_op(name): the contract op a benchmark measures (see benchmarks/).")
    # Benchmarks are ``bench_*`` functions in ``bench_*.py`` files (see pytest_collect_file).
    config.addinivalue_line("python_functions", "bench_*")
    _slowdowns(config)  # a malformed flag is a usage error before collection
    if not config.getoption("--pallas-tpu", default=False):
        # The plugin does this at collection; every test here is a benchmark, so do it now,
        # before a Pallas flag (--pallas-impl) has the plugin start JAX at configure time.
        request_single_threaded_xla(benchmark_run(config))


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.getoption("--pallas-tpu", default=False):
        return
    multi_device = [item for item in session.items
                    if _in_benchmarks(item.path) and item.get_closest_marker("devices")]
    if multi_device and hasattr(os, "sched_setaffinity"):
        # One core for this process and the threads it starts later (JAX's among them,
        # created at the first benchmark): the simulated devices of a multi-device kernel
        # are Python threads taking turns at the GIL, and spread over several cores they
        # spend a share of their CPU time handing it over that varies from run to run.
        # Only then: a single-device run does better free to move to an idle core.
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def pytest_collect_file(file_path, parent):
    # Files named on the command line are collected by pytest itself.
    if (file_path.suffix == ".py" and file_path.name.startswith("bench_")
            and not parent.session.isinitpath(file_path)):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def _in_benchmarks(path) -> bool:
    return os.path.dirname(os.path.abspath(str(path))) == BENCHMARKS_DIRECTORY


# --- which implementations run ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Implementation:
    """A kernel of ``op``: the project's reference or the user's ``--pallas-impl``."""

    op_name: str
    label: str
    target: str

    def load(self) -> Callable:
        from pytest_pallas.plugin import implementations

        if self.label == "reference":
            return get_operation(self.op_name).load_reference()
        return implementations.resolve(self.target,
                                       flag=f"--pallas-impl {self.op_name}={self.target}")

    @property
    def description(self) -> str:
        return "reference" if self.label == "reference" else f"user: {self.target}"


def _user_targets(config: pytest.Config) -> dict[str, str]:
    from pytest_pallas.plugin import implementations

    return dict(implementations.parse_impl_flags(config.getoption("--pallas-impl")))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "implementation" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("bench_op")
    if marker is None or marker.args[0] not in OP_NAMES:
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid}: a benchmark taking 'implementation' needs "
            f"@pytest.mark.bench_op(OP) with OP one of {', '.join(OP_NAMES)}")
    op = marker.args[0]
    choices = [Implementation(op, "reference", get_operation(op).reference)]
    user = _user_targets(metafunc.config).get(op)
    if user is not None:
        choices.append(Implementation(op, "user", user))
    metafunc.parametrize("implementation", choices, ids=[c.label for c in choices])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With --pallas-impl, keep only the benchmarks that compare the user's ops with ours."""
    user_ops = _user_targets(config)
    if not user_ops:
        return
    keep, drop = [], []
    for item in items:
        if not _in_benchmarks(item.path):
            keep.append(item)  # not ours to judge (the conformance suite, say)
            continue
        callspec = getattr(item, "callspec", None)
        chosen = callspec.params.get("implementation") if callspec else None
        (keep if chosen is not None and chosen.op_name in user_ops else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def kernel(implementation: Implementation, request: pytest.FixtureRequest) -> Callable:
    """The implementation's callable, slowed down if --bench-slowdown names its op."""
    function = implementation.load()
    factor = _slowdowns(request.config).get(implementation.op_name, 1)
    return repeated(function, factor) if factor > 1 else function


@pytest.fixture
def scale(pallas_benchmark) -> str:
    """``"tpu"`` for the seed material's sizes (compiled on a TPU), ``"cpu"`` for small ones."""
    return "tpu" if pallas_benchmark.backend.is_tpu else "cpu"


def _slowdowns(config: pytest.Config) -> dict[str, int]:
    factors = {}
    for value in config.getoption("--bench-slowdown", default=[]) or []:
        op, _, factor = value.partition("=")
        if op not in OP_NAMES or not factor.isdigit() or int(factor) < 1:
            raise pytest.UsageError(
                f"--bench-slowdown {value!r}: write OP=FACTOR, OP one of {', '.join(OP_NAMES)} "
                "and FACTOR a whole number >= 1, e.g. --bench-slowdown softmax=2.")
        factors[op] = int(factor)
    return factors


def repeated(function: Callable, factor: int) -> Callable:
    """``function`` run ``factor`` times per call, each run after the previous one's result.

    The optimisation barrier ties each run's operands to the previous result, so
    XLA can neither merge the identical calls nor drop the unused ones.
    """
    import jax

    def slowed(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        for _ in range(factor - 1):
            args, _ = jax.lax.optimization_barrier((args, result))
            result = function(*args, **kwargs)
        return result

    slowed.__name__ = f"{getattr(function, '__name__', 'kernel')}_x{factor}"
    return slowed
