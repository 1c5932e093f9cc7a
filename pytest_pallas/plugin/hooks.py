"""pytest hooks, options and fixtures of pytest-pallas. No kernel logic lives here.

Loaded in every pytest run of an environment where the package is installed,
so it imports nothing heavy: JAX is imported only when a test uses Pallas.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

import pytest

from .._compat.pytest_internals import skip_at_test, take_unittest_error
from ..suite.membership import (
    CONFORMANCE_DIRECTORY,
    conformance_op_name,
    is_conformance_item,
    is_packaged_conformance_item,
)
from . import options as options_module
from . import run_records, versions
from .chips import ChipTally, each_test_per_chip
from .fixtures import (  # noqa: F401  (pytest finds the plugin's fixtures here)
    conformance,
    device_mesh,
    pallas_backend,
    pallas_benchmark,
    pallas_key,
)
from .header import header_line
from .hypothesis_settings import (
    load_hypothesis_profile,
    restate_hypothesis_notes,
    restore_hypothesis_attributes,
    seed_hypothesis,
)
from .options import RESUME_ENV, WORKER_SEED_KEY
from .processes import worker_process as processes_worker
from .run_records import imported_attribute
from .session import MARKERS, SESSION_KEY, PallasSession, session_of


def pytest_addoption(parser: pytest.Parser) -> None:
    from .persistent_cache import add_ini_option

    options_module.add_options(parser)
    add_ini_option(parser)
    parser.addini(
        "pallas_scope", default="marked",
        help="'marked' (default): only tests with a pallas marker or fixture run in the Pallas "
        "backend; 'all': every test does.",
    )


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


_session = session_of


# A wrapper: it runs before every plain pytest_cmdline_main, pytest-xdist's (tryfirst) among
# them, which turns -n into workers.
@pytest.hookimpl(wrapper=True)
def pytest_cmdline_main(config: pytest.Config):
    option = config.option
    if option.pallas_processes or processes_worker():
        from .processes import configure as configure_processes

        configure_processes(config)  # before pytest_configure: JAX joins the other processes
    if option.pallas_tpu and not hasattr(config, "workerinput"):
        from .tpu_slice import configure as configure_slice

        configure_slice(config)  # several hosts of a slice: join them before JAX starts
    if option.pallas_tpu or option.pallas_gpu:
        from .workers import one_device_per_worker

        one_device_per_worker(config)
    elif ((option.pallas_conformance or option.pallas_impl or option.pallas_ops)
          and not (option.pallas_processes or processes_worker())):  # N processes, no -n
        from .workers import set_default_workers

        set_default_workers(config)
    return (yield)


def pytest_configure(config: pytest.Config) -> None:
    for spec, description in MARKERS.items():
        config.addinivalue_line("markers", f"{spec}: {description}")
    if RESUME_ENV in os.environ:  # this pytest replaces one whose test was stuck
        from .stuck_tests import resume

        resume(config)
    # The ops of conftests first: --pallas-impl and --pallas-ops may name them.
    _register_operations(config)
    parsed = options_module.parse_options(config)
    one_device_worker = False
    if hasattr(config, "workerinput") and parsed.compiled:
        from .workers import take_this_workers_device

        take_this_workers_device(config)  # before JAX starts: one device per worker
        one_device_worker = True
    scope = config.getini("pallas_scope") or "marked"
    if scope not in ("marked", "all"):
        raise pytest.UsageError(f"ini option pallas_scope={scope!r} must be 'marked' or 'all'.")
    session = PallasSession(
        options=parsed,
        scope_all=scope == "all",
        invocation=tuple(config.invocation_params.args),
        one_device_worker=one_device_worker,
    )
    config.stash[SESSION_KEY] = session
    run_records.remember_compiles_before(session)  # the compile summary counts this session's
    if run_records.is_controller(config):
        config.pluginmanager.register(run_records.WorkerRecordsMerger(session),
                                      "pallas-worker-records")
        if parsed.several_chips:
            config.pluginmanager.register(ChipTally(parsed.chips), "pallas-chips")
    if not parsed.session_opted_in:
        # No Pallas flag: the plugin stays out of the way until a test asks for it (a
        # marker, a fixture, a conformance class), as Hypothesis's plugin does.
        if parsed.devices_requested:
            # The device count must be fixed before JAX creates its CPU client.
            session.ensure_devices()
        if parsed.report_path:
            # The report of a run that ran no conformance test says so.
            session.recorder  # noqa: B018
        return
    _configure_opted_in(config, session)


def _configure_opted_in(config: pytest.Config, session: PallasSession) -> None:
    """The session setup a Pallas flag asks for, in the order JAX's start-up needs."""
    parsed = session.options
    if not parsed.compiled:
        # The device count must be fixed before JAX creates its CPU client (and before
        # the user's modules below are imported: they may make arrays at import).
        session.ensure_devices()
    # Before the backend and the suite import JAX (seconds): a mistake in --pallas-impl
    # is reported as fast as any other usage error.
    user_callables = {}
    if parsed.implementations:
        from .implementations import resolve_all

        user_callables = resolve_all(parsed.implementations)
    if not parsed.compiled and config.getoption("--benchmark-only", default=False):
        # Before the backend below creates JAX's CPU client, which reads XLA_FLAGS (without
        # a Pallas flag, the collection of a pallas_benchmark test does it in time).
        from ..bench.fixture import request_single_threaded_xla

        request_single_threaded_xla(config)
    # A controller of pytest-xdist workers compiles and runs nothing: it leaves JAX to them,
    # which start that much sooner.
    from .workers import hands_tests_to_workers

    distributed = hands_tests_to_workers(config)
    if parsed.compiled or not distributed:
        # --pallas-tpu without a TPU (--pallas-gpu without a GPU) stops here, before
        # collection (exit 4).
        session.backend  # noqa: B018
    if not distributed:
        from .persistent_cache import register

        register(config)  # compilations kept in pytest's cache directory across runs
    # Every run records what conformance tests it runs: the packaged suite's, and those of
    # a conformance_tests class in the user's own modules. With a Pallas flag the recorder
    # is made now (the report of a run that ran none says so); without one, by the first
    # conformance test that needs it (``PallasSession.recorder``).
    session.recorder  # noqa: B018
    if parsed.conformance:
        _configure_conformance(config, session, user_callables, distributed)


