"""The pytest plugin of a peer-suite run (benchmarks/peer_suites.py copies it into the work
folder and loads it with ``-p peer_suite_shim``).

Not a conftest.py: under benchmarks/ it would load into every ``pytest benchmarks`` run, and a
conftest would not reach tokamax's tests in site-packages. It does three things, each for the
measurement only:

- serves the test utilities JAX's wheel lacks (``jax._src.pallas.pallas_test_util``,
  ``jax._src.hypothesis_test_util``) from the files the script copied, at the tests' own tag,
  into ``_jax_test_support/``; the installed jax is left as it is;
- keeps every K-th test id of each file (``PEER_SUITE_SAMPLE=K``; a test run once per chip
  counts once), the same ids in every run and every pytest-xdist worker, so that the
  plugin-off and opted-in runs compare the same tests; ``PEER_SUITE_SLICE=J`` (0 to K-1)
  keeps the ids J, J+K, J+2K, ...: the K slices together are the whole suite;
- ends a test that runs longer than ``PEER_SUITE_TIMEOUT`` seconds with ``PeerSuiteTimeout``
  (a SIGALRM in the test's thread), so that one slow test does not eat the whole run.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import signal
import sys

import pytest

_SUPPORT = pathlib.Path(__file__).parent / "_jax_test_support"
_SERVED = {
    "jax._src.pallas.pallas_test_util": "pallas_test_util.py",
    "jax._src.hypothesis_test_util": "hypothesis_test_util.py",
}


def _serve(name: str, path: pathlib.Path) -> None:
    if name in sys.modules:
        return
    try:
        importlib.import_module(name)
        return  # this jax ships it: use its own
    except ImportError:
        pass
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, module)


for _name, _file in _SERVED.items():
    if (_SUPPORT / _file).exists():
        _serve(_name, _SUPPORT / _file)


class PeerSuiteTimeout(BaseException):
    """A test ran past the measurement's per-test limit. A BaseException, as the plugin's own
    timeout is, so that a test's ``except Exception`` (an autotuner trying configurations,
    Hypothesis replaying an example) does not take it and run on."""


def _without_chip(item) -> str:
    """The test's id without the chip suffix of a run over several chips (``[v5p]``): both
    chips' copies of a sampled test are kept, and the same tests as a run with the plugin
    off."""
    try:
        from pytest_pallas.plugin.chips import chip_of, test_id_without_chip
    except ImportError:
        return item.nodeid
    chip = chip_of(item)
    return test_id_without_chip(item.nodeid, chip) if chip else item.nodeid


def pytest_collection_modifyitems(config, items):
    every = int(os.environ.get("PEER_SUITE_SAMPLE", "1") or 1)
    offset = int(os.environ.get("PEER_SUITE_SLICE", "0") or 0)
    if every <= 1:
        return
    kept, dropped, ordinal = [], [], {}
    for item in items:
        in_file = ordinal.setdefault(item.path, {})
        index = in_file.setdefault(_without_chip(item), len(in_file))
        (kept if index % every == offset else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _on_alarm(signum, frame):
    raise PeerSuiteTimeout(f"ran past {os.environ['PEER_SUITE_TIMEOUT']} s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    seconds = float(os.environ.get("PEER_SUITE_TIMEOUT", "0") or 0)
    if seconds <= 0:
        yield
        return
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
