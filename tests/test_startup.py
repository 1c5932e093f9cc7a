"""Installed means loaded in every pytest run: the plugin must not import JAX, print anything or
touch the device count for a test suite that does not use Pallas. Fresh processes only, since
this process imported JAX long ago."""

import subprocess
import sys
import textwrap

import pytest

from pytest_pallas import hosts

# What libtpu reads at start (set by the plugin, or by importing libtpu, to keep its warnings
# away): only when a Pallas test is going to run.
LIBTPU_VARIABLES = ("ALLOW_MULTIPLE_LIBTPU_LOAD", "TPU_WORKER_HOSTNAMES", "TPU_HOST_BOUNDS",
                    "TPU_LIBRARY_PATH")


@pytest.fixture
def environment_without_jax_settings(monkeypatch):
    for name in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES", "JAX_PLATFORMS", hosts.SET_BY_PLUGIN, "CI",
                 *LIBTPU_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_loading_the_plugin_does_not_import_jax(environment_without_jax_settings):
    script = textwrap.dedent("""
        import sys
        import pytest_pallas.plugin.hooks
        import pytest_pallas
        heavy = sorted(name for name in sys.modules
                       if name.split(".")[0] in ("jax", "jaxlib", "numpy"))
        assert not heavy, heavy
        """)
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                               timeout=120, check=False)
    assert completed.returncode == 0, completed.stderr


def test_a_suite_that_does_not_use_pallas_does_not_see_the_plugin(
        pytester, environment_without_jax_settings):
    pytester.makepyfile(test_plain=textwrap.dedent(f"""
        import os, sys
        LIBTPU_VARIABLES = {LIBTPU_VARIABLES!r}

        def test_first_nothing_imported_jax():
            assert "pytest_pallas.plugin.hooks" in sys.modules, "the plugin is loaded"
            jax_modules = [name for name in sys.modules if name.split(".")[0] in ("jax", "jaxlib")]
            assert not jax_modules, jax_modules
            assert "JAX_NUM_CPU_DEVICES" not in os.environ
            changed = [name for name in LIBTPU_VARIABLES if name in os.environ]
            assert not changed, f"set by the plugin: {{changed}}"

        def test_then_jax_has_its_own_defaults():
            import jax
            assert jax.device_count("cpu") == 1, "the plugin must not change the device count"
        """))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=2)
    assert not [line for line in result.stdout.lines if line.startswith("pallas")]

    # The same run with a Pallas flag: now the header says what the plugin does.
    flagged = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pallas-interpret=tpu",
                                            "--collect-only", timeout=120)
    flagged.stdout.fnmatch_lines(["pallas: CPU, tpu interpreter*"])


# What the hooks of a run without Pallas may load: options, session state, the report's
# recorder and their small helpers. Not JAX's compatibility layer, the checks, the op
# registry or the benchmark glue (with numpy, 1.3x the CPU of the run without the plugin).
_HEAVY_FOR_A_RUN_WITHOUT_PALLAS = (
    "numpy",
    "pytest_pallas._compat.jax_internals",
    "pytest_pallas.backend",
    "pytest_pallas.checks.compile_check",
    "pytest_pallas.checks.static_rules",
    "pytest_pallas.ops.registry",
    "pytest_pallas.ops.operation",
    "pytest_pallas.operations",
    "pytest_pallas.bench.fixture",
    "pytest_pallas.suite.harness",
)


def test_a_run_without_pallas_loads_only_what_its_hooks_need(
        pytester, environment_without_jax_settings):
    # Written after every hook of the plugin ran (the unconfigure of a conftest runs last).
    pytester.makeconftest(textwrap.dedent("""
        import sys

        def pytest_unconfigure(config):
            with open("modules.txt", "w") as handle:
                handle.write("\\n".join(sorted(sys.modules)))
        """))
    pytester.makepyfile(test_plain="def test_one():\n    assert True\n")

    def modules_loaded(*args):
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=120)
        result.assert_outcomes(passed=1)
        return set((pytester.path / "modules.txt").read_text().split())

    loaded = modules_loaded()
    assert "pytest_pallas.plugin.hooks" in loaded
    # Another installed plugin may load numpy itself (jaxtyping's does): only what loading
    # this one adds counts.
    loaded -= modules_loaded("-p", "no:pallas")
    assert sorted(loaded.intersection(_HEAVY_FOR_A_RUN_WITHOUT_PALLAS)) == []


def test_a_run_without_pallas_leaves_jax_libtpu_and_cuda_as_without_the_plugin(
        pytester, environment_without_jax_settings):
    """On a TPU VM too: libtpu (installed here, for the compile check) is not loaded at
    start-up, so JAX's own import of it sets up its environment as it would without us."""
    pytest.importorskip("libtpu")
    pytester.makeconftest(textwrap.dedent("""
        import os, sys

        def pytest_unconfigure(config):
            prefixes = ("JAX_", "XLA_", "TPU_", "LIBTPU", "ALLOW_MULTIPLE", "CUDA_", "NVIDIA_")
            seen = sorted(f"{name}={value}" for name, value in os.environ.items()
                          if name.startswith(prefixes))
            seen += sorted(name for name in sys.modules if name.split(".")[0] in (
                "libtpu", "jax_plugins", "jax_cuda12_plugin", "jax_cuda13_plugin"))
            with open("seen.txt", "w") as handle:
                handle.write("\\n".join(seen))
        """))
    pytester.makepyfile(test_plain=textwrap.dedent("""
        import jax

        def test_jax_starts_as_it_would():
            assert jax.numpy.ones(2).sum() == 2
        """))

    def seen(*args):
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=120)
        result.assert_outcomes(passed=1)
        return (pytester.path / "seen.txt").read_text().splitlines()

    with_plugin = seen()
    assert with_plugin == seen("-p", "no:pallas")
