"""What a test reads of a lowering or a compile is the chip's (contract §12): ``jax.stages``'
``Lowered`` and ``Compiled`` texts, cost and memory analyses, for the program lowered for the
TPU, and compiled by libtpu where it is installed.

On the CPU a Pallas kernel is lowered and compiled as JAX's interpreter, so a test asserting
what the chip's program holds (JAX's ``test_cost_analysis``, ``test_metadata_is_preserved``,
the Mosaic call's memory-space colours) would read the interpreter's. Inside
:func:`chip_artefacts_read`, ``Traced.lower`` remembers which traced program each ``Lowered``
came from, and ``Lowered.compile`` which ``Lowered`` each ``Compiled`` came from; the test's
own objects still run on the CPU (``jit(f).lower(x).compile()(x)`` computes as before), and
their readers answer from the chip's twin, made when first read:

- the traced program's jaxpr, every ``pallas_call`` in it lowered as Mosaic instead of
  interpreted (``jax_internals.as_compiled_for_the_chip``), lowered for the TPU
  (``lowering_platforms=("tpu",)``);
- with libtpu, that program over libtpu's devices of the chip (each CPU device of its
  shardings and meshes standing for the TPU device of the same index), lowered and compiled
  by libtpu: what ``Compiled`` readers answer, and ``Lowered``'s cost analysis;
- without libtpu, a ``Compiled`` reader raises :class:`ChipArtefactUnavailable`, whose one
  line names the ``tpu`` extra.

``jax.stages`` is public; what the twin is made from (``Traced``'s lowering parameters, the
jaxpr's equations) is not, and lives here, guarded.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.stages
import numpy as np

from .jax_internals import JaxInternalsChanged, as_compiled_for_the_chip

# (class of jax.stages, method): what reads the compiled program.
READERS = (("Lowered", "as_text"), ("Lowered", "compiler_ir"), ("Lowered", "cost_analysis"),
           ("Compiled", "as_text"), ("Compiled", "cost_analysis"),
           ("Compiled", "memory_analysis"))
# The readers whose answer needs libtpu's compile, beyond a lowering for the TPU.
_COMPILED = ("Compiled.as_text", "Compiled.cost_analysis", "Compiled.memory_analysis",
             "Lowered.cost_analysis")

_MAKING_TWIN: contextvars.ContextVar[bool] = contextvars.ContextVar("pallas_making_twin",
                                                                   default=False)


class ChipArtefactUnavailable(Exception):
    """The test reads the chip's compiled program, which needs libtpu here."""


@dataclasses.dataclass(frozen=True)
class ChipCompiler:
    """How the chip's twin of a program is made: ``lowering`` (a context manager factory in
    which kernels lower for the chip, as Mosaic), ``devices(n)`` (libtpu's first ``n``
    devices of the chip; None without libtpu) and ``chip`` (for messages)."""

    chip: str
    lowering: Callable[[], Any]
    devices: Callable[[int], Sequence[Any]] | None


@contextlib.contextmanager
def chip_artefacts_read(read: list[str], chip: ChipCompiler | None = None
                        ) -> Iterator[list[str]]:
    """Inside the block, each call of a :data:`READERS` method on the test's own objects
    appends its name (``"Compiled.cost_analysis"``) to ``read``; with ``chip``, the reader
    answers for the chip's twin of the program (see the module docstring). Yields ``read``."""
    origins: dict[int, tuple[Any, Any]] = {}  # id(object) -> (object, what it came from)
    twins: dict[int, Any] = {}
    stack = contextlib.ExitStack()
    traced_class, lowered_class = jax.stages.Traced, jax.stages.Lowered
    own_lower, own_compile = traced_class.lower, lowered_class.compile

    @functools.wraps(own_lower)
    def lower(self: Any, *args: Any, **kwargs: Any) -> Any:
        lowered = own_lower(self, *args, **kwargs)
        if not _MAKING_TWIN.get() and kwargs.get("lowering_platforms") is None:
            origins[id(lowered)] = (lowered, self)
        return lowered

    @functools.wraps(own_compile)
    def compile_(self: Any, *args: Any, **kwargs: Any) -> Any:
        compiled = own_compile(self, *args, **kwargs)
        if id(self) in origins:
            origins[id(compiled)] = (compiled, self)
        return compiled

    def twin_of(stage: Any, name: str) -> Any:
        key = (id(stage), name in _COMPILED)
        if key not in twins:
            twins[key] = _make_twin(stage, origins, chip, name)
        return twins[key]

    for owner, method, replacement in ((traced_class, "lower", lower),
                                       (lowered_class, "compile", compile_)):
        _replace(stack, owner, method, replacement)
    for class_name, method in READERS:
        owner = getattr(jax.stages, class_name, None)
        own = getattr(owner, method, None)
        if own is None:
            continue

        @functools.wraps(own)
        def reading(self: Any, *args: Any, _own: Any = own,
                    _name: str = f"{class_name}.{method}", **kwargs: Any) -> Any:
            if _MAKING_TWIN.get() or id(self) not in origins:
                return _own(self, *args, **kwargs)
            read.append(_name)
            if chip is None:
                return _own(self, *args, **kwargs)
            return _own(twin_of(self, _name), *args, **kwargs)

        _replace(stack, owner, method, reading)
    with stack:
        yield read


