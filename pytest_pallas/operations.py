"""The built-in ops of the conformance contract (CONTRACT.md §2), one ``Operation`` each.

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

from typing import Any

from .operation import FLOAT_DTYPES, Deferred, Operation

_KERNELS = "pytest_pallas.reference_kernels"
_XLA = "pytest_pallas.xla_versions"
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
    """Attention's logit rounding (``error_models.attention_allowance``) for a case of the suite."""
    import numpy as np

    from .error_models import attention_allowance

    q, k, v = case.args[:3]
    if np.ndim(k) < np.ndim(q):  # mqa: k and v shared by the heads
        k, v = np.asarray(k)[:, None], np.asarray(v)[:, None]
    return attention_allowance(q, k, v, matmul_precision=backend_precision)


def activation_rounding_allowance(case: Any, backend_precision: str) -> tuple[float, str]:
    """The activation's rounding (``error_models.activation_allowance``) for a case of the suite."""
    from .error_models import activation_allowance

    activation = case.kwargs.get("activation")
    name = repr(activation) if isinstance(activation, Deferred) else activation
    name = getattr(name, "__name__", name)  # jax.nn.gelu given as a function
    x, y = case.args[:2]
    return activation_allowance(x, y, activation=name, dtype=case.dtype)


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
    import numpy as np

    q, k, *rest = (np.array(arg, copy=True) for arg in args)
    q[..., 0] = _LOGIT_OFFSET_FACTORS[0]
    k[..., 0] = _LOGIT_OFFSET_FACTORS[1]
    return (q, k, *rest)


def ppermute_oracle(x: Any, *, shift: int, devices: int) -> Any:
    """The global result: device i's block is the one device (i - shift) mod n held."""
    import numpy as np

    from .reference_kernels.collectives import ppermute_reference

    blocks = np.split(x, devices, axis=0)
    return np.concatenate(list(ppermute_reference(blocks, shift)), axis=0)


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
    # In this order the sweep (value i for sweep case i) puts gelu, the activation whose
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

BUILT_IN: tuple[Operation, ...] = (
    add, sum, matmul, matmul_activation, batched_matmul, softmax, attention, mha, mqa, copy,
    ppermute,
)