def _register_operations(config: pytest.Config) -> None:
    """The ops of ``pytest_pallas_operations`` hooks join the registry; then the op flags are
    checked against it."""
    if not config.hook.pytest_pallas_operations.get_hookimpls():
        return  # no op of a conftest or plugin: the registry is not even imported
    from ..ops import registry
    from ..ops.operation import OperationError

    try:
        for returned in config.hook.pytest_pallas_operations(config=config):
            for operation in returned or ():
                registry.register(operation)
    except OperationError as error:
        raise pytest.UsageError(f"pytest_pallas_operations: {error}") from None


def _configure_conformance(config: pytest.Config, session: PallasSession,
                           user_callables: dict, distributed: bool) -> None:
    from .conformance_ops import bind_implementations, selected_ops
    from .options import report_directory_to_create

    user_targets = dict(session.options.implementations)
    session.conformance_ops = selected_ops(session.options.ops, tuple(user_targets))
    session.implementations = bind_implementations(user_targets, user_callables,
                                                   session.conformance_ops)
    if session.options.report_path and run_records.is_controller(config):
        config.stash[run_records.REPORT_DIRECTORY_CREATED] = report_directory_to_create(
            session.options.report_path)
    if not distributed:
        # Before the suite is imported: its secondary properties size themselves on the
        # profile (pytest-xdist's workers each load it; their controller draws nothing).
        load_hypothesis_profile(session, config)
    # The suite is part of the install, so it runs from any directory. Given
    # no paths, pytest would also collect the current directory: only paths
    # the user named are collected beside the suite.
    # A path into the suite (a reproduce line's test id) selects from it: adding the whole
    # directory beside it would rerun every test of the op.
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = [CONFORMANCE_DIRECTORY]
    elif not any(_inside_suite(arg, config.invocation_params.dir) for arg in config.args):
        config.args.append(CONFORMANCE_DIRECTORY)


def _inside_suite(arg: str, invocation_dir: Any) -> bool:
    import os

    path = os.path.abspath(os.path.join(str(invocation_dir), arg.partition("::")[0]))
    return os.path.commonpath([path, CONFORMANCE_DIRECTORY]) == CONFORMANCE_DIRECTORY


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """A malformed Operation or @supports in a test module is a usage error, in one line; in a
    run of several chips, each Pallas test a collector yields comes once per chip (collected
    so: pytest counts and selects the copies, ``file.py::test_x[v6e]`` included)."""
    report = yield
    if report.failed:
        import re

        match = re.search(r"\b(?:OperationError|SupportsError): (.*)", str(report.longrepr))
        if match:
            raise pytest.UsageError(f"{collector.nodeid}: {match.group(1)}")
    pallas = _session(collector.config)
    if pallas.options.several_chips and report.passed:
        report.result[:] = each_test_per_chip(report.result, pallas.options.chips,
                                              pallas.uses_pallas)
    return report


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    session = _session(config)
    if session.header_shown:
        untested = versions.untested_jax_note()
        workers = imported_attribute("plugin.workers", "header_note")
        device_split = imported_attribute("plugin.workers", "device_split_note")
        workers_line = ((workers(config) if workers is not None else None)
                        or (device_split(config) if device_split is not None else None))
        return ([header_line(session)] + session.platform_lines()
                + ([workers_line] if workers_line else []) + ([untested] if untested else []))
    return None


