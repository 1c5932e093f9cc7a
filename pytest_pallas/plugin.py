"""pytest hooks, options and fixtures of pytest-pallas. No kernel logic lives here.

Loaded in every pytest run of an environment where the package is installed,
so it imports nothing heavy: JAX is imported only when a test uses Pallas.
"""

from __future__ import annotations

import sys

import pytest

from . import options as options_module
from .session import (
    CONFORMANCE_DIRECTORY,
    FIXTURE_NAMES,
    MARKERS,
    PallasSession,
    conformance_op,
    device_shortfall,
    is_conformance_item,
)

_SESSION = pytest.StashKey[PallasSession]()


def pytest_addoption(parser: pytest.Parser) -> None:
    options_module.add_options(parser)
    parser.addini(
        "pallas_scope", default="marked",
        help="'marked' (default): only tests with a pallas marker or fixture run in the Pallas "
        "backend; 'all': every test does.",
    )


def _session(config: pytest.Config) -> PallasSession:
    return config.stash[_SESSION]


def pytest_configure(config: pytest.Config) -> None:
    for spec, description in MARKERS.items():
        config.addinivalue_line("markers", f"{spec}: {description}")
    parsed = options_module.parse_options(config)
    scope = config.getini("pallas_scope") or "marked"
    if scope not in ("marked", "all"):
        raise pytest.UsageError(f"ini option pallas_scope={scope!r} must be 'marked' or 'all'.")
    session = PallasSession(
        options=parsed,
        scope_all=scope == "all",
        invocation=tuple(config.invocation_params.args),
    )
    config.stash[_SESSION] = session
    if not parsed.tpu and (parsed.session_opted_in or parsed.devices_requested):
        # The device count must be fixed before JAX creates its CPU client.
        session.ensure_devices()
    if parsed.session_opted_in:
        # --pallas-tpu without a TPU must stop here, before collection (exit 4).
        session.backend  # noqa: B018
    if parsed.conformance or parsed.implementations:
        _configure_conformance(config, session)


def _configure_conformance(config: pytest.Config, session: PallasSession) -> None:
    from . import implementations
    from .conformance_harness import bind_implementations, selected_ops
    from .report import ConformanceRecorder

    user_targets = dict(session.options.implementations)
    session.conformance_ops = selected_ops(session.options.ops, tuple(user_targets))
    session.implementations = bind_implementations(
        user_targets,
        lambda target, op: implementations.resolve(target, flag=f"--pallas-impl {op}={target}"),
        session.conformance_ops,
    )
    session.recorder = ConformanceRecorder()
    # Before the suite is imported: its secondary properties size themselves on the profile.
    _load_hypothesis_profile(session)
    # The suite is part of the install, so it runs from any directory. Given
    # no paths, pytest would also collect the current directory: only paths
    # the user named are collected beside the suite.
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = [CONFORMANCE_DIRECTORY]
    elif CONFORMANCE_DIRECTORY not in config.args:
        config.args.append(CONFORMANCE_DIRECTORY)


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    session = _session(config)
    if session.options.session_opted_in or session.scope_all:
        return [session.header()]
    return None


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    pallas = _session(config)
    _deselect_conformance_ops(pallas, config, items)
    ours = [item for item in items if pallas.uses_pallas(item)]
    if not ours:
        return
    _load_hypothesis_profile(pallas)


def _load_hypothesis_profile(pallas: PallasSession) -> None:
    from hypothesis import settings

    from .strategies import register_profiles

    register_profiles()
    profile = f"pallas-{pallas.options.profile}"
    if pallas.options.examples is not None:
        settings.register_profile(
            "pallas-cli", parent=settings.get_profile(profile),
            max_examples=pallas.options.examples,
        )
        profile = "pallas-cli"
    settings.load_profile(profile)