def _replace(stack: contextlib.ExitStack, owner: Any, name: str, value: Any) -> None:
    own = vars(owner)[name]
    setattr(owner, name, value)
    stack.callback(setattr, owner, name, own)


def _make_twin(stage: Any, origins: dict[int, tuple[Any, Any]], chip: ChipCompiler,
               reader: str) -> Any:
    """The chip's ``Lowered`` or ``Compiled`` standing for the test's ``stage``."""
    compiled = isinstance(stage, jax.stages.Compiled)
    lowered = origins[id(stage)][1] if compiled else stage
    traced = origins[id(lowered)][1]
    needs_libtpu = reader in _COMPILED
    if needs_libtpu and chip.devices is None:
        raise ChipArtefactUnavailable(
            f"pallas: this test reads the chip's compiled program ({reader}), which on a CPU "
            "needs the TPU compiler, libtpu: pip install 'pytest-pallas[tpu]'")
    token = _MAKING_TWIN.set(True)
    try:
        with chip.lowering():
            twin = _lowered_for_the_chip(traced, chip.devices if needs_libtpu else None)
            return twin.compile() if compiled else twin
    finally:
        _MAKING_TWIN.reset(token)


def _lowered_for_the_chip(traced: Any, devices: Callable[[int], Sequence[Any]] | None) -> Any:
    """``traced``'s program lowered for the TPU, its kernels as Mosaic: over libtpu's
    ``devices`` (then compilable), or, without them, over the traced program's own devices."""
    params = _lowering_parameters(traced)
    closed = params["jaxpr"]
    in_shardings, out_shardings = params["in_shardings"], params["out_shardings"]
    mapped: Callable[[Any], Any] = lambda value: value
    default = None
    if devices is not None:
        needed = _devices_needed((in_shardings, out_shardings, closed))
        chip_devices = devices(max(1, needed))
        mapped = functools.partial(_on_chip_devices, devices=chip_devices)
        closed = _with_params_mapped(closed, mapped)
        in_shardings, out_shardings = mapped(in_shardings), mapped(out_shardings)
        if not needed:  # placed nowhere: on the chip's first device, not JAX's default CPU
            default = jax.sharding.SingleDeviceSharding(chip_devices[0])
    run = as_compiled_for_the_chip(closed)

    def program(*args: Any) -> Any:
        return tuple(run(*args))

    program.__name__ = program.__qualname__ = str(params.get("name") or "program")
    donated = tuple(index for index, donate in enumerate(params.get("donated_invars", ()))
                    if donate)
    jitted = jax.jit(program, in_shardings=in_shardings, out_shardings=out_shardings,
                     donate_argnums=donated, keep_unused=bool(params.get("keep_unused")))
    shapes = []
    for aval, sharding in zip(closed.in_avals, in_shardings):
        if default is not None and not isinstance(sharding, jax.sharding.Sharding):
            sharding = default
        shapes.append(jax.ShapeDtypeStruct(
            aval.shape, aval.dtype,
            sharding=sharding if isinstance(sharding, jax.sharding.Sharding) else None))
    return jitted.trace(*shapes).lower(lowering_platforms=("tpu",))