def pytest_itemcollected(item: pytest.Item) -> None:
    pallas = _session(item.config)
    if (pallas.platform_decision is None and not pallas.options.compiled
            and pallas.uses_pallas(item)):
        # The first Pallas test: before anything starts JAX's backends (a later module may
        # make arrays when imported), keep JAX on the CPU.
        pallas.keep_jax_on_cpu()


def pytest_report_collectionfinish(config: pytest.Config) -> list[str] | None:
    """Where JAX runs, for a run whose header said nothing (no Pallas flag, Pallas tests)."""
    pallas = _session(config)
    if pallas.header_shown:
        return None  # the header said it
    return pallas.platform_lines() or None


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    pallas = _session(config)
    _deselect_conformance_ops(pallas, config, items)
    if not run_records.is_controller(config) and any(is_conformance_item(item) for item in items):
        from .conformance_order import order_for_workers

        items[:] = order_for_workers(config, items, is_conformance_item)
    ours = [item for item in items if pallas.uses_pallas(item)]
    if not ours:
        return
    if pallas.options.timeout_seconds and not pallas.options.compiled and not (
            hasattr(config, "workerinput") or config.option.pallas_processes):
        from .stuck_tests import arm

        arm(config)  # a test stuck inside XLA then ends its process, and the run goes on
    if not pallas.options.tpu:
        from ..checks.libtpu_environment import quiet_libtpu_environment_for

        # A Pallas test is going to run: before it starts JAX's backends, keep libtpu's
        # start-up warnings away. Never at load: a run without Pallas keeps its environment.
        quiet_libtpu_environment_for(pallas.options.libtpu)
    if not pallas.options.compiled and any(
            "pallas_benchmark" in getattr(item, "fixturenames", ()) for item in ours):
        from ..bench.fixture import request_single_threaded_xla

        request_single_threaded_xla(config)
    # The suite's own conformance properties are sized on the run's profile; another suite
    # keeps a profile its modules loaded.
    load_hypothesis_profile(pallas, config, collected=not any(
        is_conformance_item(item) for item in items))


def pytest_unconfigure(config: pytest.Config) -> None:
    unregister_all = imported_attribute(
        "ops.registry", "unregister_all"
    )  # nothing registered if never imported
    if unregister_all is not None:
        unregister_all()
    forget_judged = imported_attribute("suite.harness", "forget_session_state")
    if forget_judged is not None:
        forget_judged()
    remove_stuck_tests_folder = imported_attribute("plugin.stuck_tests", "remove_folder")
    if remove_stuck_tests_folder is not None:
        remove_stuck_tests_folder(config)
    pallas = config.stash.get(SESSION_KEY, None)
    if pallas is not None:
        pallas.undo_keep_jax_on_cpu()
    if pallas is not None and pallas.hypothesis_profile_before is not None:
        from hypothesis import settings

        settings.load_profile(pallas.hypothesis_profile_before)