def _deselect_conformance_ops(pallas: PallasSession, config: pytest.Config,
                              items: list[pytest.Item]) -> None:
    conformance_items = [item for item in items if is_conformance_item(item)]
    if not conformance_items:
        return
    if pallas.recorder is None:
        raise pytest.UsageError(
            "the conformance suite was collected without --pallas-conformance; "
            "run `pytest --pallas-conformance` (optionally with --pallas-impl/--pallas-ops)."
        )
    keep, drop = [], []
    for item in items:
        op = conformance_op(item) if is_conformance_item(item) else None
        (drop if op is not None and op not in pallas.conformance_ops else keep).append(item)
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
            pytest.skip(reason)
        pallas.activate(item)
        _seed_hypothesis(pallas, item)


def _seed_hypothesis(pallas: PallasSession, item: pytest.Item) -> None:
    """The same --pallas-seed and test id give the same examples, on any worker.

    Seeded just before the item runs: parametrized items share one function, so a seed
    set at collection would be the last item's; a method's ``obj`` is a bound method, which
    takes no attributes, so the seed goes on the function behind it.
    """
    function = getattr(item, "obj", None)
    function = getattr(function, "__func__", function)
    if getattr(function, "is_hypothesis_test", False):
        from hypothesis import seed, settings

        if not hasattr(function, "_hypothesis_internal_settings_applied"):
            # @given took the settings profile loaded when the module was imported, before
            # the plugin knew the test was ours; a test without its own @settings gets ours.
            function._hypothesis_internal_use_settings = settings.default
        seed(pallas.key_seed(item.nodeid))(function)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    __tracebackhide__ = True
    pallas = _session(item.config)
    if not pallas.uses_pallas(item):
        return (yield)
    from .timeout import KernelTimeout, Watchdog

    seconds = 0.0 if pallas.item_backend(item).is_tpu else pallas.options.timeout_seconds
    with Watchdog(seconds, f"a kernel in {item.nodeid}") as watchdog:
        try:
            result = yield
        except BaseException as error:
            if watchdog.fired and not isinstance(error, KernelTimeout):
                raise KernelTimeout(watchdog.message) from error
            _raise_as_tpu_rule(error)
            raise
    if watchdog.fired:
        raise KernelTimeout(watchdog.message)
    pallas.check_kernel_exits(item)
    return result


def _raise_as_tpu_rule(error: BaseException) -> None:
    """Re-raise an interpreter error that is a TPU rule (revisited block, ...) as one."""
    __tracebackhide__ = True
    if not isinstance(error, Exception):
        return
    from .tpu_checks import TpuRuleViolation, translate_interpreter_error

    if isinstance(error, TpuRuleViolation):
        return
    violation = translate_interpreter_error(error)
    if violation is not None:
        raise violation from error


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem):
    try:
        return (yield)
    finally:
        _session(item.config).deactivate(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    pallas = _session(item.config)
    if report.failed and call.when == "call" and pallas.uses_pallas(item):
        report.sections.append((
            "pallas",
            f"seed {pallas.options.seed}; reproduce with:\n  {pallas.reproduce_command(item.nodeid)}",
        ))
    return report


def pytest_sessionstart(session: pytest.Session) -> None:
    pallas = _session(session.config)
    if pallas.recorder is not None and pallas.options.report_path and _is_controller(session.config):
        _write_report(session.config, complete=False)


# pytest-xdist's hook: optional, or pytest rejects the plugin where xdist is not installed.
@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    # pytest-xdist: each worker sends what it recorded; the controller merges.
    data = getattr(node, "workeroutput", {}).get("pallas_conformance")
    pallas = _session(node.config)
    if data and pallas.recorder is not None:
        pallas.recorder.merge(data)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    pallas = _session(session.config)
    if pallas.recorder is None:
        return
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["pallas_conformance"] = pallas.recorder.to_dict()
        return
    if pallas.options.report_path:
        interrupted = exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR)
        _write_report(session.config, complete=not interrupted and not session.shouldstop)


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def _write_report(config: pytest.Config, *, complete: bool) -> None:
    from .report import environment_facts, write_json_atomically

    pallas = _session(config)
    backend = pallas._backend
    document = pallas.recorder.document(complete=complete,
                                        environment=environment_facts(backend))
    document["seed"] = pallas.options.seed
    document["ops_selected"] = list(pallas.conformance_ops)
    write_json_atomically(pallas.options.report_path, document)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    from .benchmarking import terminal_summary as benchmark_summary

    benchmark_summary(terminalreporter, config)
    pallas = _session(config)
    if pallas.recorder is None or not pallas.recorder.ops:
        return
    terminalreporter.write_sep("=", "pallas conformance")
    for line in pallas.recorder.summary_lines():
        terminalreporter.write_line(line)
    terminalreporter.write_line(
        "worst/tol: the worst error seen, in units of the tolerance (<= 1 passes)"
    )
    if pallas.options.report_path:
        terminalreporter.write_line(f"report written to {pallas.options.report_path}")


