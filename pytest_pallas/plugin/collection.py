"""What the plugin does to collection: an op record's mistake is a usage error, each Pallas
test comes once per chip in a run of several, JAX stays on the CPU from the first Pallas test
on, the conformance suite's ops are selected and ordered, and what a run of Pallas tests
needs before JAX starts is done."""

from __future__ import annotations

import re

import pytest

from ..suite.membership import (
    conformance_op_name,
    is_conformance_item,
    is_packaged_conformance_item,
)
from . import run_records
from .chips import each_test_per_chip
from .hypothesis_settings import load_hypothesis_profile
from .run_state import benchmark_run
from .session import PallasSession, session_of

_USAGE_ERROR = re.compile(r"\b(?:OperationError|SupportsError): (.*)")


def collected(collector: pytest.Collector, report: pytest.CollectReport) -> None:
    """A malformed Operation or @supports in a test module is a usage error, in one line; in
    a run of several chips, each Pallas test a collector yields comes once per chip (collected
    so: pytest counts and selects the copies, ``file.py::test_x[v6e]`` included)."""
    if report.failed:
        match = _USAGE_ERROR.search(str(report.longrepr))
        if match:
            raise pytest.UsageError(f"{collector.nodeid}: {match.group(1)}")
    session = session_of(collector.config)
    if session.options.several_chips and report.passed:
        report.result[:] = each_test_per_chip(report.result, session.options.chips,
                                              session.uses_pallas)


def item_collected(item: pytest.Item) -> None:
    """At the first Pallas test, before anything starts JAX's backends (a later module may
    make arrays when imported): JAX kept on the CPU."""
    session = session_of(item.config)
    if (session.platform_decision is None and not session.options.compiled
            and session.uses_pallas(item)):
        session.keep_jax_on_cpu()


def modify_items(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The conformance ops selected and ordered for the workers; for a run with Pallas
    tests, what must happen before JAX starts."""
    session = session_of(config)
    _deselect_conformance_ops(session, config, items)
    if not run_records.is_controller(config) and any(is_conformance_item(item) for item in items):
        from .conformance_order import order_for_workers

        items[:] = order_for_workers(config, items, is_conformance_item)
    ours = [item for item in items if session.uses_pallas(item)]
    if ours:
        _before_pallas_tests(session, config, items, ours)


def _before_pallas_tests(session: PallasSession, config: pytest.Config,
                         items: list[pytest.Item], ours: list[pytest.Item]) -> None:
    options = session.options
    if options.timeout_seconds and not options.compiled and not (
            hasattr(config, "workerinput") or config.option.pallas_processes):
        from .stuck_tests import arm

        arm(config)  # a test stuck inside XLA then ends its process, and the run goes on
    if not options.tpu:
        from ..checks.libtpu_environment import quiet_libtpu_environment_for

        # A Pallas test is going to run: before it starts JAX's backends, keep libtpu's
        # start-up warnings away. Never at load: a run without Pallas keeps its environment.
        quiet_libtpu_environment_for(options.libtpu)
    if not options.compiled and any(
            "pallas_benchmark" in getattr(item, "fixturenames", ()) for item in ours):
        from ..bench.table import request_single_threaded_xla

        request_single_threaded_xla(benchmark_run(config))
    # The suite's own conformance properties are sized on the run's profile; another suite
    # keeps a profile its modules loaded.
    load_hypothesis_profile(session, config, collected=not any(
        is_conformance_item(item) for item in items))


def _deselect_conformance_ops(session: PallasSession, config: pytest.Config,
                              items: list[pytest.Item]) -> None:
    if not any(is_packaged_conformance_item(item) for item in items):
        return
    if not (session.options.conformance or session.options.implementations):
        raise pytest.UsageError(
            "the conformance suite was collected without --pallas-conformance; "
            "run `pytest --pallas-conformance` (optionally with --pallas-impl/--pallas-ops)."
        )
    keep, drop = [], []
    for item in items:
        op_name = conformance_op_name(item) if is_packaged_conformance_item(item) else None
        selected = op_name is None or op_name in session.conformance_ops
        (keep if selected else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
