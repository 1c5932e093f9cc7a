"""Compilations kept across runs, in pytest's cache directory (``.pytest_cache``).

A second run of the same tests compiles the same kernels again: the XLA executables
of the interpreted kernels and the TPU compiler's verdicts (``--pallas-compile``). In
a run that asks for Pallas behaviour (a Pallas flag such as ``--pallas-conformance``)
both are kept under pytest's cache directory:

* JAX's persistent compilation cache (``jax_compilation_cache_dir``), for every
  executable JAX agrees to cache. JAX skips executables with host callbacks, so the
  TPU interpreter's kernels, which call back into Python for every DMA and
  semaphore, are compiled each run; the plain interpreter's are cached.
* The TPU compiler's verdicts, keyed by the kernel's fingerprint, its argument
  shapes, the mesh and the chip, in one file per jax, jaxlib, libtpu and pytest-pallas
  version (a release that compiles a kernel differently does not read an older verdict).

Off with ``-p no:cacheprovider`` (no cache directory) or the ini option
``pallas_persistent_cache = false``; a run without a Pallas flag changes nothing.
"""

from __future__ import annotations

import dataclasses

import pytest

from .versions import installed_version

INI_OPTION = "pallas_persistent_cache"
_VERDICTS_KEY = "pallas/compile-verdicts"


def add_ini_option(parser: pytest.Parser) -> None:
    parser.addini(INI_OPTION, type="bool", default=True,
                  help="keep JAX's compiled executables and the TPU compiler's verdicts in "
                  "pytest's cache directory across runs that use Pallas (default true).")


def wanted(config: pytest.Config) -> bool:
    """Whether this run keeps compilations: pytest's cache is on and the ini option allows."""
    return getattr(config, "cache", None) is not None and bool(config.getini(INI_OPTION))


def enable_jax_cache(config: pytest.Config) -> str | None:
    """Point JAX's persistent compilation cache into pytest's cache directory; its path.

    Every executable is kept, however fast it compiled: a suite's many small kernels
    each compile in well under JAX's default threshold of one second.
    """
    import jax

    if jax.config.jax_compilation_cache_dir:
        return None  # the user's own choice stands
    directory = str(config.cache.mkdir("pallas-jax-compilation-cache"))
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    from .._compat import jax_internals

    try:
        jax_internals.start_persistent_compilation_cache()
    except jax_internals.JaxInternalsChanged:
        pass  # JAX opens it at the first compile instead, as it does for every user
    return directory


def _verdicts_key() -> str:
    # One file named by every version: a key one level below an older release's (which
    # ended at libtpu's version, a file) could not be written beside it.
    return _VERDICTS_KEY + "/" + "_".join(f"{name}-{installed_version(name) or 'none'}"
                                          for name in ("jax", "jaxlib", "libtpu",
                                                       "pytest-pallas"))


def _stored_verdicts(config: pytest.Config) -> dict:
    from ..checks.compile_check import CompileVerdict

    stored = config.cache.get(_verdicts_key(), None)
    if not isinstance(stored, dict):
        return {}
    fields = {field.name for field in dataclasses.fields(CompileVerdict)}
    verdicts = {}
    for key, value in stored.items():
        if isinstance(value, dict) and set(value) <= fields:
            try:
                verdicts[key] = CompileVerdict(**value)
            except TypeError:  # a verdict of another layout: compiled again
                continue
    return verdicts


def load_verdicts(config: pytest.Config) -> int:
    """The TPU compiler's verdicts of earlier runs into this run's cache; how many."""
    from ..checks.compile_check import remember_verdicts

    verdicts = _stored_verdicts(config)
    remember_verdicts(verdicts)
    return len(verdicts)


def save_verdicts(config: pytest.Config) -> None:
    """This run's verdicts added to the stored ones (pytest-xdist workers each add theirs)."""
    from ..checks.compile_check import remembered_verdicts

    verdicts = remembered_verdicts()
    if verdicts:
        from ..checks.compile_check import CACHE_SIZE

        merged = {**_stored_verdicts(config), **verdicts}
        merged = dict(list(merged.items())[-CACHE_SIZE:])  # the newest, as in memory
        config.cache.set(_verdicts_key(), {key: dataclasses.asdict(verdict)
                                           for key, verdict in merged.items()})


class PersistentCompilations:
    """Registered for a run that keeps compilations: loads verdicts now, saves them at the end."""

    def __init__(self, config: pytest.Config) -> None:
        self.jax_directory = enable_jax_cache(config)
        self.loaded = load_verdicts(config)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        save_verdicts(session.config)


def register(config: pytest.Config) -> None:
    """Keep this run's compilations when pytest's cache and the ini option allow."""
    if wanted(config):
        config.pluginmanager.register(PersistentCompilations(config), "pallas-persistent-cache")
