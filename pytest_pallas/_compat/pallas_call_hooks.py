"""Hooks on the ``pallas_call`` primitive: observing each traced call (and which of its
outputs the program uses), keeping a call's own interpret params, forcing the
interpreter where a call is made. Each is a context manager that puts JAX back as
it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax import export
from jax.experimental.pallas import tpu as pltpu

from . import device_kinds, interpreter_fixes, jax_internals, plain_path
from .jax_internals import PALLAS_CALL_MODULE, JaxInternalsChanged

_PARTIAL_EVAL = "jax._src.interpreters.partial_eval"


# (observer, whether it also takes the call's input avals)
_observers: list[tuple[Callable[..., None], bool]] = []


observer_lock = threading.RLock()


_live_observations = 0


_unobserve: Callable[[], None] | None = None


@contextlib.contextmanager
def observe_pallas_calls(observer: Callable[..., None], *,
                         with_avals: bool = False) -> Iterator[None]:
    """Call ``observer(params)`` with each ``pallas_call`` equation's params as it is traced.

    With ``with_avals=True`` the observer is called ``observer(params, avals)``,
    ``avals`` being the abstract values of the call's operands (shapes and dtypes
    as traced, per device inside ``shard_map``).

    Every ``pallas_call`` is staged into a jaxpr, even an eager one (it binds
    through an inner ``jit``), under ``jit``, ``vmap`` (the batching rule binds
    a new call with a batched grid: the observer sees both) and ``shard_map``.
    The hook sits where tracing asks for the primitive's abstract value,
    before JAX's cache of those, so a call identical to one traced before is
    seen again. A whole function whose trace ``jit`` cached is not traced
    again, though, so it is not seen again: an observer that raises aborts
    the trace, which then is not cached, so a failing kernel fails on every
    call. Observers nest; the hook is removed when the last one leaves.

        with observe_pallas_calls(lambda params: print(params["name"])):
            my_kernel(x)
    """
    global _live_observations, _unobserve
    with observer_lock:
        if _live_observations == 0:
            _unobserve = _install_observation()
        _live_observations += 1
        entry = (observer, with_avals)
        _observers.append(entry)
    try:
        yield
    finally:
        with observer_lock:
            _observers[:] = [o for o in _observers if o is not entry]
            _live_observations -= 1
            if _live_observations == 0 and _unobserve is not None:
                _unobserve()
                _unobserve = None


# When the observers of the pallas_call being traced now started (time.monotonic()), and
# when the last ones ended: the plugin's checks of a kernel (the TPU compiler's verdict takes
# seconds), which --pallas-timeout times as a kernel's, not as the test's own work.
_observing_since: float | None = None
_observed_last: float | None = None


def observers_running_since() -> float | None:
    """When the observers of the pallas_call being traced now started; None when none run."""
    return _observing_since


def observers_last_ended() -> float | None:
    """When the observers of a traced pallas_call last ended; None if they never ran."""
    return _observed_last


def _notify_observers(params: dict[str, Any], avals: tuple[Any, ...]) -> None:
    global _observing_since, _observed_last
    outermost = _observing_since is None
    if outermost:
        _observing_since = time.monotonic()
    try:
        for each, with_avals in tuple(_observers):
            if with_avals:
                each(params, avals)
            else:
                each(params)
    finally:
        if outermost:
            _observing_since, _observed_last = None, time.monotonic()


def _install_observation() -> Callable[[], None]:
    primitive = jax_internals.pallas_call_primitive()
    staging = jax_internals.private_attribute(_PARTIAL_EVAL)
    cached = getattr(staging, "_cached_abstract_eval", None)
    if callable(cached):
        # DynamicJaxprTrace looks this up on every bind it stages.
        def observed_cached_abstract_eval(prim: Any, *avals: Any, **params: Any) -> Any:
            if prim is primitive:
                _notify_observers(params, avals)
            return cached(prim, *avals, **params)

        staging._cached_abstract_eval = observed_cached_abstract_eval
        return lambda: setattr(staging, "_cached_abstract_eval", cached)
    # Without that cache, the primitive's own rule runs on every trace.
    original = getattr(primitive, "abstract_eval", None)
    if not callable(original):
        raise JaxInternalsChanged(
            f"{PALLAS_CALL_MODULE}.pallas_call_p has no abstract_eval rule to observe; "
            "pytest-pallas cannot check kernels as they are traced on this JAX."
        )

    def observed_abstract_eval(*avals: Any, **params: Any) -> Any:
        _notify_observers(params, avals)
        return original(*avals, **params)

    primitive.abstract_eval = observed_abstract_eval
    return lambda: setattr(primitive, "abstract_eval", original)


@contextlib.contextmanager
def suspend_pallas_call_observers() -> Iterator[None]:
    """Inside the block, no observer of :func:`observe_pallas_calls` (nor of
    :func:`observe_pallas_call_uses`) is called.

    For tests that run a kernel known to break a static rule in order to see
    what the interpreter does with it, and for the compile check, which binds
    a traced call again on its own (every output of it then counts as used).
    """
    with observer_lock:
        saved, saved_uses = list(_observers), list(_use_observers)
        _observers.clear()
        _use_observers.clear()
    try:
        yield
    finally:
        with observer_lock:
            _observers[:0] = saved
            _use_observers[:0] = saved_uses


_use_observers: list[Callable[[dict[str, Any], tuple[bool, ...]], None]] = []


_unobserve_uses: Callable[[], None] | None = None


@contextlib.contextmanager
def observe_pallas_call_uses(
    observer: Callable[[dict[str, Any], tuple[bool, ...]], None],
) -> Iterator[bool]:
    """Inside the block, ``observer(params, used_outputs)`` is called for each pallas_call that a
    jit lowering keeps, with which of its outputs the program uses.

    JAX removes unused values (dead-code elimination) before it lowers a
    program, and asks each equation which inputs it needs given the outputs
    used; this hooks that question for ``pallas_call``. Yields False (and
    observes nothing) when this JAX has no such rule to hook.
    """
    global _unobserve_uses
    try:
        rules = jax_internals.private_attribute(_PARTIAL_EVAL, "dce_rules")
        primitive = jax_internals.pallas_call_primitive()
    except JaxInternalsChanged:
        yield False
        return
    with observer_lock:
        if not _use_observers:
            original = rules.get(primitive)

            # (used_outs, eqn) up to jax 0.10; (used_outs, live_ins, eqn) from 0.11.
            def observed_dce_rule(used_outs: Any, *rest: Any) -> Any:
                equation = rest[-1]
                for each in tuple(_use_observers):
                    each(equation.params, tuple(bool(u) for u in used_outs))
                if original is None:
                    return [True] * len(equation.invars), equation
                return original(used_outs, *rest)

            rules[primitive] = observed_dce_rule

            def restore() -> None:
                if original is None:
                    rules.pop(primitive, None)
                else:
                    rules[primitive] = original

            _unobserve_uses = restore
        _use_observers.append(observer)
    try:
        yield True
    finally:
        with observer_lock:
            _use_observers[:] = [o for o in _use_observers if o is not observer]
            if not _use_observers and _unobserve_uses is not None:
                _unobserve_uses()
                _unobserve_uses = None


@contextlib.contextmanager
def own_interpret_params_kept(
    merge: Callable[[Any, Any], tuple[Any, list[str]]],
    changed: Callable[[str, list[str]], None],
) -> Iterator[bool]:
    """Inside the block, a pallas_call that passes its own ``pltpu.InterpretParams`` under a
    forced TPU interpret mode runs with ``merge(own, forced)[0]``; ``changed(kernel name,
    changes)`` hears what the merge changed. Yields False (and keeps JAX's behaviour:
    forced parameters win) when this JAX's pallas_call cannot be wrapped."""
    try:
        module = jax_internals.private_attribute(PALLAS_CALL_MODULE)
        original = module._pallas_call
        context = jax_internals.private_attribute(
            "jax._src.config", "pallas_tpu_interpret_mode_context_manager"
        )
    except (JaxInternalsChanged, AttributeError):
        yield False
        return

    @functools.wraps(original)
    def keeping_own_params(kernel: Any, out_shape: Any, **kwargs: Any) -> Any:
        own = kwargs.get("interpret")
        forced = context.value
        if not (isinstance(own, pltpu.InterpretParams)
                and isinstance(forced, pltpu.InterpretParams)):
            return original(kernel, out_shape, **kwargs)
        merged, changes = merge(own, forced)
        if changes:
            changed(kwargs.get("name") or getattr(kernel, "__name__", "kernel"), changes)
        with pltpu.force_tpu_interpret_mode(None):
            return original(kernel, out_shape, **{**kwargs, "interpret": merged})

    module._pallas_call = keeping_own_params
    try:
        yield True
    finally:
        module._pallas_call = original