def _lowering_parameters(traced: Any) -> dict[str, Any]:
    lojax = getattr(traced, "lojax", traced)
    params = getattr(lojax, "_params", None)
    if not isinstance(params, dict) or "jaxpr" not in params:
        raise JaxInternalsChanged(
            "jax.stages.Traced keeps its lowering parameters elsewhere on this JAX: a test's "
            "compiled artefacts cannot be made for the chip")
    return params


def _with_params_mapped(closed: Any, mapped: Callable[[Any], Any]) -> Any:
    """``closed`` with every equation parameter passed through ``mapped`` (meshes and
    shardings onto the chip's devices), at any depth."""
    return _rewritten(closed, lambda eqn, params: {name: mapped(value)
                                                   for name, value in params.items()})


def _is_closed_jaxpr(value: Any) -> bool:
    # jax 0.10 and 0.11 wrap a Jaxpr and its consts in a ClosedJaxpr; jax 0.12's Jaxpr holds
    # its consts and answers .jaxpr with itself.
    inner = getattr(value, "jaxpr", None)
    return inner is not None and inner is not value and hasattr(inner, "eqns")


def _rewritten(value: Any, rewrite: Callable[[Any, dict[str, Any]], dict[str, Any]]) -> Any:
    if _is_closed_jaxpr(value):
        return value.replace(jaxpr=_rewritten(value.jaxpr, rewrite))
    if hasattr(value, "eqns"):
        eqns = []
        for eqn in value.eqns:
            params = {name: _rewritten(inner, rewrite) for name, inner in eqn.params.items()}
            eqns.append(eqn.replace(params=rewrite(eqn, params)))
        return value.replace(eqns=eqns)
    if isinstance(value, tuple) and any(hasattr(item, "eqns") for item in value):
        return tuple(_rewritten(item, rewrite) for item in value)
    return value


def _devices_needed(value: Any) -> int:
    """One more than the highest device index a sharding or mesh in ``value`` names; 0 where
    none names a device."""
    highest = -1

    def visit(item: Any) -> None:
        nonlocal highest
        if isinstance(item, jax.sharding.Mesh):
            # JAX's empty mesh (no axes) holds one None for a device.
            highest = max([highest, *(device.id for device in item.devices.flat
                                      if device is not None)])
        elif isinstance(item, dict):
            visit(tuple(item.values()))
        elif isinstance(item, jax.sharding.NamedSharding):
            visit(item.mesh)
        elif isinstance(item, jax.sharding.SingleDeviceSharding):
            highest = max([highest, *(device.id for device in item.device_set)])
        elif isinstance(item, (tuple, list)):
            for inner in item:
                visit(inner)
        elif _is_closed_jaxpr(item):
            visit(item.jaxpr)
        elif hasattr(item, "eqns"):
            for eqn in item.eqns:
                visit(tuple(eqn.params.values()))

    visit(value)
    return highest + 1


def _on_chip_devices(value: Any, devices: Sequence[Any]) -> Any:
    """A mesh or sharding over CPU devices as the same over the chip's ``devices`` (CPU device
    ``i`` standing for the chip's ``i``); other values as they are."""
    if isinstance(value, jax.sharding.Mesh):
        mapped = np.vectorize(lambda device: devices[device.id], otypes=[object])(value.devices)
        return jax.sharding.Mesh(mapped, value.axis_names, axis_types=value.axis_types)
    if isinstance(value, jax.sharding.NamedSharding) and isinstance(value.mesh,
                                                                     jax.sharding.Mesh):
        return jax.sharding.NamedSharding(_on_chip_devices(value.mesh, devices), value.spec,
                                          memory_kind=value.memory_kind)
    if isinstance(value, jax.sharding.SingleDeviceSharding):
        (device,) = value.device_set
        return jax.sharding.SingleDeviceSharding(devices[device.id],
                                                 memory_kind=value.memory_kind)
    if isinstance(value, tuple) and value and not hasattr(value, "_fields"):
        return tuple(_on_chip_devices(item, devices) for item in value)
    return value
