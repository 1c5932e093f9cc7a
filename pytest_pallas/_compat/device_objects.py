"""JAX's device objects answering for the stand-in chip to a test, and for the CPU to JAX
(contract §12).

Kernel libraries gate and dispatch on device objects: ``jax.devices()[0].device_kind`` in a
``get_tpu_version()`` helper, ``device.platform == "tpu"`` in an op's ``supported_on``,
``device.coords`` and ``core_on_chip`` in a mesh builder, the devices of an array
(``x.devices()``, ``x.sharding``). The same objects go to JAX's machinery (meshes, shardings,
``device_put``, ``jit``), which must keep treating them as the CPU devices they are.

jaxlib has one ``Device`` type for every platform; inside :func:`devices_answering_for` its
``platform``, ``device_kind``, ``num_cores``, ``coords``, ``core_on_chip``, ``slice_index``
and ``memory_stats()`` (and a client's ``platform``) answer by who asks: the code of JAX
and jaxlib, and this package's own, gets the CPU device's own answer (or, for what a CPU
device lacks, the ``AttributeError`` it raises); Pallas's own modules, which ask the device
for the chip they interpret for (``pltpu.get_tpu_info()``, ``create_tensorcore_mesh``), and
everything else (the test, its libraries, JAX's Pallas kernel library under
``jax.experimental.pallas.ops``, this package's reference kernels) get
the chip's. Who asks is the module of the calling frame. The public ``jax.devices``,
``jax.local_devices``, ``jax.device_count`` and ``jax.local_device_count`` then also take
``"tpu"`` from outside JAX, for the CPU devices standing in for the chip.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax

from .jax_internals import JaxInternalsChanged, private_attribute

# The modules of JAX and jaxlib that see the chip: Pallas's own (the interpreter asks the
# device for the chip's facts) and JAX's library of Pallas kernels (a library like another).
_JAX_MODULES_SEEING_THE_CHIP = ("jax._src.pallas", "jax.experimental.pallas")
# This package's own machinery sees the CPU too (it stands the chip in; it does not run on
# it); its reference kernels are kernels like a user's.
_OWN_PACKAGE = __name__.rpartition("._compat")[0]
_OWN_KERNELS = f"{_OWN_PACKAGE}.reference_kernels"
_PUBLIC_DEVICE_QUERIES = ("devices", "local_devices", "device_count", "local_device_count")


@dataclasses.dataclass(frozen=True)
class ChipDevices:
    """What the devices of a slice of the stand-in chip report.

    ``coords(device_index)`` and ``core_on_chip(device_index)`` place each device in the
    slice (``chip_topology.SliceTopology``); ``bytes_limit`` is the HBM one device addresses.
    """

    device_kind: str
    num_cores: int
    coords: Callable[[int], tuple[int, int, int]]
    core_on_chip: Callable[[int], int]
    bytes_limit: int
    platform: str = "tpu"


@functools.cache
def sees_the_cpu(module_name: str) -> bool:
    """Whether code of ``module_name`` gets a CPU device's own answers: JAX's and jaxlib's
    machinery and this package's, not Pallas's modules nor kernels nor anyone else's."""
    if module_name.startswith((*_JAX_MODULES_SEEING_THE_CHIP, _OWN_KERNELS)):
        return False
    return module_name in ("jax", "jaxlib", _OWN_PACKAGE) or module_name.startswith(
        ("jax.", "jaxlib.", f"{_OWN_PACKAGE}."))


def _asked_by_jax(depth: int) -> bool:
    # depth 0 is this function; the answering getter is 1, whoever asked it is 2.
    caller = sys._getframe(depth)
    return sees_the_cpu(caller.f_globals.get("__name__") or "")


@contextlib.contextmanager
def devices_answering_for(chip: ChipDevices) -> Iterator[None]:
    """Inside the block, device objects answer for ``chip`` to everyone but JAX's machinery
    (see the module docstring); everything is restored on exit."""
    device = jax.devices()[0]
    device_class, client_class = type(device), type(device.client)
    for owner, name in ((device_class, "platform"), (device_class, "device_kind"),
                        (device_class, "memory_stats"), (client_class, "platform")):
        if name not in vars(owner):
            raise JaxInternalsChanged(
                f"jaxlib's {owner.__name__} has no {name} of its own on this JAX: its device "
                "objects cannot answer for the stand-in chip")
    answers: dict[str, Callable[[Any], Any]] = {
        "platform": lambda _device: chip.platform,
        "device_kind": lambda _device: chip.device_kind,
        "num_cores": lambda _device: chip.num_cores,
        "coords": lambda device: chip.coords(device.id),
        "core_on_chip": lambda device: chip.core_on_chip(device.id),
        "slice_index": lambda _device: 0,
    }
    with contextlib.ExitStack() as stack:
        for name, answer in answers.items():
            _answer(stack, device_class, name, answer)
        _answer(stack, client_class, "platform", lambda _client: chip.platform)
        _answer_method(stack, device_class, "memory_stats",
                       lambda device: _memory_stats(device, chip.bytes_limit))
        for name in _PUBLIC_DEVICE_QUERIES:
            _take_tpu_backend(stack, jax, name)
        _mesh_devices_count_the_chip_s_cores(stack, chip.num_cores)
        yield


