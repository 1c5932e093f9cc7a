"""The stand-in chip as the device under test: what JAX's test utilities and
``jax.default_backend()`` answer inside an opted-in test (contract §9).

Kernel libraries' TPU tests gate on the device: ``jtu.test_device_matches(["tpu"])``,
``jtu.is_device_tpu(5, "e")``, ``jtu.is_device_tpu_at_least(4)``, ``jtu.get_tpu_version()``,
``jtu.device_kind_match(...)`` (``jax._src.test_util``), or ``jax.default_backend() == "tpu"``.
On a CPU they skip, though their kernels run interpreted. Inside :func:`stand_in_chip_under_test`
those questions get the stand-in chip's answers, read through JAX's own functions (their
special cases of device kinds stay JAX's), while JAX's internals keep seeing the CPU:

- ``jax._src.test_util.device_under_test`` answers ``"tpu"``, so every utility built on it
  (device tags, ``supported_dtypes``, ``is_device_tpu_at_least``) answers for a TPU;
- the utilities that read ``xla_bridge.devices()[0].device_kind`` read the chip's device
  kind (``"TPU v5 lite"``) while they run, and only then: the same module builds meshes
  from the real devices;
- the public ``jax.default_backend`` answers ``"tpu"``; JAX's own modules call
  ``xla_bridge.default_backend``, which still answers ``"cpu"``.

Device objects (``jax.devices()[0].platform``, ``.device_kind``, ``.coords``,
``jax.extend.backend.get_default_device()``, an array's devices) answer for the chip too, to
everyone but JAX's machinery, which keeps treating them as the CPU devices they are
(``device_objects``).
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax

from .device_objects import ChipDevices, devices_answering_for
from .interpreter_fixes import chip_as_abstract_device
from .jax_internals import JaxInternalsChanged

TEST_UTIL_MODULE = "jax._src.test_util"

# The device kind a chip's devices report (``jax.devices()[0].device_kind`` on that chip),
# as JAX's own table reads them back (tpu_info.chip_version_from_device_kind; checked by
# tests/test_device_under_test.py at both ends of the supported range).
DEVICE_KIND_OF_CHIP = {
    "v4": "TPU v4",
    "v5e": "TPU v5 lite",
    "v5p": "TPU v5",
    "v6e": "TPU v6 lite",
    "7x": "TPU7x",
}

# JAX's test utilities that read the device kind from xla_bridge.devices().
_DEVICE_KIND_READERS = ("get_tpu_version", "is_device_tpu", "device_kind_match")
# What a test written for the interpreter asks of the chip it interprets for.
_GENERATION_QUESTIONS = ("get_tpu_version", "is_device_tpu_at_least", "is_device_tpu")


def device_kind_of_chip(chip: str) -> str:
    """The ``device_kind`` string of ``chip``'s devices (``"v5e"`` -> ``"TPU v5 lite"``)."""
    try:
        return DEVICE_KIND_OF_CHIP[chip]
    except KeyError:
        raise ValueError(
            f"no TPU device kind is known for chip {chip!r}; use one of "
            f"{', '.join(DEVICE_KIND_OF_CHIP)}") from None


@contextlib.contextmanager
def stand_in_chip_under_test(
        chip: str, libtpu_platform_version: Callable[[], str | None] = lambda: None,
        *, devices: ChipDevices | None = None, generation_only: bool = False,
) -> Iterator[None]:
    """Inside the block, JAX's test utilities and ``jax.default_backend()`` answer for
    ``chip`` (see the module docstring); everything is restored on exit.

    ``libtpu_platform_version`` gives what the installed libtpu's client says of itself
    (its build date), or None: ``jtu.is_cloud_tpu_at_least(year, month, day)``, which a
    test asks for "a libtpu new enough for this", then answers for that libtpu, the one
    the TPU compiler check compiles with; without libtpu it keeps JAX's answer off a
    Cloud TPU (True). ``devices``: what JAX's device objects then report (none: they stay
    the CPU's).
    """
    device_kind = device_kind_of_chip(chip)
    with contextlib.ExitStack() as stack:
        test_util = sys.modules.get(TEST_UTIL_MODULE)
        if generation_only:
            if test_util is not None:
                _answer_generation_questions(stack, test_util, device_kind)
            yield
            return
        _replace(stack, jax, "default_backend", lambda: "tpu")
        if devices is not None:
            stack.enter_context(devices_answering_for(devices))
            # Then the abstract device Pallas reads while tracing (pltpu.is_tpu_device(),
            # get_tpu_info()) is the chip's too, where it stood in under the CPU's kind.
            stack.enter_context(chip_as_abstract_device(
                devices.device_kind, devices.num_cores, replace_stand_in=True))
        if test_util is not None:  # a suite that never imported them asks nothing of them
            _answer_test_utilities(stack, test_util, device_kind, libtpu_platform_version)
        yield


