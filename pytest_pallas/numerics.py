"""The chip's numbers: how each accelerator computes a float32 matmul (each TPU chip, and the
GPU a CPU run stands for), with where each fact was read, and which float32 dots of a
kernel it rounds.

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
    "XLA's matrix-vector dots on 7x": "7x runs them on the MXU, the matrix packed to bfloat16 "
                                      "(vpack.c.bf16, vmatmul; v4 to v6e: vmul.f32, as a "
                                      "kernel's on every chip; read once, libtpu 0.0.42.1): "
                                      "float32 on the CPU for every chip",
}


# --- Each form a dot takes, on the kernel's side and on the test's (TPU) -------------------


@dataclasses.dataclass(frozen=True)
class DotForm:
    """What the chip does with the operands of one form of default-precision dot."""

    side: str  # "kernel": a Pallas kernel's dot (Mosaic); "xla": the test's own XLA dot
    operands: str  # "bfloat16": rounded, one MXU pass; "float32": float32 products, no MXU
    emitted: str  # what libtpu emits for it (DOT_FORMS_SOURCE)


DOT_FORMS_SOURCE = (
    "libtpu 0.0.42.1, v5e, jax 0.10.2: each form of tests/dot_battery.py compiled for the "
    "chip with libtpu's dumps on (--xla_mosaic_dump_to, --xla_jf_dump_to); a kernel's "
    "llo.vmatmul by matmul_mode in Mosaic's post-lower-to-llo dump, XLA's own vmatmul by data "
    "format in each fusion's first LLO (*-original.txt), vmul.f32 in either "
    "(_compat.libtpu_dump.dot_instructions; tests/test_dot_forms.py reads them again where "
    "libtpu is installed; with libtpu 0.0.50.1 and jax 0.12 it finds the same). Operands "
    "(128, 128) float32 unless named; 2 x (128, 128) batched")

_ROUND = "llo.vmatmul in matmul_mode<round> (HIGHEST: six times as many, in its six modes)"
_BF16 = "vmatmul.bf16, its float32 operands packed to bfloat16 (vpack.c.bf16); HIGHEST: " \
        "96 vmatmul.f32"
_ONE_F32_PASS = ("32 vmatmul.f32, one pass where HIGHEST takes 192 (six): float32 data that the "
                 "MXU rounds (the LLO text prints no mode; Mosaic's one-pass float32 "
                 "vmatmul is matmul_mode<round>)")

DOT_FORMS: dict[str, DotForm] = {
    "kernel: jnp.dot": DotForm("kernel", "bfloat16", "16 " + _ROUND),
    "kernel: dot_general, rhs transposed": DotForm("kernel", "bfloat16", "16 " + _ROUND),
    "kernel: x @ y.T": DotForm("kernel", "bfloat16", "16 " + _ROUND),
    "kernel: dot_general, lhs transposed": DotForm("kernel", "bfloat16", "16 " + _ROUND),
    "kernel: einsum, batched, rhs transposed": DotForm("kernel", "bfloat16", "32 " + _ROUND),
    "kernel: preferred_element_type=float32": DotForm("kernel", "bfloat16", "16 " + _ROUND),
    "kernel: bfloat16, y.T + 1 fused into the dot": DotForm(
        "kernel", "bfloat16", "the sum packed to bfloat16 (llo.vpack), then 8 llo.vmatmul on "
                              "bfloat16 data"),
    "kernel: matrix-vector": DotForm("kernel", "float32", "no vmatmul: 16 vmul.f32"),
    "kernel: in vmap": DotForm("kernel", "bfloat16", "16 " + _ROUND),
    "kernel: in shard_map": DotForm("kernel", "bfloat16", "16 " + _ROUND + ", on each device"),
    "xla: jnp.dot": DotForm("xla", "bfloat16", "8 " + _BF16),
    "xla: x @ y.T, the transpose fused into the dot": DotForm(
        "xla", "bfloat16", "the transpose folded into the convolution (dim_labels bf_oi->bf), "
                           "8 " + _BF16),
    "xla: dot_general, rhs transposed": DotForm("xla", "bfloat16", "8 " + _BF16),
    "xla: dot_general, lhs transposed": DotForm("xla", "bfloat16", "8 " + _BF16),
    "xla: einsum, batched, rhs transposed": DotForm("xla", "bfloat16", _ONE_F32_PASS),
    "xla: preferred_element_type=float32": DotForm("xla", "bfloat16", "8 " + _BF16),
    "xla: bfloat16, y.T + 1 fused into the dot": DotForm(
        "xla", "bfloat16", "the sum converted to bf16 in the optimized HLO, then 8 "
                           "vmatmul.bf16"),
    "xla: in vmap": DotForm("xla", "bfloat16", _ONE_F32_PASS),
    "xla: in shard_map": DotForm("xla", "bfloat16", "8 " + _BF16 + ", on each device"),
    "xla: lax.dot of two vectors": DotForm("xla", "float32", "no vmatmul: a vmul.f32 and a "
                                                             "vadd.xlane.f32"),
    "xla: matrix-vector": DotForm("xla", "float32", "no vmatmul: 16 vmul.f32"),
}


# --- A GPU's float32 matmuls (the GPU a CPU run stands for: a Hopper, H100 or H200) ---------


@dataclasses.dataclass(frozen=True)
class GpuMatmuls:
    """How the GPU a CPU run stands for computes a float32 matmul, and the source of each."""

    gpu: str
    has_tf32: str  # which GPUs take float32 operands as TensorFloat-32
    xla: str  # the test's own XLA dots
    triton: str  # a Triton kernel's dot
    mosaic_gpu: str  # a Mosaic GPU kernel's wgmma
    sources: dict[str, str]


_JAX = "jax 0.10.2, "
GPU_MATMULS = GpuMatmuls(
    gpu="a Hopper GPU (H100, H200): the GPU of the SMEM check (pytest_pallas.gpu), and the "
        "only one Mosaic GPU's wgmma compiles for",
    has_tf32="A100 (Ampere) and later (H100, H200); V100 and earlier compute float32",
    xla="precision None, DEFAULT or HIGH: operands rounded to TF32 (10 mantissa bits), "
        "products summed in float32; HIGHEST: float32",
    triton="precision None, DEFAULT or HIGH on either operand: input_precision=TF32 (both "
           "operands); HIGHEST on both: IEEE (float32)",
    mosaic_gpu="plgpu.wgmma takes float32 operands as TF32 always (it has no precision); "
               "jnp.dot has no Mosaic GPU lowering (JAX's GPU interpreter computes it as "
               "an XLA dot, rounded as XLA's)",
    sources={
        "has_tf32": _JAX + "lax.Precision's docstring: 'On GPU: uses tensorfloat32 if "
                    "available (e.g. on A100 and H100 GPUs), otherwise standard float32 "
                    "(e.g. on V100 GPUs)'",
        "xla": _JAX + "lax.Precision's docstring (DEFAULT and HIGH: tensorfloat32 where "
               "available; HIGHEST: float32)",
        "triton": _JAX + "jax/_src/pallas/triton/lowering.py, _dot_general_lowering: "
                  "_TF32_PRECISIONS = (HIGH, DEFAULT), None read as DEFAULT; a float32 "
                  "operand otherwise InputPrecision.IEEE",
        "mosaic_gpu": _JAX + "jax/experimental/mosaic/gpu/wgmma.py (wgmma_element_type = "
                      "FloatTF32Type for F32); jax/_src/pallas/mosaic_gpu/lowering.py "
                      "registers no rule for dot_general",
        "interpreter": _JAX + "jax/_src/pallas/mosaic_gpu/interpret/gpu_callbacks.py, "
                       "wgmma: acc + np.matmul(a, b) on the host, in float32 "
                       "(_compat.chip_matmuls.gpu_wgmma_rounded rounds its operands)",
    },
)

_TF32 = "TF32"  # how the header and the failure's line name TensorFloat-32


def run_rounding(platform: str, chip: str, numerics: str, *, gpu: bool = False) -> str | None:
    """What a run rounds the operands of a default-precision float32 dot to on the CPU:
    ``"bfloat16"`` when it interprets kernels for a TPU with ``--pallas-numerics=chip``,
    ``"tensorfloat32"`` for a test of GPU kernels (``gpu``), else None (compiled for a
    device, whose own numbers count, or ``exact``)."""
    if platform != "cpu" or numerics != "chip":
        return None
    return "tensorfloat32" if gpu else chip_matmuls(chip).default_rounding


def header_text(platform: str, chips: str | tuple[str, ...], numerics: str, *,
                conformance: bool = False) -> str:
    """The header's words on which numbers the run computes, for its chip or chips
    (``conformance``: the run has the packaged suite, which judges with float32 products)."""
    if platform != "cpu":
        return "numbers: the device's own"
    if numerics == "exact":
        return ("numbers: float32 matmul products (--pallas-numerics=exact); "
                "--pallas-numerics=chip rounds as the chip")
    chips = (chips,) if isinstance(chips, str) else tuple(chips)
    rounding = " or ".join(sorted({run_rounding(platform, chip, numerics) for chip in chips}))
    whose = f"TPU {chips[0]}'s" if len(chips) == 1 else f"each chip's ({', '.join(chips)})"
    suite = "; the conformance suite's with float32 products" if conformance else ""
    return (f"numbers: {whose}, default-precision float32 matmuls with {rounding} "
            "operands in kernels and in the test's XLA dots; a test of GPU kernels (Mosaic "
            f"GPU, Triton) a Hopper GPU's, with {_TF32} operands (--pallas-numerics=exact for "
            f"float32){suite}")


# --- Which dots round ------------------------------------------------------------------------


def is_rounded_dot(equation: Any, rounding: str = "bfloat16") -> bool:
    """Whether a jaxpr equation is a float32 dot whose operands ``rounding``'s hardware rounds:
    a ``dot_general`` at the default precision (a GPU: at ``HIGH`` too), or on a GPU
    Mosaic GPU's ``wgmma`` of float32 operands."""
    name = getattr(getattr(equation, "primitive", None), "name", None)
    gpu = rounding == "tensorfloat32"
    if gpu and name in ("wgmma", "wgmma_ref"):
        return any(_is_float32(var) for var in equation.invars[1:3])
    if name != "dot_general":
        return False
    # lazy: numerics loads with the plugin (its header)
    from ._compat.chip_matmuls import goes_through_the_matrix_unit, rounded_operands

    lhs, rhs = (getattr(var, "aval", None) for var in equation.invars[:2])
    if lhs is not None and rhs is not None and not goes_through_the_matrix_unit(
            rounding, lhs, rhs, equation.params.get("dimension_numbers")):
        return False
    # The rule the CPU lowering rounds by (_compat.chip_matmuls), so the note names the
    # kernels whose operands it rounded.
    each_rounded = rounded_operands(rounding, equation.params.get("precision"))
    return any(_is_float32(var) and rounded
               for var, rounded in zip(equation.invars, each_rounded))