@contextlib.contextmanager
def forced_interpreter_when_called() -> Iterator[bool]:
    """Inside the block, a forced TPU interpret mode reaches every ``pallas_call`` traced, even
    one built before it was forced.

    JAX (0.10 to 0.12) reads the forced mode when ``pl.pallas_call(...)`` is *built*: a call
    built at import time, as in Pallas's own ``@functools.partial(pl.pallas_call,
    out_shape=...)`` idiom, kept ``interpret=False`` and failed in a Pallas test with "Only
    interpret mode is supported on CPU backend". Here the forced mode replaces a call's
    ``interpret=False`` when the call is traced, which is what ``force_tpu_interpret_mode``
    promises; a call's own interpreter parameters are left alone. Yields False (JAX's
    behaviour) when the primitive cannot be hooked.
    """
    try:
        primitive = jax_internals.pallas_call_primitive()
        context = jax_internals.private_attribute(
            "jax._src.config", "pallas_tpu_interpret_mode_context_manager"
        )
    except JaxInternalsChanged:
        yield False
        return
    had_own = "bind" in vars(primitive)
    previous = primitive.bind

    def bind(*args: Any, **params: Any) -> Any:
        forced = context.value
        if forced is not None and params.get("interpret") is False:
            params = {**params, "interpret": forced}
        if forced is not None and params.get("interpret") is forced:
            params = {**params, "interpret": _reads_as_the_kernel_asks(forced, params)}
        # A kernel the TPU interpreter would run no differently: the plain path.
        params = plain_path.routed(params)
        return previous(*args, **params)

    primitive.bind = bind
    try:
        yield True
    finally:
        if had_own:
            primitive.bind = previous
        else:
            del primitive.bind