# --- fixtures -----------------------------------------------------------------


@pytest.fixture
def pallas_backend(request: pytest.FixtureRequest):
    """The backend this test's kernels run on: platform, chip and its facts, interpreter params.

    Example::

        def test_fits_vmem(pallas_backend):
            assert my_block_bytes() < pallas_backend.tpu_info.vmem_capacity_bytes
    """
    return _session(request.config).item_backend(request.node)


@pytest.fixture
def pallas_key(request: pytest.FixtureRequest):
    """A ``jax.random`` key derived from ``--pallas-seed`` and the test id."""
    import jax

    return jax.random.key(_session(request.config).key_seed(request.node.nodeid))


@pytest.fixture
def device_mesh(request: pytest.FixtureRequest):
    """A factory: ``device_mesh(n, axis_name="x")`` is a 1-D ``jax.sharding.Mesh`` of n devices.

    Skips the test, saying why, when fewer than n devices are available.
    """
    import jax
    import numpy as np

    backend = _session(request.config).item_backend(request.node)

    def make(count: int, axis_name: str = "x") -> jax.sharding.Mesh:
        devices = jax.devices("tpu" if backend.is_tpu else "cpu")
        if count > len(devices):
            pytest.skip(device_shortfall(count, backend))
        return jax.sharding.Mesh(np.array(devices[:count]), (axis_name,))

    return make


@pytest.fixture
def pallas_benchmark(request: pytest.FixtureRequest, benchmark):
    """pytest-benchmark's ``benchmark`` for kernels: compile excluded, XLA timed beside, roofline.

    Example::

        def test_speed(pallas_benchmark):
            x = pallas_benchmark.random((1024, 1024))
            pallas_benchmark("softmax", my_softmax, x)

    See ``pytest_pallas.benchmarking.PallasBenchmark`` for what lands in ``extra_info``.
    """
    from .benchmarking import PallasBenchmark

    pallas = _session(request.config)
    return PallasBenchmark.for_test(request, benchmark, pallas.item_backend(request.node),
                                    pallas.key_seed(request.node.nodeid))


@pytest.fixture
def conformance(request: pytest.FixtureRequest):
    """The conformance harness: draws inputs for an op and checks the chosen implementation."""
    from .conformance_harness import Conformance

    pallas = _session(request.config)
    if pallas.recorder is None:
        pytest.skip("conformance tests run with --pallas-conformance")
    return Conformance(pallas.implementations, pallas.item_backend(request.node), pallas.recorder,
                       interpreter_chosen=pallas.options.interpreter_given
                       or bool(request.config.getini("pallas_interpret"))
                       or pallas.options.detect_races)


assert set(FIXTURE_NAMES) == {"pallas_backend", "pallas_key", "device_mesh", "pallas_benchmark"}, (
    "fixtures drifted")
_ = sys  # the module must stay importable without JAX; see tests/test_startup.py
