"""pytest's entry point to pytest-pallas: its hooks, options and fixtures. Each hook hands off
in a line or a few to the object or module that owns the work: start-up (``startup``),
collection (``collection``), one test (``test_protocol``), pytest-xdist's workers
(``worker_events``), the run's records and end (``run_records``), the header (``header``).

Loaded in every pytest run of an environment where the package is installed, so it imports
nothing heavy: JAX is imported only when a test uses Pallas.
"""

from __future__ import annotations

import pytest

from . import (
    collection,
    header,
    hookspecs,
    options,
    run_records,
    startup,
    test_protocol,
    worker_events,
)
from .fixtures import (  # noqa: F401  (pytest finds the plugin's fixtures here)
    conformance,
    device_mesh,
    pallas_backend,
    pallas_benchmark,
    pallas_key,
)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


# A wrapper: it runs before every plain pytest_cmdline_main, pytest-xdist's (tryfirst) among
# them, which turns -n into workers.
@pytest.hookimpl(wrapper=True)
def pytest_cmdline_main(config: pytest.Config):
    startup.before_configure(config)
    return (yield)


def pytest_configure(config: pytest.Config) -> None:
    startup.configure(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    startup.unconfigure(config)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    report = yield
    collection.collected(collector, report)
    return report


def pytest_itemcollected(item: pytest.Item) -> None:
    collection.item_collected(item)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    collection.modify_items(config, items)


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    return header.report_header(config)


def pytest_report_collectionfinish(config: pytest.Config) -> list[str] | None:
    return header.collection_finish_lines(config)


# A plain hook, not a wrapper: a skip raised before a wrapper's yield would stop the other
# plugins' setup (logging's among them), whose teardown then fails with a KeyError.
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    test_protocol.setup(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    __tracebackhide__ = True
    return (yield from test_protocol.call(item))


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem):
    return (yield from test_protocol.teardown(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    return (yield from test_protocol.make_report(item, call))


@pytest.hookimpl(wrapper=True)
def pytest_sessionstart(session: pytest.Session):
    return (yield from run_records.session_start(session))


# A wrapper, tryfirst: before pytest-benchmark's own wrapper saves its results, and before the
# terminal summary, which says why the conformance report is incomplete.
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus):
    run_records.session_finish(session, exitstatus)
    return (yield)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    run_records.terminal_summary(terminalreporter, config)


# pytest-xdist's and pytest-benchmark's hooks: optional, or pytest rejects the plugin where
# they are not installed.
@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    worker_events.configure_node(node)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    worker_events.node_down(node, error)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched) -> None:
    worker_events.crashed_item(crashitem, report)


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config: pytest.Config, benchmarks, output_json) -> None:
    run_records.benchmark_json(config, output_json)