def _reads_as_the_kernel_asks(forced: Any, params: dict[str, Any]) -> Any:
    """The forced interpreter parameters for one kernel: one compiled with
    ``pltpu.CompilerParams(disable_bounds_checks=True)`` reads out of bounds without an error,
    as on the chip, where libtpu then emits no bounds check, a DMA's included
    (``_compat.out_of_bounds``): what it reads there is uninitialised
    (``out_of_bounds_reads="uninitialized"``), not a stop."""
    if not getattr(params.get("compiler_params"), "disable_bounds_checks", False):
        return forced
    if getattr(forced, "out_of_bounds_reads", None) != "raise" or not dataclasses.is_dataclass(
            forced):
        return forced
    return dataclasses.replace(forced, out_of_bounds_reads="uninitialized")


def exported_pallas_call(params: dict[str, Any], avals: Sequence[Any], tpu_info: Any) -> Any:
    """One traced pallas_call, lowered for the TPU with ``jax.export``, ready to pickle.

    Lowering needs no TPU; ``pltpu.get_tpu_info()`` answers for the chip meanwhile.
    An ``Exported`` holds a local function (``_get_vjp``, for differentiation,
    which the schedule does not need) that pickle refuses; it is dropped.
    """
    def call(*args: Any) -> Any:
        return jax_internals.bind_pallas_call(params, *args)

    shapes = [jax.ShapeDtypeStruct(aval.shape, aval.dtype) for aval in avals]
    host_kind = jax.devices()[0].device_kind
    with (jax_internals.outside_current_trace(), suspend_pallas_call_observers(),
          pltpu.force_tpu_interpret_mode(None),
          device_kinds.device_kind_answers_as(host_kind, lambda: tpu_info)):
        exported = export.export(jax.jit(call), platforms=["tpu"])(*shapes)
    if dataclasses.is_dataclass(exported) and hasattr(exported, "_get_vjp"):
        exported = dataclasses.replace(exported, _get_vjp=None)
    return exported


def exported_equation(equation: Any, tpu_info: Any) -> Any:
    """One traced equation of arrays holding a kernel (``pl.kernel``'s, or the ``run_state``
    around a ``pl.core_map``), lowered for the TPU with ``jax.export``, ready to pickle.

    The chip answers ``pltpu.get_tpu_info()`` and stands as JAX's abstract device
    meanwhile: a TensorCore mesh's lowering reads both.
    """
    def call(*args: Any) -> Any:
        return equation.primitive.bind(*args, **equation.params)

    shapes = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in equation.invars]
    host_kind = jax.devices()[0].device_kind
    with (jax_internals.outside_current_trace(), suspend_pallas_call_observers(),
          pltpu.force_tpu_interpret_mode(None),
          device_kinds.device_kind_answers_as(host_kind, lambda: tpu_info),
          jax_internals.optional_feature(
              "the stand-in chip as JAX's abstract device",
              lambda: interpreter_fixes.chip_as_abstract_device(
                  host_kind, tpu_info.num_cores, replace_stand_in=True))):
        exported = export.export(jax.jit(call), platforms=["tpu"])(*shapes)
    if dataclasses.is_dataclass(exported) and hasattr(exported, "_get_vjp"):
        exported = dataclasses.replace(exported, _get_vjp=None)
    return exported


