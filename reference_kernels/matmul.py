"""Matrix multiplication on the TPU: blocked, pipelined, with an activation epilogue.

Contract ops (docs/contract.md section 2):

* ``matmul(x, y)``: ``(m, k) @ (k, n)``, output dtype = input dtype.
* ``matmul_activation(x, y, *, activation)``: ``activation(x @ y)``, the activation
  applied once to the full float32 product.
* ``batched_matmul(x, y)``: ``(b, m, k) @ (b, k, n)`` by ``jax.vmap`` of the 2-D kernel.

Tunable variants: ``matmul_blocked`` (the ``pallas_call`` kernel with explicit
``block_m, block_k, block_n``) and ``matmul_emit_pipeline`` (the same algorithm
written with ``pl.kernel`` and ``pltpu.emit_pipeline``, whose pipeline,
``matmul_pipeline``, any kernel over HBM refs can call). Each kernel sits next to
its float64 NumPy oracle (``*_reference``) and its cost model (``*_cost``).

The TPU ideas shown here:

* A ``(block_m, block_k) @ (block_k, block_n)`` product per grid step: BlockSpecs
  tell Pallas which block of ``x`` and ``y`` each step needs, so it copies the
  next step's blocks from HBM into VMEM while the MXU works on the current ones.
* The reduction over ``k`` is the minormost grid axis: the output block ``(i, j)``
  stays resident in VMEM for all ``k`` steps and is written back to HBM once,
  after the last one (an output block is never read back from HBM, so a
  reduction may not revisit it later).
* Bigger blocks raise the arithmetic intensity (each block of ``x`` is re-read
  once per block column of ``y``): ``bm * bn / (bm + bn)`` flops per byte of
  16-bit input moved from HBM.

Sizes need not be multiples of the TPU tile. A block spanning a whole dimension
is legal at any size, so a dimension that fits one block is left alone; a longer
one is padded with zeros (which add nothing to a dot product) to a multiple of
its block, and the result is sliced back.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas import tpu
from pytest_pallas.ops.domains import supports

from ._tiling import output_struct, pad_to, resolve_matmul_blocks, round_up
from .operand_checks import require_one_float_dtype, require_ranks

__all__ = [
    "DEFAULT_BLOCK_K",
    "DEFAULT_BLOCK_M",
    "DEFAULT_BLOCK_N",
    "batched_matmul",
    "batched_matmul_cost",
    "batched_matmul_reference",
    "matmul",
    "matmul_activation",
    "matmul_activation_cost",
    "matmul_activation_reference",
    "matmul_blocked",
    "matmul_cost",
    "matmul_emit_pipeline",
    "matmul_pipeline",
    "matmul_reference",
]

# Largest default blocks. 512 x 512 output blocks give 256 flops per byte of
# bfloat16 input (above the ~240 a v5e needs to be compute bound); with
# 512-deep k blocks a float32 step holds two double-buffered 1 MiB input blocks,
# a double-buffered output block and the 1 MiB accumulator: about 7 MiB, well
# under 16 MiB (all of a v4's VMEM, and no more than the default scoped-VMEM
# limit of later chips). Smaller problems get one block per dimension (see
# _tiling.resolve_block), so small tests run in one grid step.
DEFAULT_BLOCK_M = 512
DEFAULT_BLOCK_K = 512
DEFAULT_BLOCK_N = 512


# --- operands -------------------------------------------------------------------


def _check_operands(x: Any, y: Any, *, batched: bool) -> None:
    """``(m, k) @ (k, n)`` (with ``batched``, ``(b, m, k) @ (b, k, n)``), both float32 or both
    bfloat16."""
    rank = 3 if batched else 2
    expected = "(b, m, k) @ (b, k, n)" if batched else "(m, k) @ (k, n)"
    require_ranks(f"expected {expected}", (x, y), (rank, rank), join=" and ")
    if x.shape[-1] != y.shape[-2] or (batched and x.shape[0] != y.shape[0]):
        raise ValueError(
            f"expected {expected}, got shapes {x.shape} and {y.shape} whose dimensions disagree"
        )
    require_one_float_dtype("", x=x, y=y)


# --- activations: the kernel's epilogue and the oracle's float64 twin ----------------


def _gelu_tanh(z: np.ndarray) -> np.ndarray:
    return 0.5 * z * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (z + 0.044715 * z**3)))


def _gelu_erf(z: np.ndarray) -> np.ndarray:
    import scipy.special  # only the exact-gelu oracle needs SciPy

    return 0.5 * z * (1.0 + scipy.special.erf(z / np.sqrt(2.0)))


def _silu(z: np.ndarray) -> np.ndarray:
    # exp(-z) overflows to inf below z = -709, where silu(z) is -0.0 in float64 anyway: the
    # quotient is right, and the overflow warning would only alarm the conformance run's user.
    with np.errstate(over="ignore"):
        return z / (1.0 + np.exp(-z))


# float64 NumPy twins of the jax.nn activations the contract names, keyed by the
# function object (jax.nn.swish is jax.nn.silu). jax.nn.gelu's default is the
# tanh approximation.
_NUMPY_ACTIVATIONS: dict[Any, Callable[[np.ndarray], np.ndarray]] = {
    jax.nn.relu: lambda z: np.maximum(z, 0.0),
    jax.nn.gelu: _gelu_tanh,
    jax.nn.silu: _silu,
}

# (flops, transcendentals) per output element, for the cost model.
_ACTIVATION_COSTS: dict[Any, tuple[int, int]] = {
    None: (0, 0),
    jax.nn.relu: (1, 0),
    jax.nn.gelu: (8, 1),
    jax.nn.silu: (3, 1),
}


def _numpy_activation(activation: Any) -> Callable[[np.ndarray], np.ndarray]:
    if activation is None:
        return lambda z: z
    if activation in _NUMPY_ACTIVATIONS:
        return _NUMPY_ACTIVATIONS[activation]
    if (
        isinstance(activation, functools.partial)
        and activation.func is jax.nn.gelu
        and not activation.args
        and set(activation.keywords) <= {"approximate"}
    ):
        return _gelu_tanh if activation.keywords.get("approximate", True) else _gelu_erf
    raise ValueError(
        f"no float64 oracle for activation {activation!r}; known: None, jax.nn.relu, "
        "jax.nn.gelu (and functools.partial(jax.nn.gelu, approximate=...)), jax.nn.silu"
    )


def _activation_cost(activation: Any) -> tuple[int, int]:
    if isinstance(activation, functools.partial) and activation.func is jax.nn.gelu:
        return _ACTIVATION_COSTS[jax.nn.gelu]
    # An unknown activation is charged like gelu: a few flops and one transcendental.
    return _ACTIVATION_COSTS.get(activation, (8, 1))


# --- oracles ------------------------------------------------------------------------


def _float64(array: Any) -> np.ndarray:
    return np.asarray(array).astype(np.float64)


def matmul_reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x @ y`` in float64 NumPy (bfloat16 inputs come as ``ml_dtypes.bfloat16``)."""
    return _float64(x) @ _float64(y)


