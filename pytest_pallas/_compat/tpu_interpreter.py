"""The TPU interpreter's state and the plugin's patches of it: races found, a reset
between tests, what each kernel left at its exit, the kernels running now, an abort
for a hung one, and a fix for vmapped grids.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

from jax.experimental.pallas import tpu as pltpu

from . import interpreter_barriers, jax_internals
from .jax_internals import INTERPRETER_MODULE, JaxInternalsChanged
from .pallas_call_hooks import observer_lock


def races_found() -> bool:
    """Whether the TPU interpreter's race detector flagged a race since the last reset."""
    state = jax_internals.private_attribute(INTERPRETER_MODULE, "races")
    return bool(state is not None and getattr(state, "races_found", False))


def reset_interpreter_state() -> None:
    """Drop the TPU interpreter's shared memory, semaphores and race state.

    A kernel that raised while being interpreted leaves this state behind, and
    the next interpreted kernel would then fail; public API since jax 0.7.
    """
    pltpu.reset_tpu_interpret_mode_state()
    with observer_lock:
        _running_kernels.clear()
        _kernel_entered.clear()
    interpreter_barriers.forget()
    _drop_failed_effect_tokens()


def _drop_failed_effect_tokens() -> None:
    # Interpreted kernels are ordered effects (io_callback): each computation takes
    # the previous one's token, so the token of a computation that failed inside the
    # interpreter re-raises its error from every later kernel (a crash in one test
    # showed up as the same crash in the next). Start the next test from no token.
    try:
        tokens = jax_internals.private_attribute("jax._src.dispatch", "runtime_tokens")
        tokens.clear()
    except (JaxInternalsChanged, AttributeError):
        pass


@contextlib.contextmanager
def vmapped_grid_semantics_fixed() -> Iterator[None]:
    """Let the TPU interpreter run a vmapped ``pallas_call`` that has ``dimension_semantics``.

    ``jax.vmap`` of a ``pallas_call`` prepends a grid axis; Mosaic's lowering
    gives that axis "parallel" semantics, but JAX's TPU interpreter (0.10.2)
    zips the grid with the user's shorter ``dimension_semantics`` and raises
    ``safe_zip() argument 1 has length 3 but argument 0 has length 4``. Inside
    this context the interpreter treats missing leading axes as "parallel",
    as the compiler does. A no-op for JAX releases where the semantics
    already cover the grid.
    """
    module = jax_internals.private_attribute(INTERPRETER_MODULE)
    original = getattr(module, "_get_parallel_dim_semantics", None)
    if original is None:
        yield
        return

    def covering_vmapped_axes(mosaic_params, num_dimensions_in_grid):
        semantics = getattr(mosaic_params, "dimension_semantics", None)
        if semantics is not None and len(semantics) < num_dimensions_in_grid:
            missing = num_dimensions_in_grid - len(semantics)
            return (True,) * missing + tuple(original(mosaic_params, len(semantics)))
        return original(mosaic_params, num_dimensions_in_grid)

    module._get_parallel_dim_semantics = covering_vmapped_axes
    try:
        yield
    finally:
        module._get_parallel_dim_semantics = original


# (shared memory, error) of the last abort, by identity: which call is a second one.
_last_abort: tuple[int, int] | None = None


