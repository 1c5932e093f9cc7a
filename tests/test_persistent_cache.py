"""Compilations kept across runs in pytest's cache directory: JAX's persistent compilation
cache and the TPU compiler's verdicts, in a run with a Pallas flag, unless pytest's cache
is off (``-p no:cacheprovider``) or the ini option ``pallas_persistent_cache`` is false."""

from __future__ import annotations

import textwrap

import pytest

from pytest_pallas.checks import compile_check

KERNEL_TEST = textwrap.dedent('''
    import jax
    import numpy as np
    from jax.experimental import pallas as pl


    def double_kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2


    def test_double():
        x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
        out = pl.pallas_call(double_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
        np.testing.assert_array_equal(out, x * 2)
''')


def _run(pytester, *args):
    return pytester.runpytest_subprocess("--pallas-interpret=plain", *args, timeout=240)


def _jax_cache(pytester):
    return pytester.path / ".pytest_cache" / "d" / "pallas-jax-compilation-cache"


@pytest.mark.skipif(compile_check.libtpu_version() is None, reason="needs libtpu")
def test_a_second_run_takes_the_compilers_verdicts_and_jaxs_executables_from_the_cache(
        pytester):
    pytester.makepyfile(test_kernel=KERNEL_TEST)
    first = _run(pytester)
    first.assert_outcomes(passed=1)
    first.stdout.fnmatch_lines(["pallas: TPU compiler check: 1 kernel compiles in *"])
    assert any(_jax_cache(pytester).iterdir())
    second = _run(pytester)
    second.assert_outcomes(passed=1)
    second.stdout.fnmatch_lines(
        ["pallas: TPU compiler check: 0 kernel compiles in *, 1 verdicts from the cache"])


@pytest.mark.skipif(compile_check.libtpu_version() is None, reason="needs libtpu")
def test_verdicts_are_kept_beside_an_older_releases(pytester):
    # An older release kept its verdicts in a file named by the jax, jaxlib and libtpu
    # versions alone; this one's key must not need that file to be a folder.
    from pytest_pallas.plugin.versions import installed_version

    older = pytester.path / ".pytest_cache" / "v" / "pallas" / "compile-verdicts"
    for name in ("jax", "jaxlib"):
        older /= f"{name}-{installed_version(name)}"
    older.mkdir(parents=True)
    (older / f"libtpu-{installed_version('libtpu')}").write_text("{}")
    pytester.makepyfile(test_kernel=KERNEL_TEST)
    first = _run(pytester, "-W", "error::pytest.PytestCacheWarning")
    first.assert_outcomes(passed=1)
    assert "could not create cache path" not in first.stdout.str() + first.stderr.str()
    second = _run(pytester)
    second.stdout.fnmatch_lines(
        ["pallas: TPU compiler check: 0 kernel compiles in *, 1 verdicts from the cache"])


@pytest.mark.skipif(compile_check.libtpu_version() is None, reason="needs libtpu")
def test_a_kernel_judged_again_beside_jaxs_kept_executables_raises_no_warning(pytester):
    """What a pytest-xdist worker meets when another compiled the kernel first: JAX's cache
    holds the TPU executable, which this host cannot load; JAX warned about it in the run."""
    import shutil

    pytester.makepyfile(test_kernel=KERNEL_TEST)
    _run(pytester).assert_outcomes(passed=1)
    shutil.rmtree(pytester.path / ".pytest_cache" / "v" / "pallas")  # the verdicts only
    assert any(_jax_cache(pytester).iterdir())
    second = _run(pytester, "-W", "error::UserWarning")
    assert "Error reading persistent compilation cache" not in second.stdout.str()
    second.assert_outcomes(passed=1)
    second.stdout.fnmatch_lines(["pallas: TPU compiler check: 1 kernel compiles in *"])


@pytest.mark.parametrize("off", [("-p", "no:cacheprovider"),
                                 ("-o", "pallas_persistent_cache=false")])
def test_off_without_pytests_cache_or_by_the_ini_option(pytester, off):
    pytester.makepyfile(test_kernel=KERNEL_TEST)
    for _ in range(2):
        result = _run(pytester, *off)
        result.assert_outcomes(passed=1)
        assert not _jax_cache(pytester).exists()
    if compile_check.libtpu_version() is not None:
        result.stdout.fnmatch_lines(["pallas: TPU compiler check: 1 kernel compiles in *"])


def test_a_run_without_a_pallas_flag_keeps_nothing(pytester):
    pytester.makepyfile(test_plain="def test_one():\n    assert True\n")
    pytester.runpytest_subprocess(timeout=120).assert_outcomes(passed=1)
    assert not _jax_cache(pytester).exists()
