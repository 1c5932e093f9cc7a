"""What ``pltpu.get_tpu_info()`` answers: the chips JAX knows, and the stand-in chip
made to answer on a CPU device (a patch of JAX's registry of device kinds, undone
on exit).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import jax
from jax.experimental.pallas import tpu as pltpu

from . import jax_internals
from .jax_internals import JaxInternalsChanged

_TPU_INFO = "jax._src.pallas.mosaic.tpu_info"


def chip_versions() -> dict[str, Any]:
    """The chip names JAX knows (``"v5e"``, ``"7x"``, ...) mapped to ``pltpu.ChipVersion``."""
    return {version.value: version for version in pltpu.ChipVersion}


def chip_version_of_device_kind(device_kind: str) -> Any | None:
    """The ``ChipVersion`` of a device kind string such as ``"TPU v5 lite"``, or None."""
    return jax_internals.private_attribute(_TPU_INFO, "chip_version_from_device_kind")(device_kind)


@contextlib.contextmanager
def device_kind_answers_as(device_kind: str, tpu_info_factory: Callable[[], Any]) -> Iterator[None]:
    """Make ``pltpu.get_tpu_info()`` answer ``tpu_info_factory()`` on devices of ``device_kind``.

    ``get_tpu_info`` looks unknown device kinds up in a private registry; this
    is how a CPU run stands in for a chip so that ``pltpu.emit_pipeline`` and
    ``pl.kernel`` (which ask for the chip's tiling) work on the CPU.
    """
    registry = jax_internals.private_attribute(_TPU_INFO, "registry")
    if not isinstance(registry, dict):
        raise JaxInternalsChanged(
            f"{_TPU_INFO}.registry is no longer a dict; pytest-pallas cannot stand in for a chip "
            "on this JAX."
        )
    missing = object()
    previous = registry.get(device_kind, missing)
    registry[device_kind] = tpu_info_factory
    _clear_tpu_info_caches()
    try:
        yield
    finally:
        if previous is missing:
            registry.pop(device_kind, None)
        else:
            registry[device_kind] = previous
        _clear_tpu_info_caches()


def _clear_tpu_info_caches() -> None:
    # get_tpu_info_for_chip is cached; get_tpu_info is not, but guard both so
    # a release that adds a cache does not serve the previous chip's facts.
    module = jax_internals.private_attribute(_TPU_INFO)
    for name in ("get_tpu_info", "get_tpu_info_for_chip"):
        function = getattr(module, name, None)
        clear = getattr(function, "cache_clear", None)
        if clear is not None:
            clear()


@contextlib.contextmanager
def chip_answering_on_this_device(tpu_info_factory: Callable[[], Any]) -> Iterator[None]:
    """Make ``pltpu.get_tpu_info()`` answer on this (CPU) device unless something already does.

    The TPU interpreter's tile padding asks the chip for its tiling.
    """
    try:
        pltpu.get_tpu_info()
    except Exception:  # noqa: BLE001  # no chip answers here: stand in for one

        with device_kind_answers_as(jax.devices()[0].device_kind, tpu_info_factory):
            yield
        return
    yield