def abort_interpreted_kernels(error: Exception) -> bool:
    """Make every TPU-interpreted kernel that is waiting (semaphore, DMA, barrier) raise ``error``.

    The interpreter's waits poll its shared memory's failure slot every
    0.1 s; filling it (as the interpreter does when one device fails) ends a
    wait that nobody will ever signal. Called again with the same ``error`` (the
    watchdog calls it until the test returns), it breaks the clean-up barrier too.
    Returns False when no kernel is running.
    """
    module = jax_internals.private_attribute(INTERPRETER_MODULE)
    shared_memory = getattr(module, "_shared_memory", None)
    if shared_memory is None:
        return False
    lock = getattr(shared_memory, "lock", None)
    if lock is None or not hasattr(shared_memory, "_failure"):
        raise JaxInternalsChanged(
            "the TPU interpreter's shared memory no longer has a failure slot; "
            "--pallas-timeout cannot stop a hung kernel on this JAX."
        )
    global _last_abort
    with lock:
        # "Again" by our own record, not by the failure slot: a device that failed on its
        # own first fills the slot with its error, and the barrier must still break.
        again = _last_abort == (id(shared_memory), id(error))
        _last_abort = (id(shared_memory), id(error))
        if shared_memory._failure is None:
            shared_memory._failure = error
    # The clean-up barrier only on a second call: a device whose wait broke waits there
    # for the others (the interpreter's failure path), which a device that never started
    # the kernel never reaches; broken at once, it would replace the failure's message
    # (ours) with a bare BrokenBarrierError even where every device gets there.
    for name in ("barrier", "clean_up_barrier") if again else ("barrier",):
        barrier = getattr(shared_memory, name, None)
        if barrier is not None:
            barrier.abort()
    return True


@dataclasses.dataclass(frozen=True)
class KernelExitState:
    """What one interpreted pallas_call left behind on one device."""

    kernel: str
    device: int
    unbalanced_semaphores: tuple[tuple[int, int, int], ...]  # (semaphore id, core, count)
    pending_dmas: tuple[tuple[int, int, int], ...]  # (semaphore id, core, DMAs never waited)
    race_found: bool

    @property
    def clean(self) -> bool:
        return not (self.unbalanced_semaphores or self.pending_dmas or self.race_found)


_exit_recorders: list[list[KernelExitState]] = []


_exit_hook_error: JaxInternalsChanged | None = None


# Replacements of the interpreter module's functions while one kernel lowers: each provider
# is asked with the kernel's name and interpret_pallas_call's keyword arguments.
LoweringReplacements = Callable[[str, dict[str, Any]], dict[str, Any]]
_lowering_providers: list[LoweringReplacements] = []


# How many devices are inside each interpreted kernel now (entered, not yet at the exit check).
_running_kernels: collections.Counter[str] = collections.Counter()


# When each kernel last started (time.monotonic()), for --pallas-timeout's per-kernel clock.
_kernel_entered: dict[str, float] = {}


# Whether this JAX's interpreter lets kernel entries be seen at all.
_kernel_entries_observed = False


# When (time.monotonic()) a kernel last started or ended on some device: --pallas-timeout
# times the test's work outside its kernels from there.
_last_kernel_event: float | None = None


def running_interpreted_kernels() -> list[str]:
    """The kernels the TPU interpreter is running now (what a hung test is waiting in).

    Known for kernels lowered after :func:`install_kernel_exit_hook`; a kernel
    that raised stays listed until :func:`reset_interpreter_state`.
    """
    return list(running_interpreted_kernel_ages() or ())


def last_interpreted_kernel_event() -> float | None:
    """When (``time.monotonic()``) a TPU-interpreted kernel last started or ended on some
    device; None if none has since :func:`install_kernel_exit_hook`."""
    return _last_kernel_event


def running_interpreted_kernel_ages() -> dict[str, float] | None:
    """Seconds since each kernel the TPU interpreter is running now started.

    None when kernel entries are not seen: before :func:`install_kernel_exit_hook`,
    or on a JAX whose interpreter hides them (then the caller can only time the
    whole test). Same caveats as :func:`running_interpreted_kernels`.
    """
    if not _kernel_entries_observed:
        return None
    now = time.monotonic()
    with observer_lock:
        return {kernel: now - _kernel_entered.get(kernel, now)
                for kernel, devices in _running_kernels.items() if devices > 0}


