"""Which JAX releases this plugin was tested with, read without importing JAX.

CI runs the whole test suite at both ends of the supported range
(constraints/ci.txt and constraints/newest.txt). A newer JAX is allowed (no
upper cap in pyproject.toml): the run header says it is untested, and a
private internal that moved turns its feature off with a line naming it.
"""

from __future__ import annotations

import importlib.metadata

OLDEST_TESTED_JAX = "0.10.2"
NEWEST_TESTED_JAX = "0.12.0.1"

# Chips the option accepts but an older JAX's pltpu.ChipVersion lacks: the
# first JAX release that knows each.
CHIPS_SINCE_JAX = {"8t": "0.11.0"}


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution (``"jax"``, ``"libtpu"``), or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    from packaging.version import Version

    return Version(version).release


def is_older(version: str, than: str) -> bool:
    return _release(version) < _release(than)


def untested_jax_note() -> str | None:
    """One header line when the installed JAX is newer than the newest tested, else None."""
    jax_version = installed_version("jax")
    if jax_version is None or not is_older(NEWEST_TESTED_JAX, jax_version):
        return None
    return (f"pallas: jax {jax_version} is newer than the newest tested ({NEWEST_TESTED_JAX}); "
            "a feature whose JAX internals moved turns itself off and says so")


def chip_needs_newer_jax(chip: str) -> str | None:
    """Why the installed JAX cannot stand in for ``chip`` (too old to know it), or None."""
    since = CHIPS_SINCE_JAX.get(chip)
    if since is None:
        return None  # every supported JAX knows it: no need to read JAX's metadata (ms)
    jax_version = installed_version("jax")
    if jax_version is None or not is_older(jax_version, since):
        return None
    return f"chip {chip!r} needs jax >= {since} (installed: {jax_version})"
