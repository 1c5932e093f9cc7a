"""Shared helpers for the plugin's own tests."""

import os

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture(scope="session", autouse=True)
def _modules_imported_before_in_process_runs():
    """Import, once, what pytester's in-process runs must not import afresh.

    Those runs restore ``sys.modules`` afterwards, and JAX's native runtime cannot be
    imported twice in one process. A fixture, not imports at the top: this conftest is
    loaded by every pytest run from the repository's root, the main job's among them,
    whose process that hands tests to workers (pytest-xdist's controller) runs none.
    """
    import jax  # noqa: F401
    import jax.experimental.pallas  # noqa: F401
    import jax.experimental.pallas.tpu  # noqa: F401

    # Every interpreted kernel tries to import the GPU interpreter too (it needs
    # absl, which may be missing: JAX then skips it); the MLIR dialects it loads on
    # the way cannot be registered twice ("Dialect namespace 'builtin' is already
    # registered"), so load them once here.
    try:
        import jax._src.pallas.mosaic_gpu.interpret.interpret_pallas_call  # noqa: F401
    except ImportError:
        pass

    # Likewise the modules the conformance suite imports, so that objects made in
    # one in-process run (Hypothesis strategies, say) match the classes of the next.
    import hypothesis.strategies  # noqa: F401

    # The registry too: a run's hooks reach it as an attribute of ``pytest_pallas.ops``,
    # which outlives the snapshot, while the suite imports it by name; imported first
    # inside one in-process run, the next run would register its ops in one copy and
    # read the other.
    import pytest_pallas.ops.inputs  # noqa: F401
    import pytest_pallas.ops.registry  # noqa: F401
    import pytest_pallas.suite.harness  # noqa: F401


@pytest.fixture
def run_pytest(pytester):
    """Run pytest in a subprocess (fresh JAX, fresh device count) in pytester's tmp dir."""

    def run(*args, timeout=240):
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=timeout)

    return run


@pytest.fixture
def run_value_property(pytester):
    """Run the suite's value property on one op and implementation ("module:attr", the
    seeded bugs importable) without shrinking; returns the result and the op's report."""
    import json
    import pathlib

    pytester.syspathinsert(pathlib.Path(__file__).resolve().parent)

    def run(op, implementation, *args):
        report = pytester.path / "report.json"
        result = pytester.runpytest(
            "-p", "no:cacheprovider", "-p", "_pallas_no_shrink", "--pallas-conformance",
            f"--pallas-ops={op}", "--pallas-impl", f"{op}={implementation}",
            "-k", "test_value", f"--pallas-report={report}", *args)
        return result, json.loads(report.read_text())["ops"][op]

    return run


@pytest.fixture(autouse=True)
def _inner_runs_in_one_process(monkeypatch):
    """The inner pytest runs of these tests stay in one process: a conformance run of several
    ops would otherwise start pytest-xdist workers by default (tests/test_default_workers.py
    unsets this to test that)."""
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "0")


@pytest.fixture
def outside_xdist(monkeypatch):
    """An inner pytest run as a user starts it, not as a pytest-xdist worker: it inherits this
    worker's PYTEST_XDIST_* variables, and pytest-benchmark disables (and warns about)
    benchmarks in any process that has them."""
    for name in list(os.environ):
        if name.startswith("PYTEST_XDIST"):
            monkeypatch.delenv(name)
