"""JAX's TPU interpreter when the devices of a mesh belong to several ``jax.distributed``
processes (``--pallas-processes``, a multi-host slice interpreted on CPUs).

The interpreter keeps one "shared memory" per process and makes every device of the
``shard_map`` wait at two ``threading.Barrier`` s sized by the mesh's *global* device count
(``_initialize_shared_memory``): a kernel over the 4 devices of 2 processes waits for 4
devices in each process, of which only its 2 ever arrive, and both processes hang (measured
at jax 0.10.2: no output in 120 s). The plugin resizes those two barriers to the devices of
the mesh that run in this process. A kernel that only touches its own device's memory then
runs in each process as it would in one; a kernel that copies to or signals another device
(a remote DMA or semaphore) cannot, since that device's memory lives in another process:
:func:`remote_device_operations` finds those, for the plugin to skip the test.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import jax

from . import jax_internals
from .jax_internals import INTERPRETER_MODULE, JaxInternalsChanged

_lock = threading.Lock()
_INSTALLED = "_pytest_pallas_process_local_barriers"


def install_process_local_barriers() -> None:
    """Size the TPU interpreter's per-kernel barriers to this process's devices (once).

    Installed before the plugin's kernel-exit hook, which keeps the ``_initialize_shared_memory``
    it finds as the one to call.
    """
    module = jax_internals.private_attribute(INTERPRETER_MODULE)
    original = getattr(module, "_initialize_shared_memory", None)
    if original is None or not hasattr(module, "_get_shared_memory"):
        raise JaxInternalsChanged(
            "JAX's TPU interpreter no longer has _initialize_shared_memory/_get_shared_memory; "
            "pytest-pallas cannot run it across processes on this JAX: use "
            "--pallas-interpret=plain or --pallas-processes=1.")
    if getattr(original, _INSTALLED, False):
        return
    wrapper = functools.partial(_initialize_with_local_barriers, module, original)
    setattr(wrapper, _INSTALLED, True)
    module._initialize_shared_memory = wrapper


def local_participants(mesh_devices: int, local_devices: int, global_devices: int) -> int:
    """How many of a kernel's ``mesh_devices`` run in this process: a mesh over every device
    of the run has this process's share; a smaller mesh is taken to be within the process."""
    if mesh_devices <= local_devices or global_devices <= local_devices:
        return mesh_devices
    return max(1, mesh_devices * local_devices // global_devices)


def _initialize_with_local_barriers(module: Any, original: Any, token: Any, device_id: Any,
                                    num_devices: Any, *args: Any, **kwargs: Any) -> Any:
    result = original(token, device_id, num_devices, *args, **kwargs)
    parties = local_participants(int(num_devices), jax.local_device_count(), jax.device_count())
    with _lock:
        shared = module._get_shared_memory()
        # Once per kernel: the interpreter makes new shared memory for each kernel, and
        # whichever device of this process gets here first resizes it, before any of them
        # reaches a barrier (each passes through here first).
        if getattr(shared, _INSTALLED, None) is None:
            if shared.barrier.parties != parties:
                shared.barrier = threading.Barrier(
                    parties, action=module._update_clocks_for_global_barrier)
                shared.clean_up_barrier = threading.Barrier(
                    parties, action=module._clear_shared_memory)
            setattr(shared, _INSTALLED, parties)
    return result


# The primitives of a kernel body that reach another device: a DMA whose target is a device
# (``device_id``), a semaphore signalled on another device.
_REMOTE_PRIMITIVES = ("dma_start", "semaphore_signal")


def remote_device_operations(jaxpr: Any) -> list[str]:
    """The operations of a kernel body (a jaxpr) that name another device, by primitive."""
    found: list[str] = []

    def visit(inner: Any) -> None:
        for equation in getattr(inner, "eqns", ()):
            name = equation.primitive.name
            if name in _REMOTE_PRIMITIVES and _names_a_device(equation):
                found.append(name)
            for value in equation.params.values():
                for sub in (value if isinstance(value, (tuple, list)) else (value,)):
                    body = getattr(sub, "jaxpr", sub)
                    if hasattr(body, "eqns"):
                        visit(body)

    visit(getattr(jaxpr, "jaxpr", jaxpr))
    return found


def _names_a_device(equation: Any) -> bool:
    """Whether a dma_start or semaphore_signal carries a device id (a remote one)."""
    params = equation.params
    tree = params.get("tree", params.get("args_tree"))
    if tree is None:
        return False
    try:
        args = tree.unflatten(list(equation.invars))
    except Exception:  # noqa: BLE001  (an argument layout this JAX does not share)
        return False
    # dma_start's arguments end with the target device (None for a local copy);
    # semaphore_signal's are (ref, transforms, inc, device_id, core_index).
    if equation.primitive.name == "dma_start":
        return args[-1] is not None
    return len(args) >= 4 and args[3] is not None