def _answer_generation_questions(stack: contextlib.ExitStack, test_util: Any,
                                 device_kind: str) -> None:
    _require(test_util, ("device_under_test", "xla_bridge", *_GENERATION_QUESTIONS))
    devices_view = _XlaBridgeView(test_util.xla_bridge, device_kind)
    as_the_chip = {"device_under_test": lambda: "tpu", "xla_bridge": devices_view}
    for name in ("get_tpu_version", "is_device_tpu_at_least"):
        _replace(stack, test_util, name, _with_module_globals(
            getattr(test_util, name), test_util, lambda: as_the_chip))
    is_device_tpu = test_util.is_device_tpu
    chip_is = _with_module_globals(is_device_tpu, test_util, lambda: as_the_chip)

    @functools.wraps(is_device_tpu)
    def is_device_tpu_of_generation(version: int | None = None, *args: Any,
                                    **kwargs: Any) -> Any:
        # "Is this a TPU?" keeps the CPU's answer; "is this a TPU v5e?" the chip's.
        if version is None:
            return is_device_tpu(version, *args, **kwargs)
        return chip_is(version, *args, **kwargs)

    _replace(stack, test_util, "is_device_tpu", is_device_tpu_of_generation)


def _require(test_util: Any, names: tuple[str, ...]) -> None:
    for name in names:
        if not hasattr(test_util, name):
            raise JaxInternalsChanged(
                f"{TEST_UTIL_MODULE}.{name} is gone on this JAX: its test utilities cannot "
                "answer for the stand-in chip")


def _answer_test_utilities(stack: contextlib.ExitStack, test_util: Any, device_kind: str,
                           libtpu_platform_version: Callable[[], str | None]) -> None:
    _require(test_util, ("device_under_test", "xla_bridge", *_DEVICE_KIND_READERS))
    _replace(stack, test_util, "device_under_test", lambda: "tpu")
    devices_view = _XlaBridgeView(test_util.xla_bridge, device_kind)
    for name in _DEVICE_KIND_READERS:
        _replace(stack, test_util, name, _with_module_globals(
            getattr(test_util, name), test_util, lambda: {"xla_bridge": devices_view}))

    def built_by_the_installed_libtpu() -> dict[str, Any]:
        version = libtpu_platform_version()
        if version is None:  # no libtpu: JAX's own answer off a Cloud TPU
            return {}
        return {"xla_bridge": devices_view.with_platform_version(version),
                "is_cloud_tpu": lambda: True}

    if hasattr(test_util, "is_cloud_tpu_at_least"):  # gone by jax 0.12
        _replace(stack, test_util, "is_cloud_tpu_at_least", _with_module_globals(
            test_util.is_cloud_tpu_at_least, test_util, built_by_the_installed_libtpu))


def _replace(stack: contextlib.ExitStack, owner: Any, name: str, value: Any) -> None:
    previous = getattr(owner, name)
    setattr(owner, name, value)
    stack.callback(setattr, owner, name, previous)


def _with_module_globals(function: Callable, module: Any,
                         values: Callable[[], dict[str, Any]]) -> Callable:
    """``function`` (a function of ``module``) run with the module's globals named in
    ``values()`` (asked at each call) set to those values, and restored after."""

    @functools.wraps(function)
    def answering(*args: Any, **kwargs: Any) -> Any:
        with contextlib.ExitStack() as stack:
            for name, value in values().items():
                _replace(stack, module, name, value)
            return function(*args, **kwargs)

    return answering


class _XlaBridgeView:
    """``xla_bridge`` whose ``devices()`` report the stand-in chip's device kind."""

    def __init__(self, xla_bridge: Any, device_kind: str,
                 platform_version: str | None = None) -> None:
        self._xla_bridge = xla_bridge
        self._device_kind = device_kind
        self._platform_version = platform_version

    def with_platform_version(self, platform_version: str) -> _XlaBridgeView:
        """The same view, whose backend reports ``platform_version`` (libtpu's build)."""
        return _XlaBridgeView(self._xla_bridge, self._device_kind, platform_version)

    def get_backend(self, *args: Any, **kwargs: Any) -> Any:
        backend = self._xla_bridge.get_backend(*args, **kwargs)
        if self._platform_version is None:
            return backend
        return _Answering(backend, platform_version=self._platform_version)

    def devices(self, *args: Any, **kwargs: Any) -> list[Any]:
        return [_Answering(device, device_kind=self._device_kind, platform="tpu")
                for device in self._xla_bridge.devices(*args, **kwargs)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._xla_bridge, name)


class _Answering:
    """``target`` (a device, a backend) with some attributes answered otherwise: read by JAX's
    test utilities, never handed to JAX."""

    def __init__(self, target: Any, **answers: Any) -> None:
        self._target = target
        self.__dict__.update(answers)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)