def matmul_activation_reference(x: np.ndarray, y: np.ndarray, *, activation: Any) -> np.ndarray:
    """``activation(x @ y)`` in float64 NumPy; the activation's NumPy twin is looked up by identity.

    >>> matmul_activation_reference(np.eye(2), -np.ones((2, 2)), activation=jax.nn.relu)
    array([[0., 0.],
           [0., 0.]])
    """
    return _numpy_activation(activation)(matmul_reference(x, y))


def batched_matmul_reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``(b, m, k) @ (b, k, n)`` in float64 NumPy."""
    return np.matmul(_float64(x), _float64(y))


# --- cost models --------------------------------------------------------------------


def matmul_cost(
    x: Any, y: Any, *,
    block_m: int | None = None, block_n: int | None = None, activation: Any = None,
) -> pl.CostEstimate:
    """Flops, transcendentals and HBM bytes of ``x @ y`` (anything with ``.shape``/``.dtype``).

    Without blocks, the bytes are the minimum (read x and y once, write the
    output once), as a roofline wants. With ``block_m``/``block_n`` they are what
    the blocked kernel moves: each block row of ``x`` is read once per block
    column of the output, each block column of ``y`` once per block row.
    """
    *x_batch, m, k = x.shape
    *y_batch, _, n = y.shape
    batch = math.prod(np.broadcast_shapes(tuple(x_batch), tuple(y_batch)))
    itemsize = jnp.dtype(x.dtype).itemsize
    if block_m is None and block_n is None:
        input_elements = math.prod(x_batch) * m * k + math.prod(y_batch) * k * n
    else:
        x_reads = 1 if block_n is None else -(-n // block_n)
        y_reads = 1 if block_m is None else -(-m // block_m)
        input_elements = batch * (m * k * x_reads + k * n * y_reads)
    act_flops, act_transcendentals = _activation_cost(activation)
    return pl.CostEstimate(
        flops=batch * (2 * m * k * n + act_flops * m * n),
        transcendentals=batch * act_transcendentals * m * n,
        bytes_accessed=itemsize * (input_elements + batch * m * n),
    )


def matmul_activation_cost(x: Any, y: Any, *, activation: Any) -> pl.CostEstimate:
    """Cost of ``activation(x @ y)``: the matmul plus a few flops per output element."""
    return matmul_cost(x, y, activation=activation)


def batched_matmul_cost(x: Any, y: Any) -> pl.CostEstimate:
    """Cost of ``(b, m, k) @ (b, k, n)``: ``b`` independent matmuls."""
    return matmul_cost(x, y)


# --- the pallas_call kernel ---------------------------------------------------------


def _matmul_kernel(x_ref, y_ref, o_ref, acc_ref, *, num_batch_axes: int, num_k_blocks: int,
                   activation: Any):
    """One (..., i, j, k) grid step: accumulate a block product into the float32 scratch.

    The scratch persists across grid steps, but starts as garbage (NaN in TPU
    interpret mode), hence the initialisation at the first k step. The output
    block is written once, at the last k step, where the full product is known:
    the activation must see the whole sum, never a partial one.
    """
    k = pl.program_id(num_batch_axes + 2)

    @pl.when(k == 0)
    def _initialise():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    # preferred_element_type makes the MXU accumulate bfloat16 products in float32.
    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == num_k_blocks - 1)
    def _write_back():
        result = acc_ref[...]
        if activation is not None:
            result = activation(result)
        o_ref[...] = result.astype(o_ref.dtype)


def _batch_index(batch_shape: tuple[int, ...], grid_indices: tuple[Any, ...]) -> tuple[Any, ...]:
    # A batch axis of size 1 is shared by every step of that grid axis: the
    # operand was not vmapped there, and is read in place instead of broadcast.
    return tuple(index if size != 1 else 0 for size, index in zip(batch_shape, grid_indices))


def _matmul_pallas_call(x, y, *, block_m: int, block_k: int, block_n: int, activation: Any):
    """The kernel on padded operands ``(*batch, m, k) @ (*batch, k, n)``, each batch axis
    full or 1."""
    *x_batch, m, k = x.shape
    *y_batch, _, n = y.shape
    nb = len(x_batch)
    batch = tuple(max(a, b) for a, b in zip(x_batch, y_batch))
    grid = (*batch, m // block_m, n // block_n, k // block_k)
    squeezed = (None,) * nb  # batch axes: one element per grid step, squeezed away in the kernel

    def x_index(*g):
        return (*_batch_index(tuple(x_batch), g[:nb]), g[nb], g[nb + 2])

    def y_index(*g):
        return (*_batch_index(tuple(y_batch), g[:nb]), g[nb + 2], g[nb + 1])

    def o_index(*g):
        return (*g[:nb], g[nb], g[nb + 1])

    return pl.pallas_call(
        functools.partial(_matmul_kernel, num_batch_axes=nb, num_k_blocks=grid[-1],
                          activation=activation),
        out_shape=output_struct((*batch, m, n), x.dtype, x, y),
        grid=grid,
        in_specs=[
            pl.BlockSpec((*squeezed, block_m, block_k), x_index),
            pl.BlockSpec((*squeezed, block_k, block_n), y_index),
        ],
        out_specs=pl.BlockSpec((*squeezed, block_m, block_n), o_index),
        scratch_shapes=[pltpu.VMEM((block_m, block_n), jnp.float32)],
        # Batch, i and j steps are independent (a megacore chip splits them
        # across its two TensorCores); k carries the accumulator from step to
        # step, so it is "arbitrary" and, being a reduction, the minormost axis.
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel",) * (nb + 2) + ("arbitrary",)
        ),
        cost_estimate=matmul_cost(x, y, block_m=block_m, block_n=block_n, activation=activation),
        name="matmul",
    )(x, y)


@functools.cache
def _matmul_kernel_call(block_m: int, block_k: int, block_n: int, activation: Any):
    """The kernel as a function that ``jax.vmap`` turns into extra parallel grid axes.

    Pallas's own batching rule prepends a grid axis too, but leaves
    ``dimension_semantics`` one entry short, which JAX 0.10's TPU interpreter
    rejects (the Mosaic compiler pads it with "parallel"). This rule does what
    the compiler does: each vmapped axis becomes a leading "parallel" grid axis,
    and an operand that is not mapped gets a size-1 axis that every step reads
    (no broadcast copy).
    """
    call = functools.partial(_matmul_pallas_call, block_m=block_m, block_k=block_k,
                             block_n=block_n, activation=activation)

    @jax.custom_batching.custom_vmap
    def kernel_call(x, y):
        return call(x, y)

    @kernel_call.def_vmap
    def _batched(axis_size, in_batched, x, y):
        del axis_size
        x_batched, y_batched = in_batched
        return kernel_call(x if x_batched else x[None], y if y_batched else y[None]), True

    return kernel_call


def _padded_to_blocks(x, y, block_m: int, block_k: int, block_n: int):
    """``x`` and ``y`` padded with zeros (which add nothing to a dot product) to multiples
    of their blocks."""
    (m, k), n = x.shape, y.shape[1]
    m_pad, k_pad, n_pad = round_up(m, block_m), round_up(k, block_k), round_up(n, block_n)
    return pad_to(x, (m_pad, k_pad)), pad_to(y, (k_pad, n_pad))


@functools.partial(jax.jit, static_argnames=("block_m", "block_k", "block_n", "activation"))
def _matmul_pallas(x, y, *, block_m: int, block_k: int, block_n: int, activation: Any):
    m, n = x.shape[0], y.shape[1]
    x, y = _padded_to_blocks(x, y, block_m, block_k, block_n)
    out = _matmul_kernel_call(block_m, block_k, block_n, activation)(x, y)
    return out[:m, :n]


def matmul_blocked(
    x: jax.Array,
    y: jax.Array,
    *,
    block_m: int | None = None,
    block_k: int | None = None,
    block_n: int | None = None,
    activation: Callable[[jax.Array], jax.Array] | None = None,
) -> jax.Array:
    """``activation(x @ y)`` with a 3-D grid ``(i, j, k)`` and chosen blocks.

    ``block_m`` must be a multiple of the sublane tiling (8 for float32, 16 for
    bfloat16), ``block_k`` and ``block_n`` multiples of 128, or each equal its
    full dimension; ``None`` picks a default (at most 512, one block per
    dimension for small problems). Sizes need not divide the blocks.

    >>> x = jnp.ones((100, 300), jnp.float32)
    >>> matmul_blocked(x, x.T, block_m=32, block_k=128, block_n=128).shape
    (100, 100)
    """
    _check_operands(x, y, batched=False)
    (m, k), n = x.shape, y.shape[1]
    block_m, block_k, block_n = resolve_matmul_blocks(
        m, k, n, x.dtype, block_m, block_k, block_n,
        caps=(DEFAULT_BLOCK_M, DEFAULT_BLOCK_K, DEFAULT_BLOCK_N))
    return _matmul_pallas(
        x, y, block_m=block_m, block_k=block_k, block_n=block_n, activation=activation
    )


@supports(blocks={"block_m": "m", "block_k": "k", "block_n": "n"})
def matmul(x: jax.Array, y: jax.Array, *, block_m: int | None = None,
           block_k: int | None = None, block_n: int | None = None) -> jax.Array:
    """``x @ y`` for ``(m, k) @ (k, n)`` float32 or bfloat16, accumulated in float32.

    The blocks default to whole dimensions up to 512 (see ``matmul_blocked``).

    >>> matmul(jnp.ones((3, 5)), jnp.ones((5, 7)))[0, 0]
    Array(5., dtype=float32)
    """
    return matmul_blocked(x, y, block_m=block_m, block_k=block_k, block_n=block_n)


@supports(blocks={"block_m": "m", "block_k": "k", "block_n": "n"})
def matmul_activation(
    x: jax.Array, y: jax.Array, *, activation: Callable[[jax.Array], jax.Array] | None,
    block_m: int | None = None, block_k: int | None = None, block_n: int | None = None,
) -> jax.Array:
    """``activation(x @ y)``, the activation fused into the kernel's last k step.

    ``activation`` is ``None`` or a function on arrays such as ``jax.nn.relu``,
    ``jax.nn.gelu`` or ``jax.nn.silu``; it sees the float32 product before the
    cast to the output dtype.
    """
    return matmul_blocked(x, y, activation=activation, block_m=block_m, block_k=block_k,
                          block_n=block_n)


@supports(blocks={"block_m": "m", "block_k": "k", "block_n": "n"})
def batched_matmul(x: jax.Array, y: jax.Array, *, block_m: int | None = None,
                   block_k: int | None = None, block_n: int | None = None) -> jax.Array:
    """``(b, m, k) @ (b, k, n)``: ``jax.vmap`` of the 2-D kernel.

    vmap adds the batch as a leading "parallel" grid axis, so the kernel body
    does not change: grid ``(b, i, j, k)``.
    """
    _check_operands(x, y, batched=True)
    return jax.vmap(functools.partial(matmul, block_m=block_m, block_k=block_k,
                                      block_n=block_n))(x, y)


# --- the pl.kernel + emit_pipeline formulation ----------------------------------------


def matmul_pipeline(x_hbm, y_hbm, o_hbm, acc_ref, *, block_m: int, block_k: int,
                    block_n: int, core_axis_name: str | None = None) -> None:
    """``o_hbm = x_hbm @ y_hbm`` as one ``pltpu.emit_pipeline``, called inside a kernel.

    The refs live in HBM (``pl.ANY``, the TensorCore mesh's default): nothing is
    copied in before the kernel body runs. ``emit_pipeline`` allocates the
    double-buffered VMEM blocks and issues the DMAs a ``pallas_call`` grid would,
    here as a loop written inside the kernel, so the same pipeline serves in
    ``pl.kernel``, a grid-less ``pallas_call`` or ``pl.core_map``, or several in
    a row. ``acc_ref`` is a float32 VMEM accumulator of one output block; every
    dimension is a multiple of its block. On a megacore chip ``core_axis_name``
    (the TensorCore mesh's axis) gives each TensorCore a share of the parallel
    axes.
    """
    (m, k), n = x_hbm.shape, y_hbm.shape[1]
    grid = (m // block_m, n // block_n, k // block_k)

    def block_step(x_block, y_block, o_block):
        k_index = pl.program_id(2)

        @pl.when(k_index == 0)
        def _initialise():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_block[...], y_block[...], preferred_element_type=jnp.float32)

        @pl.when(k_index == grid[2] - 1)
        def _write_back():
            o_block[...] = acc_ref[...].astype(o_block.dtype)

    pltpu.emit_pipeline(
        block_step,
        grid=grid,
        in_specs=[
            pl.BlockSpec((block_m, block_k), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((block_k, block_n), lambda i, j, kk: (kk, j)),
        ],
        out_specs=[pl.BlockSpec((block_m, block_n), lambda i, j, kk: (i, j))],
        core_axis_name=core_axis_name,
        dimension_semantics=(pltpu.PARALLEL, pltpu.PARALLEL, pltpu.ARBITRARY),
    )(x_hbm, y_hbm, o_hbm)


@functools.partial(jax.jit, static_argnames=("block_m", "block_k", "block_n", "num_cores"))
def _matmul_emit_pipeline(x, y, *, block_m: int, block_k: int, block_n: int, num_cores: int):
    m, n = x.shape[0], y.shape[1]
    x, y = _padded_to_blocks(x, y, block_m, block_k, block_n)
    # On a megacore chip each TensorCore takes a share of the parallel axes. With
    # one core there is nothing to split, and naming the core axis would fail in
    # plain interpret mode, which does not bind it.
    kernel = functools.partial(matmul_pipeline, block_m=block_m, block_k=block_k,
                               block_n=block_n,
                               core_axis_name="core" if num_cores > 1 else None)
    out = pl.kernel(
        kernel,
        out_type=output_struct((x.shape[0], y.shape[1]), x.dtype, x, y),
        mesh=tpu.tensorcore_mesh("core", num_cores),
        scratch_types=[pltpu.VMEM((block_m, block_n), jnp.float32)],
        cost_estimate=matmul_cost(x, y, block_m=block_m, block_n=block_n),
        name="matmul_emit_pipeline",
    )(x, y)
    return out[:m, :n]


def matmul_emit_pipeline(
    x: jax.Array,
    y: jax.Array,
    *,
    block_m: int | None = None,
    block_k: int | None = None,
    block_n: int | None = None,
) -> jax.Array:
    """``x @ y`` written with ``pl.kernel`` on a TensorCore mesh and ``pltpu.emit_pipeline``.

    The same blocked algorithm as ``matmul_blocked``, but the pipeline is an
    explicit call inside the kernel instead of the ``pallas_call`` grid: the
    style for kernels that run several pipelines in sequence or mix them with
    hand-written DMAs. Same block rules and defaults as ``matmul_blocked``.

    ``emit_pipeline`` asks ``pltpu.get_tpu_info()`` for the chip's tiling, so on
    the CPU it needs the chip the run stands in for (pytest-pallas registers it
    for tests marked ``pallas``); on a megacore chip the grid is split over the
    two TensorCores, which needs TPU interpret mode on the CPU.
    """
    _check_operands(x, y, batched=False)
    (m, k), n = x.shape, y.shape[1]
    block_m, block_k, block_n = resolve_matmul_blocks(
        m, k, n, x.dtype, block_m, block_k, block_n,
        caps=(DEFAULT_BLOCK_M, DEFAULT_BLOCK_K, DEFAULT_BLOCK_N))
    # TensorCores per device of the chip JAX sees (or stands in for): a static
    # argument, so that a change of chip retraces instead of reusing the mesh.
    num_cores = pltpu.get_tpu_info().num_cores
    return _matmul_emit_pipeline(x, y, block_m=block_m, block_k=block_k, block_n=block_n,
                                 num_cores=num_cores)