def rounded_dots(jaxpr: Any, rounding: str = "bfloat16") -> int:
    """How many float32 dots ``jaxpr`` (and the jaxprs inside it) holds whose operands
    ``rounding``'s hardware rounds (:func:`is_rounded_dot`)."""
    return sum(1 for equation in _equations(jaxpr) if is_rounded_dot(equation, rounding))


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
    import numpy as np  # lazy: as above

    try:
        return np.dtype(var.aval.dtype) == np.float32
    except (AttributeError, TypeError):
        return False


def rounding_note(kernels: Iterable[str], chip: str, rounding: str = "bfloat16") -> str:
    """The failure's line for kernels that had a default-precision float32 dot."""
    names = ", ".join(f"'{k}'" for k in dict.fromkeys(kernels))
    if rounding == "tensorfloat32":
        return (
            f"pallas: kernel {names} had a default-precision float32 dot: a Hopper GPU's "
            f"tensor cores round these operands to {_TF32} (10 mantissa bits); "
            "precision=HIGHEST keeps float32 in a Triton kernel and in XLA's dots (Mosaic "
            "GPU's wgmma has no float32 mode); --pallas-numerics=exact computes in float32 "
            "on the CPU")
    facts = chip_matmuls(chip)
    return (
        f"pallas: kernel {names} had a default-precision float32 dot: the chip rounds these "
        f"operands to {facts.default_rounding}; precision=HIGHEST keeps float32, at "
        f"{facts.highest_passes} MXU passes instead of {facts.default_passes} on {chip} "
        f"(pytest_pallas.estimate(fn, *args, chip='{chip}') gives the time where libtpu is "
        "installed; --pallas-numerics=exact computes in float32 on the CPU)")


@contextlib.contextmanager
def kernels_with_rounded_dots(rounding: str = "bfloat16") -> Iterator[list[str]]:
    """Inside the block, the name of each kernel traced that holds a float32 dot whose
    operands ``rounding``'s hardware rounds is added to the list yielded: TPU kernels under
    ``"bfloat16"`` (GPU kernels are left out), every kernel under ``"tensorfloat32"``."""
    from ._compat import gpu_interpreter, jax_internals, pallas_call_hooks  # lazy: as above

    found: list[str] = []

    def observe(params: dict[str, Any]) -> None:
        if rounded_dots(params.get("jaxpr"), rounding):
            found.append(jax_internals.kernel_name(params))

    watch = observe if rounding == "tensorfloat32" else gpu_interpreter.tpu_kernels_only(observe)
    with pallas_call_hooks.observe_pallas_calls(watch):
        yield found
