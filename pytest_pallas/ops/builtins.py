"""The built-in ops of the conformance contract (docs/contract.md §2), one ``Operation`` each.

``pytest_pallas.operations.matmul`` and its siblings are public::

    >>> from pytest_pallas import operations
    >>> operations.matmul.signature
    '(m,k),(k,n)->(m,n)'
    >>> [op.name for op in operations.BUILT_IN][:3]
    ['add', 'sum', 'matmul']

Everything the suite, the report and the benchmarks know about an op is in its
record below; nothing elsewhere is keyed by an op's name.

Adding a built-in op:

1. write its kernel module ``reference_kernels/NAME.py`` (installed as
   ``pytest_pallas.reference_kernels.NAME``) with the kernel, its float64
   oracle ``NAME_reference``, its cost model ``NAME_cost`` and, for inputs
   with structure, an ``inputs(dims, dtype, rng)`` builder;
2. add its record here (``_builtin("NAME", signature, ...)`` names those
   functions by convention) and list it in ``BUILT_IN``;
3. nothing else: the packaged suite runs its properties in
   ``conformance/test_<kernel module>.py`` if that file exists, else in
   ``conformance/test_operations.py``; ``--pallas-impl NAME=...``, the report
   and ``pallas_benchmark("NAME", ...)`` know it from the record.

Importing this module is cheap (no JAX): every callable is named by a
``"module:attr"`` string and imported on first use.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .error_models import (
    activation_allowance,
    attention_allowance,
    paged_attention_model,
    rms_norm_allowance,
)
from .operation import FLOAT_DTYPES, Deferred, Operation, load

_KERNELS = "pytest_pallas.reference_kernels"
_XLA = "pytest_pallas.ops.xla_versions"
_HERE = __name__


def _builtin(name: str, signature: str, module: str, attr: str | None = None, *,
             xla: str | None = None, **fields: Any) -> Operation:
    """A record whose kernel, oracle and cost model live in ``reference_kernels/<module>.py``."""
    attr = attr or name
    fields.setdefault("oracle", f"{_KERNELS}.{module}:{attr}_reference")
    return Operation(
        name, signature,
        reference=f"{_KERNELS}.{module}:{attr}",
        cost=f"{_KERNELS}.{module}:{attr}_cost",
        xla=f"{_XLA}:{xla or attr}",
        **fields,
    )


# --- allowances: errors a correct kernel of an op adds beyond the default tolerance ---------


def logit_rounding_allowance(case: Any, backend_precision: str) -> tuple[float, str]:
    """Attention's logit rounding (``ops.error_models.attention_allowance``) for a case of
    attention, mha, mqa or flash_attention: k and v shared by the heads (mqa) or by groups
    of them (flash attention's g kv heads) are repeated to q's heads; ``sm_scale`` scales
    the logits."""
    q, k, v = case.args[:3]
    if np.ndim(k) < np.ndim(q):  # mqa: k and v shared by the heads
        k, v = np.asarray(k)[:, None], np.asarray(v)[:, None]
    elif np.ndim(q) == 4 and np.shape(k)[1] not in (1, np.shape(q)[1]):  # grouped kv heads
        group = np.shape(q)[1] // np.shape(k)[1]
        k, v = np.repeat(np.asarray(k), group, axis=1), np.repeat(np.asarray(v), group, axis=1)
    return attention_allowance(q, k, v, matmul_precision=backend_precision,
                               sm_scale=float(case.kwargs.get("sm_scale", 1.0)))


def activation_rounding_allowance(case: Any, backend_precision: str) -> tuple[float, str]:
    """The activation's rounding (``ops.error_models.activation_allowance``) for a case of the
    suite."""
    activation = case.kwargs.get("activation")
    name = repr(activation) if isinstance(activation, Deferred) else activation
    name = getattr(name, "__name__", name)  # jax.nn.gelu given as a function
    x, y = case.args[:2]
    return activation_allowance(x, y, activation=name, dtype=case.dtype)


def rms_norm_rounding_allowance(case: Any, backend_precision: str) -> tuple[float, str]:
    """rms_norm's rsqrt and products (``ops.error_models.rms_norm_allowance``) for a case of
    the suite."""
    del backend_precision

    x, w = case.args[:2]
    return rms_norm_allowance(x, w, eps=float(case.kwargs.get("eps", 1e-6)))


# --- attention's "offset" profile ----------------------------------------------------------

# "offset" (attention ops): integer q, k and v as in "ties", with the first
# feature of q and of k set so that every logit is shifted by the same
# -128 * 2 = -256. Softmax is shift-invariant and the logits stay exact
# integers (in float32, and as products of bfloat16 values), so a correct
# kernel is as exact as on "ties"; but a kernel that exponentiates without
# subtracting the row maximum gets exp(logit) == 0 for a whole row and returns
# 0/0, as does one whose running maximum starts at 0 instead of -inf.
_LOGIT_OFFSET_FACTORS = (-128.0, 2.0)


def offset_logits(args: tuple[Any, ...]) -> tuple[Any, ...]:
    q, k, *rest = (np.array(arg, copy=True) for arg in args)
    q[..., 0] = _LOGIT_OFFSET_FACTORS[0]
    k[..., 0] = _LOGIT_OFFSET_FACTORS[1]
    return (q, k, *rest)


def ppermute_oracle(x: Any, *, shift: int, devices: int) -> Any:
    """The global result: device i's block is the one device (i - shift) mod n held."""
    # lazy: JAX; ops load in a conftest, before JAX starts
    from ..reference_kernels.collectives import ppermute_reference

    blocks = np.split(x, devices, axis=0)
    return np.concatenate(list(ppermute_reference(blocks, shift)), axis=0)


# --- the version 0.2 ops' facts in a record's terms -------------------------------------------
#
# Their kernel modules (``reference_kernels/flash_attention.py`` and its siblings) state each
# op's oracle and input structure in the op's own terms (per-device blocks, keyword
# arguments, a NumPy Generator); the attention ops' error models are ``ops.error_models``'.
# A record needs them in the suite's terms: an oracle of the global arrays, an allowance of
# a ``Case``, an inputs builder that leaves the values to the drawn value profile, and a
# ``constrain`` that ties dimensions and parameters together. These are those adapters, one
# small function each, next to the records that name them.

# --- ties between dimensions and parameters (``Operation.constrain``) ------------------------

# flash_attention's sm_scale values: 1 and this marker, which becomes 1/sqrt(d) for the drawn d.
INVERSE_SQRT_D = "1/sqrt(d)"


def _largest_divisor_up_to(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is at most ``limit`` (1 always qualifies)."""
    return max(divisor for divisor in range(1, max(1, min(limit, n)) + 1) if n % divisor == 0)


def flash_attention_constrain(dims: dict[str, Any], params: dict[str, Any]
                              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """g divides h (the drawn g becomes h's largest divisor not above it: g = h MHA, 1 < g < h
    GQA, g = 1 MQA); s = t under the causal mask (both the shorter one, so the masked
    square is a prefix of what was drawn); sm_scale 1/sqrt(d) for the drawn d."""
    dims, params = dict(dims), dict(params)
    dims["g"] = _largest_divisor_up_to(int(dims["h"]), int(dims["g"]))
    if params.get("causal"):
        dims["s"] = dims["t"] = min(int(dims["s"]), int(dims["t"]))
    if params.get("sm_scale") == INVERSE_SQRT_D:
        params["sm_scale"] = 1.0 / math.sqrt(int(dims["d"]))
    return dims, params


def grouped_heads_constrain(dims: dict[str, Any], params: dict[str, Any]
                            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """g divides h (paged attention's kv heads), as for flash attention."""
    dims = dict(dims)
    dims["g"] = _largest_divisor_up_to(int(dims["h"]), int(dims["g"]))
    return dims, dict(params)


# --- inputs: the structure from the kernel module's builder, the values from the profile -----


def _structure_only(module: str, builder: str, keep: tuple[int, ...]) -> Callable:
    def inputs(dims: dict[str, Any], dtype: str, rng: np.random.Generator) -> tuple[Any, ...]:
        built = load(f"{_KERNELS}.{module}:{builder}")(dims, dtype, rng)
        return tuple(arg if i in keep else None for i, arg in enumerate(built))

    inputs.__doc__ = (f"The structured arguments {keep} of ``{module}.{builder}``; the others "
                      "(None) are drawn by the value profile.")
    return inputs


# group_sizes (int32, summing to m: zeros, one group holding every row, ragged cuts).
grouped_matmul_inputs = _structure_only("grouped_matmul", "grouped_matmul_inputs", (2,))
# w int8 over its whole range and scales from 1e-4 to 1e2; x from the profile.
quantized_matmul_inputs = _structure_only("quantized_matmul", "quantized_matmul_inputs", (1, 2))
# lengths 1, a page boundary, one past it and the capacity; shuffled page tables.
paged_attention_inputs = _structure_only("paged_attention", "paged_attention_inputs", (3, 4))


# --- their allowances ----------------------------------------------------------------------------


def paged_attention_allowance(case: Any, backend_precision: str) -> Any:
    """Attention's model per sequence (``ops.error_models.paged_attention_model``): the logit
    rounding over each sequence's visible keys, and the most keys one sequence sees as the
    reduction length; ``case.kwargs`` are its ``op_params``."""
    return paged_attention_model(case.args, matmul_precision=backend_precision,
                                 params=case.kwargs)


def reduce_scatter_allowance(case: Any, backend_precision: str) -> tuple[float, str]:
    """``reduce_scatter_error_allowance``: partial sums travelling in x's dtype round n - 1
    times (derived in the kernel module)."""
    del backend_precision
    if "devices" not in case.dims:
        raise ValueError("op='reduce_scatter' takes x as the devices' blocks stacked along "
                         "axis 0: pass the device count, op_params={'devices': n}")
    allowance = load(f"{_KERNELS}.collectives:reduce_scatter_error_allowance")
    devices = int(case.dims["devices"])
    extra = allowance(np.split(np.asarray(case.args[0]), devices, axis=0))
    return extra, (f"{devices - 1} roundings of partial sums in {case.dtype} add {extra:.3g}"
                   if extra else "")


# --- collectives: shapes and oracles of the global arrays ---------------------------------------


def all_gather_shapes(dims: dict[str, Any]) -> tuple[list[tuple[int, ...]], tuple[int, ...]]:
    """x: n blocks (rows, cols); the result: every device's (n * rows, cols), n times."""
    n, rows, cols = int(dims["devices"]), int(dims["rows"]), int(dims["cols"])
    return [(n * rows, cols)], (n * n * rows, cols)


def all_gather_oracle(x: Any, *, devices: int) -> Any:
    """The global result: every device returns all blocks in mesh order."""
    from ..reference_kernels.collectives import all_gather_reference  # lazy: as ppermute's

    gathered = all_gather_reference(np.split(x, devices, axis=0))
    return np.concatenate([gathered] * devices, axis=0)


def reduce_scatter_shapes(dims: dict[str, Any]) -> tuple[list[tuple[int, ...]], tuple[int, ...]]:
    """x: each of n devices holds (n * rows, cols); the result: device i's rows block i."""
    n, rows, cols = int(dims["devices"]), int(dims["rows"]), int(dims["cols"])
    return [(n * n * rows, cols)], (n * rows, cols)


def reduce_scatter_oracle(x: Any, *, devices: int) -> Any:
    """The global result: rows block i of the sum of the devices' x, stacked over i."""
    from ..reference_kernels.collectives import reduce_scatter_reference  # lazy: as ppermute's

    scattered = reduce_scatter_reference(np.split(x, devices, axis=0))
    return scattered.reshape(-1, *scattered.shape[2:])


# --- the records ------------------------------------------------------------------------------

# Attention draws large logits as "offset" rather than "large": a correct kernel's softmax
# saturates to one-hot on "large", where bfloat16 rounding of q @ k decides ties.
_ATTENTION = dict(
    reduction="t", profiles=("normal", "ties", "small", "offset"),
    allowance=f"{_HERE}:logit_rounding_allowance", low_precision_matmul=True,
    profile_adjustments={"offset": f"{_HERE}:offset_logits"},
)
_HEAD = (1, 32, 128)
# Batched attention: fewer and shorter sequences than attention's t, the same code paths.
_SEQUENCE = (1, 100, 256)

add = _builtin("add", "(),()->()", "elementwise", dtypes=FLOAT_DTYPES + ("int32",))
sum = _builtin("sum", "(n,r,c)->(r,c)", "reduction", "sum_leading_axis", reduction="n",
               sizes={"n": (1, 3, 8)})
matmul = _builtin("matmul", "(m,k),(k,n)->(m,n)", "matmul", reduction="k")
matmul_activation = _builtin(
    "matmul_activation", "(m,k),(k,n)->(m,n)", "matmul", reduction="k",
    # In this order the sweep (value i + i // 2 for sweep case i) puts gelu, the activation whose
    # rounding needs its allowance, on the "large" values.
    params={"activation": (Deferred("jax.nn:gelu"), Deferred("jax.nn:silu"), None,
                           Deferred("jax.nn:relu"))},
    allowance=f"{_HERE}:activation_rounding_allowance",
)
batched_matmul = _builtin("batched_matmul", "(b,m,k),(b,k,n)->(b,m,n)", "matmul",
                          xla="matmul", reduction="k", profiles=("normal", "ties", "small"),
                          vmap=False)
softmax = _builtin("softmax", "(rows,cols)->(rows,cols)", "softmax", reduction="cols",
                   profiles=("normal", "large", "ties", "small", "neg_inf"))
attention = _builtin("attention", "(s,d),(t,d),(t,d)->(s,d)", "attention",
                     dimensions=("s", "t", "d"), sizes={"d": _HEAD}, **_ATTENTION)
mha = _builtin("mha", "(b,h,s,d),(b,h,t,d),(b,h,t,d)->(b,h,s,d)", "attention",
               xla="attention", dimensions=("b", "h", "s", "t", "d"),
               sizes={"d": _HEAD, "t": _SEQUENCE}, vmap=False, **_ATTENTION)
mqa = _builtin("mqa", "(b,h,s,d),(b,t,d),(b,t,d)->(b,h,s,d)", "attention",
               dimensions=("b", "h", "s", "t", "d"), sizes={"d": _HEAD, "t": _SEQUENCE},
               vmap=False, **_ATTENTION)
copy = _builtin("copy", "(rows,cols)->(rows,cols)", "dma", dtypes=FLOAT_DTYPES + ("int32",),
                exact=True, needs_tpu_interpreter=True)
ppermute = _builtin("ppermute", "(rows,cols)->(rows,cols)", "collectives",
                    oracle=f"{_HERE}:ppermute_oracle", dtypes=FLOAT_DTYPES + ("int32",),
                    exact=True, collective="axis_name", params={"shift": (1, -1)}, vmap=False,
                    needs_tpu_interpreter=True)

# --- the ops added in version 0.2 (docs/contract.md section 2) -------------------------------
#
# Their kernel modules state the oracles, cost models and input structure, and
# ``ops.error_models`` the attention ops' error models; the adapters above put them in a
# record's terms. Sizes are small (each distinct
# shape is a compilation and each grid step an interpreted step): buckets of two or three sizes
# that still reach every code path (one block and several, ragged sizes, a size of 1).

flash_attention = _builtin(
    "flash_attention", "(b,h,s,d),(b,g,t,d),(b,g,t,d)->(b,h,s,d)", "flash_attention",
    dimensions=("b", "h", "g", "s", "t", "d"),
    # h of 1, 2, 4 with g drawn from the same sizes then made a divisor of h: the group ratios
    # 1 (MHA), 2 (GQA at h = 4) and h (MQA). s and t from one bucket, so that the causal s = t
    # is a size either could draw.
    sizes={"b": (1, 2), "h": (1, 2, 4), "g": (1, 2, 4), "s": (1, 100, 256), "t": (1, 100, 256),
           "d": _HEAD},
    # sm_scale "1/sqrt(d)" is 1 / sqrt(the drawn d) (flash_attention_constrain above).
    params={"causal": (False, True), "sm_scale": (1.0, "1/sqrt(d)")},
    constrain=f"{_HERE}:flash_attention_constrain",
    # Every (h, g) that divides (MHA, GQA with 1 < g < h, MQA) and causal with each s (s = t
    # under the mask; s != t without it) in the sweep, whatever the seed.
    sweep_pairs=(("h", "g"), ("causal", "s")),
    reduction="t", profiles=("normal", "ties", "small", "offset"),
    allowance=f"{_HERE}:logit_rounding_allowance", low_precision_matmul=True,
    profile_adjustments={"offset": f"{_HERE}:offset_logits"},
)
rms_norm = _builtin("rms_norm", "(rows,cols),(cols)->(rows,cols)", "norms", reduction="cols",
                    params={"eps": (1e-6,)},
                    allowance=f"{_HERE}:rms_norm_rounding_allowance")
grouped_matmul = _builtin(
    "grouped_matmul", "(m,k),(g,k,n),(g)->(m,n)", "grouped_matmul",
    dimensions=("m", "k", "n", "g"), reduction="k",
    # g: one group, a few, and more groups than an m of 5 has rows (empty groups for sure).
    sizes={"g": (1, 3, 8)}, arg_dtypes={2: "int32"},
    inputs=f"{_HERE}:grouped_matmul_inputs",
    vmap=False,  # group_sizes perturbed per batch slice would no longer sum to m
)
quantized_matmul = _builtin(
    "quantized_matmul", "(m,k),(k,n),(n)->(m,n)", "quantized_matmul", reduction="k",
    arg_dtypes={1: "int8", 2: "float32"}, inputs=f"{_HERE}:quantized_matmul_inputs",
)
paged_attention = _builtin(
    "paged_attention",
    "(b,h,d),(g,pages,page_size,d),(g,pages,page_size,d),(b),(b,pages_per_sequence)->(b,h,d)",
    "paged_attention",
    dimensions=("b", "h", "g", "d", "pages", "page_size", "pages_per_sequence"),
    # b = 4 draws the four special lengths (1, a page, a page and one, the capacity); pages
    # = 8 shuffles every table (b * pages_per_sequence <= 8), pages = 3 shares pages. Two
    # pages per sequence already cross a page boundary and double-buffer; each more page is
    # one more pair of interpreted DMAs per (sequence, kv head).
    sizes={"b": (1, 4), "h": (2, 4), "g": (1, 2), "d": _HEAD, "pages": (3, 8),
           "page_size": (8, 16), "pages_per_sequence": (1, 2)},
    constrain=f"{_HERE}:grouped_heads_constrain",
    sweep_pairs=(("page_size", "pages_per_sequence"), ("h", "g")),
    reduction=("pages_per_sequence", "page_size"),
    profiles=("normal", "ties", "small", "offset"),
    allowance=f"{_HERE}:paged_attention_allowance", low_precision_matmul=True,
    profile_adjustments={"offset": f"{_HERE}:offset_logits"},
    arg_dtypes={3: "int32", 4: "int32"}, inputs=f"{_HERE}:paged_attention_inputs",
    vmap=False,  # lengths and page tables perturbed per batch slice leave their ranges
)
# The collectives' blocks stay at most 8 x 200 (6.4 KB): on 8 simulated devices a block of
# 10 x 384 float32 (15 KB) or more makes the TPU interpreter hang in the reference kernels
# (idle, and --pallas-timeout does not fire), while 8 x 384 and anything on 2 or 4 devices
# completes in about a second.
_SMALL_BLOCKS = {"rows": (1, 5, 8), "cols": (1, 128, 200)}

all_gather = _builtin("all_gather", "(rows,cols)->(rows,cols)", "collectives",
                      oracle=f"{_HERE}:all_gather_oracle", shapes=f"{_HERE}:all_gather_shapes",
                      dtypes=FLOAT_DTYPES + ("int32",), exact=True, collective="axis_name",
                      sizes=_SMALL_BLOCKS, vmap=False, needs_tpu_interpreter=True)
reduce_scatter = _builtin("reduce_scatter", "(rows,cols)->(rows,cols)", "collectives",
                          oracle=f"{_HERE}:reduce_scatter_oracle",
                          shapes=f"{_HERE}:reduce_scatter_shapes",
                          dtypes=FLOAT_DTYPES + ("int32",), collective="axis_name",
                          reduction="devices", allowance=f"{_HERE}:reduce_scatter_allowance",
                          sizes=_SMALL_BLOCKS, vmap=False, needs_tpu_interpreter=True)

BUILT_IN: tuple[Operation, ...] = (
    add, sum, matmul, matmul_activation, batched_matmul, softmax, attention, mha, mqa, copy,
    ppermute, flash_attention, rms_norm, grouped_matmul, quantized_matmul, paged_attention,
    all_gather, reduce_scatter,
)
