"""The chip's numbers: how each accelerator computes a float32 matmul, with where each fact
was read, and which float32 dots of a kernel it rounds.

One home for these facts: the backend asks :func:`run_rounding` what a run interpreted on
the CPU rounds, the comparator's default matmul precision follows it, and a failing test
names the kernels that had a rounded dot (:func:`rounding_note`). The rounding itself is
``_compat.chip_matmuls``. Imports no JAX at import time.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

# --pallas-numerics: "chip" computes matmuls as the stand-in chip does, "exact" in float32.
NUMERICS = ("chip", "exact")
DEFAULT_NUMERICS = "chip"

_DUMPS = ("libtpu 0.0.42.1's post-lower-to-llo dump (PYTEST_PALLAS_KEEP_DUMP=DIR with "
          "pytest_pallas.estimate) of a Pallas jnp.dot of two float32 (128, 128) blocks: ")
_DOCSTRING = "JAX's lax.Precision docstring (jax 0.10.2): 'On TPU: performs float32 " \
             "computations in bfloat16'"


@dataclasses.dataclass(frozen=True)
class ChipMatmuls:
    """How one chip computes a float32 matmul (the MXU's passes), and the source of each."""

    chip: str
    default_rounding: str  # the operands of a DEFAULT-precision float32 dot: "bfloat16"
    default_passes: int  # MXU passes of a DEFAULT-precision float32 dot
    highest_passes: int  # MXU passes of precision=HIGHEST (float32 products)
    highest_modes: tuple[str, ...]  # the vmatmul modes of those passes, as libtpu names them
    source: str


_MEASURED = _DUMPS + ("16 llo.vmatmul in matmul_mode<round> at the default precision, 96 "
                      "in modes high, low, soft_low_eight, soft_middle_eight under "
                      "precision=HIGHEST (tests/test_chip_numerics.py reads them again "
                      "where libtpu is installed)")
_HIGHEST_MODES = ("high", "low", "soft_low_eight", "soft_middle_eight")

CHIP_MATMULS: dict[str, ChipMatmuls] = {
    chip: ChipMatmuls(chip, "bfloat16", 1, 6, _HIGHEST_MODES, _MEASURED)
    for chip in ("v4", "v5e", "v5p", "v6e", "7x")
}


def chip_matmuls(chip: str) -> ChipMatmuls:
    """The float32 matmul facts of ``chip``: measured for the chips libtpu compiles for;
    for the others (v2, v3, v4i, 7, 8i, 8t) JAX's documented TPU default, unchecked.

        >>> chip_matmuls("v5e").default_rounding
        'bfloat16'
    """
    if chip in CHIP_MATMULS:
        return CHIP_MATMULS[chip]
    return ChipMatmuls(chip, "bfloat16", 1, 6, _HIGHEST_MODES,
                       _DOCSTRING + "; the passes unchecked for this chip (libtpu does not "
                       "compile Pallas kernels for it here)")


# What is not emulated, and why (each read from the same dumps, v5e, libtpu 0.0.42.1).
NOT_EMULATED = {
    "transcendentals": "jnp.exp, jnp.tanh compile to one EUP instruction (llo.vexp.f32, "
                       "llo.vtanh.f32) whose error the chip does not publish: computed "
                       "as the CPU computes them",
    "pl.reciprocal(approx=True)": "compiles to llo.vrecip.f32.approx (approx=False: "
                                  "llo.vrecip.f32; 1 / x: llo.vrecip.f32 and a vmul); the "
                                  "approximation's error is unpublished: exact on the CPU",
    "precision=HIGH": "three bfloat16 passes on the chip: float32 products on the CPU",
    "convolutions": "lax.conv_general_dilated at the default precision: float32 on the CPU",
}


def run_rounding(platform: str, chip: str, numerics: str) -> str | None:
    """What a run rounds the operands of a default-precision float32 dot to on the CPU:
    ``"bfloat16"`` when it interprets kernels for a TPU with ``--pallas-numerics=chip``,
    else None (compiled for a device, whose own numbers count, or ``exact``)."""
    if platform != "cpu" or numerics != "chip":
        return None
    return chip_matmuls(chip).default_rounding


def header_text(platform: str, chip: str, numerics: str, *, conformance: bool = False) -> str:
    """The header's words on which numbers the run computes (``conformance``: the run has
    the packaged suite, which judges with float32 products)."""
    if platform != "cpu":
        return "numbers: the device's own"
    if numerics == "exact":
        return ("numbers: float32 matmul products (--pallas-numerics=exact); "
                "--pallas-numerics=chip rounds as the chip")
    rounding = run_rounding(platform, chip, numerics)
    suite = "; the conformance suite's with float32 products" if conformance else ""
    return (f"numbers: TPU {chip}'s, default-precision float32 matmuls with {rounding} "
            "operands in kernels and in the test's XLA dots (--pallas-numerics=exact for "
            f"float32){suite}")


# --- Which dots round ------------------------------------------------------------------------


def is_rounded_dot(equation: Any) -> bool:
    """Whether a jaxpr equation is a float32 ``dot_general`` at the default precision (an
    operand the chip rounds)."""
    if getattr(getattr(equation, "primitive", None), "name", None) != "dot_general":
        return False
    precision = equation.params.get("precision")
    if precision is None:
        per_operand: tuple[Any, ...] = (None, None)
    elif isinstance(precision, (tuple, list)):
        per_operand = tuple(precision)
    else:
        per_operand = (precision, precision)
    return any(
        _is_float32(var) and (each is None or (type(each).__name__ == "Precision"
                                               and each.name == "DEFAULT"))
        for var, each in zip(equation.invars, per_operand))


def rounded_dots(jaxpr: Any) -> int:
    """How many float32 default-precision dots ``jaxpr`` (and the jaxprs inside it) holds."""
    return sum(1 for equation in _equations(jaxpr) if is_rounded_dot(equation))


def _equations(jaxpr: Any) -> Iterator[Any]:
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)  # a ClosedJaxpr
    for equation in getattr(jaxpr, "eqns", ()):
        yield equation
        for value in equation.params.values():
            for inner in _jaxprs_in(value):
                yield from _equations(inner)