@contextlib.contextmanager
def record_kernel_exits() -> Iterator[list[KernelExitState]]:
    """Collect a :class:`KernelExitState` for each kernel the TPU interpreter finishes.

    The interpreter itself only prints a semaphore left with a non-zero count
    (raising there could hang the other simulated devices), says nothing of a
    DMA started and never waited for in its default "on_wait" DMA mode, and
    keeps the race flag of the last kernel only. This wraps its exit check to
    record all three per kernel and per device; the caller decides to fail.
    Kernels lowered before the hook was first installed (jit caches) keep the
    old exit check: install it early with :func:`install_kernel_exit_hook`.
    """
    global _exit_hook_error
    install_kernel_exit_hook()
    found: list[KernelExitState] = []
    with observer_lock:
        _exit_recorders.append(found)
    try:
        yield found
    finally:
        with observer_lock:
            # By identity: recorders are lists, and equal lists are not the same recorder.
            _exit_recorders[:] = [r for r in _exit_recorders if r is not found]
    if _exit_hook_error is not None:
        error, _exit_hook_error = _exit_hook_error, None
        raise error


@contextlib.contextmanager
def suspend_kernel_exit_recording() -> Iterator[None]:
    """Inside the block, recorders already active see no kernel exits (new ones do).

    For tests that run a kernel known to leave a semaphore unbalanced, to see
    what the interpreter does with it, under a harness that records exits.
    """
    with observer_lock:
        saved = list(_exit_recorders)
        _exit_recorders.clear()
    try:
        yield
    finally:
        with observer_lock:
            _exit_recorders[:0] = saved


@contextlib.contextmanager
def replaced_while_kernels_lower(provider: LoweringReplacements) -> Iterator[None]:
    """Inside the block, each kernel the TPU interpreter lowers sees the interpreter module's
    functions that ``provider(kernel, params)`` returns (name to replacement) in place of
    JAX's, for that kernel alone: what the lowering stages (its callbacks) is then theirs.
    A kernel lowered earlier and cached by jit keeps what it was lowered with."""
    install_kernel_exit_hook()
    with observer_lock:
        _lowering_providers.append(provider)
    try:
        yield
    finally:
        with observer_lock:
            _lowering_providers[:] = [each for each in _lowering_providers
                                      if each is not provider]


def install_kernel_exit_hook() -> None:
    """Install (once) the wrapper behind :func:`record_kernel_exits`; idle when nobody records."""
    module = jax_internals.private_attribute(INTERPRETER_MODULE)
    current = jax_internals.private_attribute(INTERPRETER_MODULE, "interpret_pallas_call")
    original_validate = jax_internals.private_attribute(INTERPRETER_MODULE, "_validate")
    if getattr(current, "_pytest_pallas_exit_hook", False):
        return
    # Called as each kernel starts on each device. Only names what is running, for
    # --pallas-timeout's message: without it that message names the test instead.
    original_initialize = getattr(module, "_initialize_shared_memory", None)
    # The barrier every device of the mesh waits at before the kernel runs: who waited.
    original_barrier = getattr(module, "_barrier", None)

    def interpret_pallas_call(*args: Any, **kwargs: Any) -> Any:
        kernel = jax_internals.kernel_name(kwargs)
        # interpret_pallas_call looks _validate up when it stages the exit
        # check, so swapping it for the duration of this call names the kernel.
        module._validate = functools.partial(_validate_and_record, original_validate, kernel)
        if original_initialize is not None:
            module._initialize_shared_memory = functools.partial(
                _enter_kernel, original_initialize, kernel)
        if original_barrier is not None:
            module._barrier = interpreter_barriers.start_barrier_for(
                original_barrier, kernel, kwargs.get("jaxpr"))
        with observer_lock:
            providers = tuple(_lowering_providers)
        replacements: dict[str, Any] = {}
        for provider in providers:
            replacements.update(provider(kernel, kwargs))
        try:
            with jax_internals.attributes_replaced(module, replacements):
                return current(*args, **kwargs)
        finally:
            module._validate = original_validate
            if original_initialize is not None:
                module._initialize_shared_memory = original_initialize
            if original_barrier is not None:
                module._barrier = original_barrier

    global _kernel_entries_observed
    _kernel_entries_observed = original_initialize is not None
    interpret_pallas_call._pytest_pallas_exit_hook = True  # type: ignore[attr-defined]
    interpret_pallas_call.__wrapped__ = current  # type: ignore[attr-defined]
    module.interpret_pallas_call = interpret_pallas_call


