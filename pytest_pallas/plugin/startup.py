"""The plugin's start-up and end, in the order JAX's start-up needs: before pytest configures
(JAX's processes joined, pytest-xdist's worker count chosen), at configure (the ops of
conftests, the options, the session, what a Pallas flag asks for before JAX starts), and at
unconfigure (what the run changed, undone).

Each step is a function named for what it does; the plugin's hooks call ``before_configure``,
``configure`` and ``unconfigure``, and nothing else here.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from ..suite.membership import CONFORMANCE_DIRECTORY
from . import options as options_module
from . import run_records
from .chips import ChipTally
from .hypothesis_settings import load_hypothesis_profile
from .implementations import resolve_all
from .options import RESUME_ENV, report_directory_to_create
from .persistent_cache import register
from .processes import configure as configure_processes
from .processes import worker_process
from .run_state import benchmark_run, run_state
from .session import MARKERS, SESSION_KEY, PallasSession


def before_configure(config: pytest.Config) -> None:
    """Before every plain ``pytest_cmdline_main`` (pytest-xdist's turns ``-n`` into workers):
    JAX's processes and a TPU slice's hosts joined, the workers' count chosen."""
    option = config.option
    processes = option.pallas_processes or worker_process()
    if processes:
        configure_processes(config)  # before pytest_configure: JAX joins the other processes
    if option.pallas_tpu and not hasattr(config, "workerinput"):
        from .tpu_slice import configure as configure_slice

        configure_slice(config)  # several hosts of a slice: join them before JAX starts
    if option.pallas_tpu or option.pallas_gpu:
        from .workers import one_device_per_worker

        one_device_per_worker(config)
    elif (option.pallas_conformance or option.pallas_impl or option.pallas_ops) and not processes:
        from .workers import set_default_workers

        set_default_workers(config)  # N processes take no -n


def configure(config: pytest.Config) -> PallasSession:
    """The run's session, made and set up in the order JAX's start-up needs."""
    _declare_markers(config)
    if RESUME_ENV in os.environ:  # this pytest replaces one whose test was stuck
        from .stuck_tests import resume

        resume(config)
    _register_operations(config)  # before the options: --pallas-impl and --pallas-ops name ops
    session = _make_session(config)
    if run_records.is_controller(config):
        _register_run_plugins(config, session)
    if session.options.session_opted_in:
        _configure_opted_in(config, session)
    else:
        _configure_without_a_flag(session)
    return session


def unconfigure(config: pytest.Config) -> None:
    """What the run changed, undone: the ops it registered, the suite's per-session state,
    the stuck tests' folder, JAX's platforms, the Hypothesis profile."""
    state = run_state(config)
    if state.operations_registered:
        from ..ops.registry import unregister_all

        unregister_all()
    if state.conformance_ran:
        from ..suite.harness import forget_session_state

        forget_session_state()
    if state.stuck_tests_folder is not None:
        from .stuck_tests import remove_folder

        remove_folder(config)
    session = config.stash.get(SESSION_KEY, None)
    if session is None:
        return
    session.undo_keep_jax_on_cpu()
    if session.hypothesis_profile_before is not None:
        from hypothesis import settings

        settings.load_profile(session.hypothesis_profile_before)


# --- the steps ------------------------------------------------------------------------------


def _declare_markers(config: pytest.Config) -> None:
    for spec, description in MARKERS.items():
        config.addinivalue_line("markers", f"{spec}: {description}")


def _register_operations(config: pytest.Config) -> None:
    """The ops of ``pytest_pallas_operations`` hooks join the registry."""
    if not config.hook.pytest_pallas_operations.get_hookimpls():
        return  # no op of a conftest or plugin: the registry is not even imported
    from ..ops import registry
    from ..ops.operation import OperationError

    run_state(config).operations_registered = True
    try:
        for returned in config.hook.pytest_pallas_operations(config=config):
            for operation in returned or ():
                registry.register(operation)
    except OperationError as error:
        raise pytest.UsageError(f"pytest_pallas_operations: {error}") from None


def _make_session(config: pytest.Config) -> PallasSession:
    parsed = options_module.parse_options(config)
    one_device_worker = False
    if hasattr(config, "workerinput") and parsed.compiled:
        from .workers import take_this_workers_device

        take_this_workers_device(config)  # before JAX starts: one device per worker
        one_device_worker = True
    scope = config.getini("pallas_scope") or "marked"
    if scope not in ("marked", "all"):
        raise pytest.UsageError(f"ini option pallas_scope={scope!r} must be 'marked' or 'all'.")
    session = PallasSession(options=parsed, scope_all=scope == "all",
                            invocation=tuple(config.invocation_params.args),
                            one_device_worker=one_device_worker, run=run_state(config))
    config.stash[SESSION_KEY] = session
    return session


def _register_run_plugins(config: pytest.Config, session: PallasSession) -> None:
    """On the process that reports the run: what merges pytest-xdist workers' records, and
    the per-chip tally of a run of several chips."""
    config.pluginmanager.register(run_records.WorkerRecordsMerger(session),
                                  "pallas-worker-records")
    if session.options.several_chips:
        config.pluginmanager.register(ChipTally(session.options.chips), "pallas-chips")


def _configure_without_a_flag(session: PallasSession) -> None:
    """No Pallas flag: the plugin stays out of the way until a test asks for it (a marker, a
    fixture, a conformance class), as Hypothesis's plugin does."""
    if session.options.devices_requested:
        session.ensure_devices()  # before JAX creates its CPU client
    if session.options.report_path:
        session.recorder  # noqa: B018  (the report of a run that ran no conformance test says so)


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
        user_callables = resolve_all(parsed.implementations)
    if not parsed.compiled and config.getoption("--benchmark-only", default=False):
        # Before the backend below creates JAX's CPU client, which reads XLA_FLAGS (without
        # a Pallas flag, the collection of a pallas_benchmark test does it in time).
        from ..bench.table import request_single_threaded_xla

        request_single_threaded_xla(benchmark_run(config))
    # A controller of pytest-xdist workers compiles and runs nothing: it leaves JAX to them,
    # which start that much sooner.
    from .workers import hands_tests_to_workers

    distributed = hands_tests_to_workers(config)
    if parsed.compiled or not distributed:
        # --pallas-tpu without a TPU (--pallas-gpu without a GPU) stops here, before
        # collection (exit 4).
        session.backend  # noqa: B018
    if not distributed:
        register(config)  # compilations kept in pytest's cache directory across runs
    # Every run records what conformance tests it runs: the packaged suite's, and those of
    # a conformance_tests class in the user's own modules. With a Pallas flag the recorder
    # is made now (the report of a run that ran none says so); without one, by the first
    # conformance test that needs it (``PallasSession.recorder``).
    session.recorder  # noqa: B018
    if parsed.conformance:
        _configure_conformance(config, session, user_callables, distributed)


def _configure_conformance(config: pytest.Config, session: PallasSession,
                           user_callables: dict, distributed: bool) -> None:
    from .conformance_ops import bind_implementations, selected_ops

    user_targets = dict(session.options.implementations)
    session.conformance_ops = selected_ops(session.options.ops, tuple(user_targets))
    session.implementations = bind_implementations(user_targets, user_callables,
                                                   session.conformance_ops)
    if session.options.report_path and run_records.is_controller(config):
        session.run.report_directory_created = report_directory_to_create(
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
    path = os.path.abspath(os.path.join(str(invocation_dir), arg.partition("::")[0]))
    return os.path.commonpath([path, CONFORMANCE_DIRECTORY]) == CONFORMANCE_DIRECTORY