def _jaxprs_in(value: Any) -> Iterable[Any]:
    if hasattr(value, "eqns") or hasattr(getattr(value, "jaxpr", None), "eqns"):
        return (value,)
    if isinstance(value, (tuple, list)):
        return [inner for each in value for inner in _jaxprs_in(each)]
    return ()


def _is_float32(var: Any) -> bool:
    import numpy as np

    try:
        return np.dtype(var.aval.dtype) == np.float32
    except (AttributeError, TypeError):
        return False


def rounding_note(kernels: Iterable[str], chip: str) -> str:
    """The failure's line for kernels that had a default-precision float32 dot."""
    names = ", ".join(f"'{k}'" for k in dict.fromkeys(kernels))
    facts = chip_matmuls(chip)
    return (
        f"pallas: kernel {names} had a default-precision float32 dot: the chip rounds these "
        f"operands to {facts.default_rounding}; precision=HIGHEST keeps float32, at "
        f"{facts.highest_passes} MXU passes instead of {facts.default_passes} on {chip} "
        f"(pytest_pallas.estimate(fn, *args, chip='{chip}') gives the time where libtpu is "
        "installed; --pallas-numerics=exact computes in float32 on the CPU)")


@contextlib.contextmanager
def kernels_with_rounded_dots() -> Iterator[list[str]]:
    """Inside the block, the name of each TPU kernel traced that holds a default-precision
    float32 dot is added to the list yielded (GPU kernels are left out)."""
    from ._compat import gpu_interpreter, pallas_call_hooks

    found: list[str] = []

    def observe(params: dict[str, Any]) -> None:
        if rounded_dots(params.get("jaxpr")):
            found.append(_kernel_name(params))

    with pallas_call_hooks.observe_pallas_calls(gpu_interpreter.tpu_kernels_only(observe)):
        yield found


def _kernel_name(params: dict[str, Any]) -> str:
    named = params.get("name_and_src_info")
    name = getattr(named, "name", None) or params.get("name")
    if name:
        return str(name)
    info = getattr(params.get("jaxpr"), "debug_info", None)
    return str(getattr(info, "func_name", None) or "kernel")