def _enter_kernel(original: Callable[..., Any], kernel: str, *args: Any, **kwargs: Any) -> Any:
    global _last_kernel_event
    with observer_lock:
        _running_kernels[kernel] += 1
        _kernel_entered[kernel] = _last_kernel_event = time.monotonic()  # restarts its clock
    return original(*args, **kwargs)


def _validate_and_record(
    original: Callable[..., Any], kernel: str, token: Any, device_id: Any
) -> Any:
    global _last_kernel_event
    with observer_lock:
        _last_kernel_event = time.monotonic()
        if _running_kernels[kernel] > 0:
            _running_kernels[kernel] -= 1
    if _exit_recorders:
        module = jax_internals.private_attribute(INTERPRETER_MODULE)
        device = int(device_id)
        unbalanced: list[tuple[int, int, int]] = []
        pending: list[tuple[int, int, int]] = []
        try:
            shared = module._get_shared_memory()
            for semaphore, core in shared.get_sempahores_with_nonzero_count(device):
                count = int(semaphore.count_by_core[core])
                unbalanced.append((int(semaphore.id), int(core), count))
            with shared.lock:
                semaphores = list(shared.sem.values()) + list(shared.fixed_id_sem.values())
            for semaphore in semaphores:
                with semaphore.cv:
                    for core in shared.get_global_core_ids(device):
                        # A task outlives its DMA when another core ran the DMA for it.
                        if waiting := sum(map(_dma_unfinished, semaphore.tasks[core])):
                            pending.append((int(semaphore.id), int(core), waiting))
            races = getattr(module, "races", None)
            race_found = bool(races is not None and getattr(races, "races_found", False))
        except AttributeError as error:
            # Raising inside the interpreter's callback could hang the other
            # simulated devices; record_kernel_exits raises it afterwards.
            global _exit_hook_error
            _exit_hook_error = JaxInternalsChanged(
                f"the TPU interpreter's shared memory changed shape ({error!r}); pytest-pallas "
                "cannot check semaphores at kernel exit on this JAX."
            )
            return original(token, device_id)
        state = KernelExitState(kernel, device, tuple(unbalanced), tuple(pending), race_found)
        with observer_lock:
            for found in _exit_recorders:
                found.append(state)
    return original(token, device_id)


def _dma_unfinished(task: Any) -> bool:
    # Tasks are bound methods of the interpreter's DMA objects: a read task
    # is done once its DMA has read, any other once the DMA has completed.
    dma = getattr(task, "__self__", None)
    if _moves_no_bytes(dma):
        return False  # a zero-length copy: its wait of 0 bytes returns before it runs
    state = getattr(getattr(dma, "state", None), "name", None)
    if getattr(task, "__name__", None) == "execute_read":
        return state == "STARTED"
    return state != "COMPLETED"


def _moves_no_bytes(dma: Any) -> bool:
    # A DMA whose source or destination is indexed by an empty slice (pl.ds(start, 0), as
    # kernels size the copy of a no-op tile) moves nothing: on the chip it completes at once.
    for transforms in (getattr(dma, "src_transforms", ()), getattr(dma, "dst_transforms", ())):
        for transform in transforms or ():
            for index in getattr(transform, "indices", ()):
                size = getattr(index, "size", None)
                try:
                    if size is not None and int(size) == 0:
                        return True
                except (TypeError, ValueError):
                    continue
    return False