def _answer(stack: contextlib.ExitStack, owner: type, name: str,
            answer: Callable[[Any], Any]) -> None:
    """``owner.name`` answered by ``answer`` unless JAX asks (a property, replaced on exit)."""
    own = vars(owner).get(name)

    def answering(instance: Any) -> Any:
        if _asked_by_jax(2):
            if own is None:  # a CPU device has no such attribute
                raise AttributeError(f"{owner.__name__!r} object has no attribute {name!r}")
            return own.__get__(instance, owner)
        return answer(instance)

    _replace_on_class(stack, owner, name, own, property(answering))


def _answer_method(stack: contextlib.ExitStack, owner: type, name: str,
                   answer: Callable[[Any], Any]) -> None:
    own = vars(owner)[name]

    @functools.wraps(own)
    def answering(instance: Any, *args: Any, **kwargs: Any) -> Any:
        if _asked_by_jax(2):
            return own.__get__(instance, owner)(*args, **kwargs)
        return answer(instance)

    _replace_on_class(stack, owner, name, own, answering)


def _mesh_devices_count_the_chip_s_cores(stack: contextlib.ExitStack, num_cores: int) -> None:
    """A mesh's abstract device (``get_abstract_mesh().abstract_device``, which JAX builds
    from the CPU devices: no ``num_cores``) reports the chip's TensorCores to Pallas and the
    test, as a TPU mesh's does. ``pltpu.create_tensorcore_mesh`` and ``get_tpu_info`` read
    it inside a ``shard_map`` or a mesh the test entered, where a ``None`` made a
    ``pl.kernel`` on a TensorCore mesh fail (``int * None``). JAX's machinery (hashes,
    equality, repr) keeps the device's own value; a device made with a count keeps it."""
    try:
        owner = private_attribute("jax._src.mesh").AbstractDevice
        slot = vars(owner)["num_cores"]
    except (JaxInternalsChanged, AttributeError, KeyError):
        return  # no abstract devices on this JAX: nothing reads them

    def answering(device: Any) -> Any:
        own = slot.__get__(device, owner)
        if own is not None or _asked_by_jax(2):
            return own
        return num_cores

    # The slot's own setter stays: a frozen dataclass's __init__ sets it through the class.
    _replace_on_class(stack, owner, "num_cores", slot, property(answering, slot.__set__))


def _replace_on_class(stack: contextlib.ExitStack, owner: type, name: str, own: Any,
                      replacement: Any) -> None:
    setattr(owner, name, replacement)
    if own is None:
        stack.callback(delattr, owner, name)
    else:
        stack.callback(setattr, owner, name, own)


def _memory_stats(device: Any, bytes_limit: int) -> dict[str, int]:
    """The chip's HBM as a TPU device's ``memory_stats()`` reports it; in use, the bytes of
    the live arrays' shards on this device."""
    in_use = sum(shard.data.nbytes for array in jax.live_arrays()
                 for shard in array.addressable_shards if shard.device == device)
    return {"bytes_limit": bytes_limit, "bytes_in_use": in_use, "peak_bytes_in_use": in_use,
            "bytes_reservable_limit": bytes_limit}


def _take_tpu_backend(stack: contextlib.ExitStack, jax: Any, name: str) -> None:
    """``jax.<name>(backend="tpu")`` from outside JAX: the CPU devices standing in for the
    chip."""
    own = getattr(jax, name)
    signature = inspect.signature(own)

    @functools.wraps(own)
    def taking_tpu(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        if bound.arguments.get("backend") == "tpu" and not _asked_by_jax(2):
            bound.arguments["backend"] = "cpu"
        return own(*bound.args, **bound.kwargs)

    setattr(jax, name, taking_tpu)
    stack.callback(setattr, jax, name, own)