@dataclasses.dataclass(frozen=True)
class PipelineSeen:
    """One ``pltpu.emit_pipeline`` a kernel ran while traced: its grid, blocks and operands."""

    grid: tuple[Any, ...]  # an entry may be traced (a trip count read from data)
    in_specs: tuple[Any, ...]
    out_specs: tuple[Any, ...]
    in_shapes: tuple[tuple[tuple[int, ...], Any], ...]  # (shape, dtype) of each operand
    out_shapes: tuple[tuple[tuple[int, ...], Any], ...]
    # The body traced once more with the grid indices as its jaxpr's inputs (what its
    # pl.program_id calls return), for evaluating its pl.when predicates; None if it failed.
    body_over_indices: Any = None


@contextlib.contextmanager
def observe_emit_pipelines(observer: Callable[[PipelineSeen], None]) -> Iterator[bool]:
    """Inside the block, every ``pltpu.emit_pipeline`` a kernel calls is also handed to
    ``observer`` (its grid, BlockSpecs, operand shapes) when the pipeline runs.

    Wraps ``pltpu.emit_pipeline`` and the name in JAX's pipeline module; a kernel
    that bound the function to a name of its own before is not seen. Yields False
    where this JAX has no such function.
    """
    try:
        original = jax_internals.private_attribute(jax_internals.PIPELINE_MODULE,
                                                   "emit_pipeline")
    except (JaxInternalsChanged, AttributeError):
        yield False
        return

    @functools.wraps(original)
    def observed(body: Any, *args: Any, **kwargs: Any) -> Any:
        traced: dict[str, Any] = {}

        @functools.wraps(body)
        def analysed_body(*refs: Any, **body_kwargs: Any) -> Any:
            if "jaxpr" not in traced:
                traced["jaxpr"] = _body_over_indices(body, refs, body_kwargs,
                                                     tuple(kwargs.get("grid", ())))
            return body(*refs, **body_kwargs)

        pipeline = original(analysed_body, *args, **kwargs)
        in_specs, out_specs = kwargs.get("in_specs", ()), kwargs.get("out_specs", ())

        def flat(specs: Any) -> tuple[Any, ...]:
            return tuple(specs) if isinstance(specs, (list, tuple)) else (specs,)

        @functools.wraps(pipeline)
        def run(*refs: Any, **run_kwargs: Any) -> Any:
            try:
                ins, outs = flat(in_specs), flat(out_specs)
                shapes = [(tuple(r.shape), r.dtype) for r in refs]
                seen = PipelineSeen(tuple(kwargs.get("grid", ())), ins, outs,
                                    tuple(shapes[:len(ins)]),
                                    tuple(shapes[len(ins):len(ins) + len(outs)]))
            except Exception:  # noqa: BLE001  # a pipeline it cannot read is not counted
                return pipeline(*refs, **run_kwargs)
            result = pipeline(*refs, **run_kwargs)  # traces the body
            observer(dataclasses.replace(seen, body_over_indices=traced.get("jaxpr")))
            return result

        return run

    with jax_internals.emit_pipeline_replaced(observed):
        yield True


def _body_over_indices(body: Any, refs: Any, kwargs: dict[str, Any],
                       grid: tuple[Any, ...]) -> Any:
    """``body``'s jaxpr whose inputs are the pipeline's grid indices, or None."""
    if not all(isinstance(size, (int, np.integer)) for size in grid):
        return None
    try:
        pallas_core = jax_internals.private_attribute("jax._src.pallas.core")

        def over(*indices: Any) -> tuple[()]:
            axes = [pallas_core.GridAxis(i, int(size)) for i, size in zip(indices, grid)]
            with pallas_core.grid_env(axes):
                body(*refs, **kwargs)
            return ()

        return jax.make_jaxpr(over)(*[np.int32(0)] * len(grid))
    except Exception:  # noqa: BLE001  # a body it cannot trace again is weighed as taken
        return None
