"""Every use of a private JAX internal lives here, and only here.

Pallas moves fast and the internals below (the TPU interpreter's global
state, its race flag, the registry of device kinds behind
``pltpu.get_tpu_info``) are not public API: they change between releases.
Each accessor is guarded so that a JAX release that moved one of them gives a
clear ``JaxInternalsChanged`` error naming the internal, instead of an
AttributeError deep inside a test. ``tests/test_jax_compat.py`` exercises
every function against the installed JAX, so a release that breaks one fails
CI here first.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, Callable, Iterator


class JaxInternalsChanged(RuntimeError):
    """A private JAX internal that pytest-pallas relies on is not where it was."""


def _private(module_name: str, attribute: str | None = None) -> Any:
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise JaxInternalsChanged(
            f"pytest-pallas needs {module_name}, which this JAX does not have ({error}); "
            "install a supported jax (see pyproject.toml) or report the new location."
        ) from error
    if attribute is None:
        return module
    try:
        return getattr(module, attribute)
    except AttributeError as error:
        raise JaxInternalsChanged(
            f"pytest-pallas needs {module_name}.{attribute}, which this JAX does not have; "
            "install a supported jax (see pyproject.toml) or report the new location."
        ) from error


_INTERPRETER = "jax._src.pallas.mosaic.interpret.interpret_pallas_call"
_TPU_INFO = "jax._src.pallas.mosaic.tpu_info"
_PALLAS_CALL = "jax._src.pallas.pallas_call"
_XLA_BRIDGE = "jax._src.xla_bridge"


# --- The TPU interpreter's global state ------------------------------------


def races_found() -> bool:
    """Whether the TPU interpreter's race detector flagged a race since the last reset."""
    state = _private(_INTERPRETER, "races")
    return bool(state is not None and getattr(state, "races_found", False))


def reset_interpreter_state() -> None:
    """Drop the TPU interpreter's shared memory, semaphores and race state.

    A kernel that raised while being interpreted leaves this state behind, and
    the next interpreted kernel would then fail; public API since jax 0.7.
    """
    from jax.experimental.pallas import tpu as pltpu

    pltpu.reset_tpu_interpret_mode_state()


# --- Device kinds -> chip facts ----------------------------------------------


def chip_versions() -> dict[str, Any]:
    """The chip names JAX knows (``"v5e"``, ``"7x"``, ...) mapped to ``pltpu.ChipVersion``."""
    from jax.experimental.pallas import tpu as pltpu

    return {version.value: version for version in pltpu.ChipVersion}


def chip_version_of_device_kind(device_kind: str) -> Any | None:
    """The ``ChipVersion`` of a device kind string such as ``"TPU v5 lite"``, or None."""
    return _private(_TPU_INFO, "chip_version_from_device_kind")(device_kind)


@contextlib.contextmanager
def device_kind_answers_as(device_kind: str, tpu_info_factory: Callable[[], Any]) -> Iterator[None]:
    """Make ``pltpu.get_tpu_info()`` answer ``tpu_info_factory()`` on devices of ``device_kind``.

    ``get_tpu_info`` looks unknown device kinds up in a private registry; this
    is how a CPU run stands in for a chip so that ``pltpu.emit_pipeline`` and
    ``pl.kernel`` (which ask for the chip's tiling) work on the CPU.
    """
    registry = _private(_TPU_INFO, "registry")
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
    module = _private(_TPU_INFO)
    for name in ("get_tpu_info", "get_tpu_info_for_chip"):
        function = getattr(module, name, None)
        clear = getattr(function, "cache_clear", None)
        if clear is not None:
            clear()


# --- Backends ------------------------------------------------------------------


def backends_are_initialized() -> bool:
    """Whether JAX has created its device clients (after which the CPU device count is fixed)."""
    return bool(_private(_XLA_BRIDGE, "backends_are_initialized")())


# --- Observing pallas_call as it is traced -----------------------------------


def pallas_call_primitive() -> Any:
    """The ``pallas_call`` primitive, whose equations carry grid mappings and compiler params."""
    return _private(_PALLAS_CALL, "pallas_call_p")