def _deselect_conformance_ops(pallas: PallasSession, config: pytest.Config,
                              items: list[pytest.Item]) -> None:
    conformance_items = [item for item in items if is_packaged_conformance_item(item)]
    if not conformance_items:
        return
    if not (pallas.options.conformance or pallas.options.implementations):
        raise pytest.UsageError(
            "the conformance suite was collected without --pallas-conformance; "
            "run `pytest --pallas-conformance` (optionally with --pallas-impl/--pallas-ops)."
        )
    keep, drop = [], []
    for item in items:
        op_name = conformance_op_name(item) if is_packaged_conformance_item(item) else None
        selected = op_name is None or op_name in pallas.conformance_ops
        (keep if selected else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# A plain hook, not a wrapper: a skip raised before a wrapper's yield would stop the other
# plugins' setup (logging's among them), whose teardown then fails with a KeyError.
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    pallas = _session(item.config)
    if pallas.uses_pallas(item):
        reason = pallas.skip_reason(item)
        if reason:
            skip_at_test(reason)  # reported at the test, as a skipif mark is
        pallas.open_kernel_run(item)
        seed_hypothesis(pallas, item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    __tracebackhide__ = True
    pallas = _session(item.config)
    if not pallas.uses_pallas(item):
        return (yield)
    run = pallas.kernel_run(item)
    run.begin_call()
    with run.watchdog(on_stuck=functools.partial(_end_stuck_test, item)) as watchdog:
        try:
            result = yield
            # A unittest.TestCase test records its error instead of raising it.
            recorded = take_unittest_error(item)
            if recorded is not None:
                raise recorded
        except BaseException as error:
            if isinstance(error, Exception):
                # A TestCase's recorded error is its failure, also where the call raised
                # after it (JAX's suites turn an unraisable exception into an error).
                error = take_unittest_error(item) or error
            restate_hypothesis_notes(item, error)
            return run.after_failure(error, watchdog)  # raises, skips or reruns
    run.after_success(watchdog)
    return result


def _end_stuck_test(item: pytest.Item, text: str, seconds: float) -> None:
    from .stuck_tests import end_stuck_test

    end_stuck_test(item, text, seconds)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem):
    try:
        return (yield)
    finally:
        restore_hypothesis_attributes(item)
        _session(item.config).close_kernel_run(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    pallas = _session(item.config)
    run_records.send_worker_records(item, call, report)
    if report.failed and call.when == "call" and pallas.uses_pallas(item):
        report.sections.append(("pallas", pallas.failure_section(item, call, report)))
    return report


@pytest.hookimpl(wrapper=True)
def pytest_sessionstart(session: pytest.Session):
    pallas = _session(session.config)
    if (pallas.recording and pallas.options.report_path
            and run_records.is_controller(session.config)):
        run_records.write_report(session.config, complete=False)
    result = yield  # pytest-xdist's own (trylast) sessionstart launches the workers here
    if pallas.options.session_opted_in and "hypothesis" not in sys.modules:
        from .workers import hands_tests_to_workers, import_hypothesis_while_workers_start

        if hands_tests_to_workers(session.config):
            import_hypothesis_while_workers_start()
    return result


# pytest-xdist's hooks: optional, or pytest rejects the plugin where xdist is not installed.
@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    pallas = _session(node.config)
    if error is not None and _ended_for_a_stuck_test(node.config, node.gateway.id):
        return  # not a crash: the test's failure comes in its place (pytest_handlecrashitem)
    if pallas.recording and error is not None:
        pallas.incomplete_reasons.append(
            f"pytest-xdist worker {node.gateway.id} crashed ({str(error).strip()})")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """A worker draws with the controller's seed: the one the header prints and a failure's
    reproduce line gives (left to itself, each worker would pick its own at random); and it
    orders the conformance tests for the controller's ``--dist``."""
    from .conformance_order import worker_input

    pallas = _session(node.config)
    node.workerinput[WORKER_SEED_KEY] = pallas.options.seed
    node.workerinput.update(worker_input(node.config))
    if pallas.options.timeout_seconds and not pallas.options.compiled:
        from .stuck_tests import FOLDER_KEY, folder_for_workers

        node.workerinput[FOLDER_KEY] = folder_for_workers(node.config)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched) -> None:
    # The report pytest-xdist makes for the crashed test carries its worker, hence the config.
    node = getattr(report, "node", None)
    config = getattr(node, "config", None)
    pallas = _session(config) if config is not None else None
    if pallas is None:
        return
    if _ended_for_a_stuck_test(config, node.gateway.id):
        from .stuck_tests import take_stuck_test

        if take_stuck_test(config, node.gateway.id, crashitem, report):
            return  # not a crash: the report is now the test's failure
    if pallas.recording:
        pallas.incomplete_reasons.append(f"{crashitem} crashed its worker and has no verdict")


def _ended_for_a_stuck_test(config: pytest.Config, worker: str) -> bool:
    ended = imported_attribute("plugin.stuck_tests", "ended_for_a_stuck_test")
    return ended is not None and ended(config, worker)


# A wrapper, tryfirst: before pytest-benchmark's own wrapper saves its results, and before the
# terminal summary, which says why the conformance report is incomplete.
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus):
    withhold_interrupted_run = imported_attribute("bench.table", "withhold_interrupted_run")
    if withhold_interrupted_run is not None:
        withhold_interrupted_run(session.config, exitstatus)
    run_records.finish_conformance_report(session, exitstatus)
    return (yield)


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config: pytest.Config, benchmarks, output_json) -> None:
    from ..bench.table import mark_completeness

    mark_completeness(config, output_json)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    benchmark_summary = imported_attribute("bench.table", "terminal_summary")
    if benchmark_summary is not None:
        benchmark_summary(terminalreporter, config)
    run_records.write_terminal_summary(_session(config), terminalreporter, config)
