"""The supported JAX range: what a run on an untested or too-old JAX says."""

import pytest

from pytest_pallas.plugin import versions


@pytest.fixture
def installed_jax(monkeypatch):
    """Make the plugin believe another jax release is installed."""
    def install(version):
        real = versions.installed_version
        monkeypatch.setattr(
            versions, "installed_version",
            lambda name: version if name == "jax" else real(name))
    return install


def test_a_jax_newer_than_the_newest_tested_gets_one_header_line(pytester, installed_jax):
    installed_jax("0.13.1")
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest_inprocess("--pallas-interpret=plain")
    notes = [line for line in result.outlines if "newer than the newest tested" in line]
    assert notes == [
        f"pallas: jax 0.13.1 is newer than the newest tested ({versions.NEWEST_TESTED_JAX}); "
        "a feature whose JAX internals moved turns itself off and says so"
    ]
    assert result.ret == 0


@pytest.mark.parametrize("version", [versions.OLDEST_TESTED_JAX, versions.NEWEST_TESTED_JAX])
def test_a_tested_jax_gets_no_such_line(installed_jax, version):
    installed_jax(version)
    assert versions.untested_jax_note() is None


def test_a_chip_newer_than_the_installed_jax_is_a_usage_error(pytester, installed_jax):
    installed_jax("0.10.2")
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest_inprocess("--pallas-chip=8t")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: --pallas-chip='8t': chip '8t' needs jax >= 0.11.0 (installed: 0.10.2); "
        "upgrade jax or pick another chip."
    ])


def test_the_declared_range_starts_at_the_oldest_tested_jax():
    import pathlib
    import tomllib

    pyproject = pathlib.Path(__file__).parent.parent / "pyproject.toml"
    if not pyproject.exists():
        pytest.skip("runs from a checkout (pyproject.toml beside tests/)")
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    assert f"jax>={versions.OLDEST_TESTED_JAX}" in dependencies
    assert f"jaxlib>={versions.OLDEST_TESTED_JAX}" in dependencies
    # No upper cap: a newer JAX installs and is announced in the header instead.
    assert not any(d.startswith(("jax<", "jaxlib<")) or "<" in d for d in dependencies
                   if d.startswith(("jax", "jaxlib")))
    constraints = (pyproject.parent / "constraints")
    assert f"jax=={versions.OLDEST_TESTED_JAX}" in (constraints / "ci.txt").read_text()
    assert f"jax=={versions.NEWEST_TESTED_JAX}" in (constraints / "newest.txt").read_text()


def test_the_package_has_one_version_which_import_reads_without_jax():
    import pathlib
    import subprocess
    import sys
    import tomllib
    from importlib import metadata

    script = ("import sys, pytest_pallas\n"
              "print(pytest_pallas.__version__, sorted({'jax', 'numpy'} & set(sys.modules)))")
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                               timeout=120, check=True)
    assert completed.stdout.split() == [metadata.version("pytest-pallas"), "[]"]
    pyproject = pathlib.Path(__file__).parent.parent / "pyproject.toml"
    if pyproject.exists():  # a checkout: the installed metadata is pyproject's version,
        version = tomllib.loads(pyproject.read_text())["project"]["version"]
        assert version == metadata.version("pytest-pallas")
        # the release CHANGELOG.md's top section describes
        changelog = (pyproject.parent / "CHANGELOG.md").read_text()
        assert changelog.split("\n## ", 1)[1].startswith(f"{version} ")
