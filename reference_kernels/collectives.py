"""Collectives written by hand: remote DMAs between the devices of a mesh.

Contract op (docs/contract.md section 2):

* ``ppermute(x, *, axis_name, shift)``: called inside ``jax.shard_map`` over a
  1-D mesh axis ``axis_name`` of n devices; device i returns the block that
  device ``(i - shift) mod n`` held (``lax.ppermute`` with the pairs
  ``(j, (j + shift) mod n)``).

Version 0.2 ops (docs/contract.md section 2):

* ``all_gather(x, *, axis_name)``: every device returns the blocks of all
  devices, concatenated along the rows (``lax.all_gather(x, axis_name,
  tiled=True)``), gathered around a ring in ``n - 1`` steps.
* ``reduce_scatter(x, *, axis_name)``: x is ``(n * rows, ...)`` on every
  device; device i returns rows block i of the sum over devices
  (``lax.psum_scatter(x, axis_name, tiled=True)``), reduced around a ring in
  ``n - 1`` steps, each device adding its own block to the partial sum it
  receives before passing it on.

Each op sits next to its NumPy oracle (``*_reference``, taking the list of
per-device blocks) and its cost model (``*_cost``, per device, with
``remote_bytes_transferred``).

The TPU ideas shown here:

* ``pltpu.make_async_remote_copy(src, dst, send_sem, recv_sem, device_id=...)``
  is a DMA from this device's ``src`` into ``dst`` on another device, over the
  chip-to-chip links (ICI). The sender waits on ``send_sem`` (its ``src`` may be
  reused), the receiver on ``recv_sem`` (its ``dst`` is complete). Both refs
  stay in HBM (``pl.ANY``): no VMEM is involved.
* A remote write must not land before the receiver has entered the kernel
  (its output buffer may not exist yet, or still be in use by the previous
  op). Each device therefore signals the device that will write into it,
  through the barrier semaphore of the kernel's ``collective_id``, and waits
  until the device it writes into has signalled it.
* A ring reduce moves partial sums, not blocks: at step s device i sends the
  partial sum of block ``(i - 1 - s) mod n`` to its right neighbour, receives
  block ``(i - 2 - s) mod n``'s from its left one and adds its own rows of that
  block; after ``n - 1`` steps the partial sum it received last is block i's
  total, each block having passed through every device once. Each device
  sends ``n - 1`` blocks, the least a reduce-scatter can: the ring's cost does
  not grow with n. Floating-point partial sums travel as float32 (bfloat16
  inputs too), so the sum is not rounded to bfloat16 at every hop.
* ``device_id`` names the peer by its mesh coordinates, given as
  ``{axis_name: index}``: right for the 1-D mesh of the contract, and still
  right when the mesh has more axes, whose coordinates are then this device's
  own. A flattened device index would equal the coordinate only on a 1-D mesh.

Remote DMAs and semaphores exist only on a TPU and in TPU interpret mode
(``pltpu.InterpretParams``); the plain interpreter (``interpret=True``)
cannot run these kernels.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ._tiling import native_sublanes, round_up

__all__ = [
    "all_gather",
    "all_gather_cost",
    "all_gather_reference",
    "ppermute",
    "ppermute_cost",
    "ppermute_reference",
    "reduce_scatter",
    "reduce_scatter_cost",
    "reduce_scatter_error_allowance",
    "reduce_scatter_reference",
]

# One barrier semaphore per communication pattern: two kernels that signal
# different peers must not share one, or a fast device's signal for the next
# kernel could release a slow device still waiting in the previous kernel.
# ppermute by s (1 <= s < n) uses collective_id s; all_gather uses 0 and
# reduce_scatter 0 too: both signal their left neighbour, the same pattern.
_ALL_GATHER_COLLECTIVE_ID = 0
_REDUCE_SCATTER_COLLECTIVE_ID = 0


# --- helpers ----------------------------------------------------------------------


def _nbytes(x: Any) -> int:
    return math.prod(x.shape) * jnp.dtype(x.dtype).itemsize


def _axis_size(axis_name: Any, op_name: str) -> int:
    try:
        return lax.axis_size(axis_name)
    except NameError as error:
        raise ValueError(
            f"{op_name} must be called inside jax.shard_map over a mesh with axis {axis_name!r} "
            f"({error})"
        ) from None


def _check_block(op_name: str, x: Any) -> None:
    if jnp.ndim(x) < 1:
        raise ValueError(
            f"{op_name}: x must have rank >= 1 (a per-device block), got shape {jnp.shape(x)}"
        )
    if min(x.shape) < 1:
        raise ValueError(f"{op_name}: x must have sizes >= 1, got shape {x.shape}")


def _varying_out_shape(x: Any, axis_name: Any, shape: tuple[int, ...]) -> jax.ShapeDtypeStruct:
    """The kernel's output type: an array that differs from device to device along ``axis_name``.

    Inside ``shard_map(check_vma=True)`` (the default) a ``pallas_call`` must
    say how its output varies over the mesh axes; ``lax.ppermute`` and
    ``lax.all_gather`` give their results the input's varying axes.
    """
    axes = jax.typeof(x).mat
    varying = frozenset(axes.varying) | {axis_name}
    return jax.ShapeDtypeStruct(
        shape, x.dtype,
        manual_axis_type=jax.sharding.ManualAxisType(
            varying=varying, unreduced=axes.unreduced - varying, reduced=axes.reduced - varying),
    )


def _peer_indices(axis_name: Any, num_devices: int, shift: int) -> jax.Array:
    """``[(i + shift) mod n, (i - shift) mod n]`` for this device i, as int32.

    Computed outside the kernel and handed to it through SMEM (scalar
    prefetch): inside a kernel under ``shard_map(check_vma=True)``, JAX 0.10's
    TPU interpreter rejects arithmetic between ``lax.axis_index`` and a
    constant ("Primitive add requires varying manual axes to match").
    """
    me = lax.axis_index(axis_name)
    return jnp.stack([
        lax.rem(me + shift, num_devices),
        lax.rem(me + num_devices - shift, num_devices),
    ]).astype(jnp.int32)


def _blocks(blocks: Any) -> list[np.ndarray]:
    blocks = [np.asarray(block) for block in blocks]
    if not blocks:
        raise ValueError("expected at least one per-device block")
    return blocks


# --- oracles ----------------------------------------------------------------------


def ppermute_reference(blocks: Sequence[np.ndarray] | np.ndarray, shift: int) -> np.ndarray:
    """The blocks after the permutation: entry i is ``blocks[(i - shift) mod n]``.

    ``blocks`` is the list (or stacked array) of per-device blocks, in mesh
    order. The result is stacked, ``(n, *block_shape)``, in the blocks' dtype:
    moving data is exact.

    >>> ppermute_reference([np.int32([0]), np.int32([1]), np.int32([2])], 1)[:, 0]
    array([2, 0, 1], dtype=int32)
    """
    blocks = _blocks(blocks)
    n = len(blocks)
    return np.stack([blocks[(i - shift) % n] for i in range(n)])


def all_gather_reference(blocks: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    """What every device returns: the blocks concatenated along the rows, in mesh order.

    ``(n * rows, ...)`` in the blocks' dtype. Under ``shard_map`` with
    ``out_specs=P(axis_name)``, the global result is this repeated n times.
    """
    return np.concatenate(_blocks(blocks), axis=0)


# --- cost models -------------------------------------------------------------------


def ppermute_cost(x: Any, *, num_devices: int, shift: int) -> pl.CostEstimate:
    """Per device: the block read once from HBM and one block written; one block sent over ICI.

    A shift that is a multiple of n sends nothing (the kernel copies locally).
    """
    nbytes = _nbytes(x)
    remote = 0 if shift % num_devices == 0 else nbytes
    return pl.CostEstimate(flops=0, transcendentals=0, bytes_accessed=2 * nbytes,
                           remote_bytes_transferred=remote)


def all_gather_cost(x: Any, *, num_devices: int) -> pl.CostEstimate:
    """Per device: n - 1 blocks sent and n - 1 received, plus the local copy of its own block.

    HBM traffic: the own block read and written (local copy), then each of the
    n - 1 sent blocks read and each of the n - 1 received blocks written.
    """
    nbytes = _nbytes(x)
    return pl.CostEstimate(
        flops=0, transcendentals=0,
        bytes_accessed=2 * num_devices * nbytes,
        remote_bytes_transferred=(num_devices - 1) * nbytes,
    )


# --- ppermute --------------------------------------------------------------------------


def _ppermute_kernel(peers_smem, x_hbm, o_hbm, send_sem, recv_sem, *, axis_name: Any):
    """Send this device's block into ``o_hbm`` of device ``dst``; receive ``src``'s into ours.

    The handshake: tell ``src`` (the device that writes into us) that our
    ``o_hbm`` exists, then wait until ``dst`` has told us the same. The
    barrier semaphore is waited back down to 0, as the next kernel with this
    ``collective_id`` expects.
    """
    dst = peers_smem[0]
    src = peers_smem[1]
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, 1, device_id={axis_name: src})
    pl.semaphore_wait(barrier, 1)

    send = pltpu.make_async_remote_copy(
        x_hbm, o_hbm, send_sem, recv_sem,
        device_id={axis_name: dst},
    )
    send.start()
    # x_hbm must stay valid until it has been read, and o_hbm must be complete
    # before the kernel returns: wait on both sides of the transfer.
    send.wait_send()
    send.wait_recv()


def _local_copy_kernel(x_hbm, o_hbm, sem):
    # A shift by a multiple of n keeps every block where it is: no peers, no barrier.
    local = pltpu.make_async_copy(x_hbm, o_hbm, sem)
    local.start()
    local.wait()


def _ppermute_call(x, *, axis_name: Any, shift: int) -> jax.Array:
    num_devices = _axis_size(axis_name, "ppermute")
    shift = shift % num_devices
    cost = ppermute_cost(x, num_devices=num_devices, shift=shift)
    out_shape = _varying_out_shape(x, axis_name, x.shape)
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    if shift == 0:
        return pl.pallas_call(
            _local_copy_kernel,
            out_shape=out_shape,
            in_specs=[hbm],
            out_specs=hbm,
            scratch_shapes=[pltpu.SemaphoreType.DMA],
            cost_estimate=cost,
            name="ppermute",
        )(x)
    return pl.pallas_call(
        functools.partial(_ppermute_kernel, axis_name=axis_name),
        out_shape=out_shape,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            in_specs=[hbm],
            out_specs=hbm,
            scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA],
        ),
        compiler_params=pltpu.CompilerParams(collective_id=shift),
        cost_estimate=cost,
        name="ppermute",
    )(_peer_indices(axis_name, num_devices, shift), x)


def ppermute(x: jax.Array, *, axis_name: Any, shift: int) -> jax.Array:
    """Rotate the per-device blocks by ``shift`` along ``axis_name``: device i gets
    ``(i - shift) mod n``'s.

    Call it inside ``jax.shard_map`` (over a mesh with axis ``axis_name``, of
    any size); ``x`` is this device's block, of any shape and dtype. ``shift``
    is any int, reduced modulo n. Under ``jax.vmap`` the batched block is sent
    whole (the kernel never looks at the shape).

    Needs a TPU or TPU interpret mode.
    """
    if isinstance(shift, bool) or not isinstance(shift, (int, np.integer)):
        raise TypeError(f"ppermute: shift must be an int, got {shift!r}")
    _check_block("ppermute", x)

    @jax.custom_batching.custom_vmap
    def call(block):
        return _ppermute_call(block, axis_name=axis_name, shift=int(shift))

    @call.def_vmap
    def _batched(axis_size, in_batched, block):
        del axis_size, in_batched
        return call(block), True

    return call(x)


# --- all_gather --------------------------------------------------------------------------


def _all_gather_kernel(peers_smem, x_hbm, o_hbm, local_sem, send_sem, recv_sems, *,
                       axis_name: Any, num_devices: int):
    """A one-directional ring: at step k, forward the block that came from ``k`` devices to
    the left.

    ``o_hbm`` is ``(n, *block)``. Device i first copies its own block into
    slot i, then, at step k = 0 .. n - 2, sends slot ``(i - k) mod n`` to
    slot ``(i - k) mod n`` of its right neighbour and waits for its left
    neighbour's block to arrive in slot ``(i - k - 1) mod n``, which is the
    one it forwards next. Every slot of every device is written exactly once,
    so after the initial handshake no buffer is overwritten while in use.

    Each step has its own receive semaphore. The left neighbour does not wait
    for us: it may already have sent step k + 1's block while step k's is still
    in flight, and a shared semaphore would then count the wrong block as
    arrived (TPU interpret mode, which may complete DMAs out of order, shows
    this as NaN-poisoned slots on 4 or more devices).
    """
    right = peers_smem[0]
    left = peers_smem[1]
    me = lax.rem(right + num_devices - 1, num_devices)

    # Own block first: step 0 sends it from o_hbm, so it must be in place.
    local = pltpu.make_async_copy(x_hbm, o_hbm.at[me], local_sem)
    local.start()

    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, 1, device_id={axis_name: left})
    pl.semaphore_wait(barrier, 1)
    local.wait()

    for step in range(num_devices - 1):
        slot = lax.rem(me + num_devices - step, num_devices)
        forward = pltpu.make_async_remote_copy(
            o_hbm.at[slot], o_hbm.at[slot], send_sem, recv_sems.at[step],
            device_id={axis_name: right},
        )
        forward.start()
        forward.wait_send()
        # The left neighbour's block of this step (same shape and semaphore,
        # so this descriptor counts its bytes) is what the next step forwards.
        forward.wait_recv()


def _all_gather_slots(x, *, axis_name: Any) -> jax.Array:
    """``(n, *x.shape)``: slot j holds device j's block."""
    num_devices = _axis_size(axis_name, "all_gather")
    if num_devices == 1:
        return x[None]
    return pl.pallas_call(
        functools.partial(_all_gather_kernel, axis_name=axis_name, num_devices=num_devices),
        out_shape=_varying_out_shape(x, axis_name, (num_devices, *x.shape)),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[
                pltpu.SemaphoreType.DMA,
                pltpu.SemaphoreType.DMA,
                pltpu.SemaphoreType.DMA((num_devices - 1,)),
            ],
        ),
        compiler_params=pltpu.CompilerParams(collective_id=_ALL_GATHER_COLLECTIVE_ID),
        cost_estimate=all_gather_cost(x, num_devices=num_devices),
        name="all_gather",
    )(_peer_indices(axis_name, num_devices, 1), x)


def all_gather(x: jax.Array, *, axis_name: Any) -> jax.Array:
    """Every device's block, concatenated along the rows:
    ``lax.all_gather(x, axis_name, tiled=True)``.

    Call it inside ``jax.shard_map``; ``x`` is this device's block (rank >= 1,
    any size and dtype). Under ``jax.vmap`` each batch element is gathered
    along its own rows. Needs a TPU or TPU interpret mode.
    """
    _check_block("all_gather", x)

    @jax.custom_batching.custom_vmap
    def call(block):
        # (n, rows, ...) -> (n * rows, ...): the slots are contiguous, a free reshape.
        slots = _all_gather_slots(block, axis_name=axis_name)
        return slots.reshape(-1, *block.shape[1:])

    @call.def_vmap
    def _batched(axis_size, in_batched, block):
        del axis_size, in_batched
        slots = _all_gather_slots(block, axis_name=axis_name)  # (n, batch, rows, ...)
        slots = jnp.moveaxis(slots, 0, 1)
        return slots.reshape(block.shape[0], -1, *block.shape[2:]), True

    return call(x)


# --- reduce_scatter -----------------------------------------------------------------------------


def reduce_scatter_reference(blocks: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    """What each device returns: rows block i of the sum of all devices' x, stacked over i.

    ``blocks`` is the list of per-device x, each ``(n * rows, ...)``. The result
    is ``(n, rows, ...)``: float64 for floating inputs; for integers the sum
    wraps to the input dtype, as ``jnp`` integer arithmetic does.

    >>> reduce_scatter_reference([np.int32([1, 2]), np.int32([10, 20])])
    array([[11],
           [22]], dtype=int32)
    """
    blocks = _blocks(blocks)
    n = len(blocks)
    if blocks[0].shape[0] % n:
        raise ValueError(f"each x must have a multiple of {n} rows, got shape {blocks[0].shape}")
    dtype = blocks[0].dtype
    if np.issubdtype(dtype, np.integer):
        total = np.sum([b.astype(np.int64) for b in blocks], axis=0).astype(dtype)
    else:
        total = np.sum([b.astype(np.float64) for b in blocks], axis=0)
    return total.reshape(n, -1, *total.shape[1:])


def reduce_scatter_error_allowance(blocks: Sequence[np.ndarray] | np.ndarray) -> float:
    """The absolute error a ring sum may carry beyond the comparator's default (reduction
    length n): ``(n - 1) * u * max sum_devices |x|``, u the unit roundoff of x's dtype.

    Derivation: a ring adds each device's term to a partial sum passed along,
    ``n - 1`` additions per element; if the partial sums travel in x's own dtype
    (as ``lax.psum_scatter`` may do), each addition rounds by at most u times
    the partial sum, itself at most ``sum_devices |x|``. This kernel sends
    float32 partials and errs far less; the allowance is what any correct ring
    may need. Integer sums are exact (0).
    """
    blocks = _blocks(blocks)
    dtype = blocks[0].dtype
    if not np.issubdtype(dtype, np.inexact) and dtype.name != "bfloat16":
        return 0.0

    unit_roundoff = float(ml_dtypes.finfo(dtype).eps) / 2
    magnitude = np.sum([np.abs(b.astype(np.float64)) for b in blocks], axis=0)
    return (len(blocks) - 1) * unit_roundoff * float(magnitude.max(initial=0.0))


def _wire_dtype(dtype: Any) -> Any:
    """The dtype partial sums travel in: float32 for floats, the input's own for integers."""
    return jnp.float32 if jnp.issubdtype(dtype, jnp.floating) else jnp.dtype(dtype)


def reduce_scatter_cost(x: Any, *, num_devices: int) -> pl.CostEstimate:
    """Per device: its x read once from HBM, its block of the sum written once; n - 1 partial
    sums of one block sent (in float32 for floats) and n - 1 additions per block element."""
    block_elements = math.prod(x.shape) // num_devices
    itemsize = jnp.dtype(x.dtype).itemsize
    return pl.CostEstimate(
        flops=(num_devices - 1) * block_elements,
        transcendentals=0,
        bytes_accessed=itemsize * (math.prod(x.shape) + block_elements),
        remote_bytes_transferred=(num_devices - 1) * block_elements
        * jnp.dtype(_wire_dtype(x.dtype)).itemsize,
    )


def _reduce_scatter_kernel(peers_smem, x_hbm, o_ref, own, stage, received, local_sems, send_sem,
                           recv_sems, *, axis_name: Any, num_devices: int):
    """The ring: see the module docstring. ``own`` double-buffers this device's rows of the
    block being reduced (loaded from HBM while the previous step's transfer runs), ``stage``
    holds the partial sum being sent, ``received`` has one slot, and one receive semaphore,
    per step: the left neighbour may send step s + 1's partial sum before we have read step
    s's, and a shared slot or semaphore would confuse the two (as in ``all_gather``).
    """
    n = num_devices
    rows = own.shape[1]
    right = peers_smem[0]
    left = peers_smem[1]
    me = lax.rem(right + n - 1, n)

    def load_own(block, slot):
        return pltpu.make_async_copy(x_hbm.at[pl.ds(block * rows, rows)], own.at[slot],
                                     local_sems.at[slot])

    first = load_own(lax.rem(me + n - 1, n), 0)
    first.start()

    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, 1, device_id={axis_name: left})
    pl.semaphore_wait(barrier, 1)
    first.wait()
    stage[...] = own[0].astype(stage.dtype)

    for step in range(n - 1):
        slot = (step + 1) % 2
        own_rows = load_own(lax.rem(me + 2 * n - 2 - step, n), slot)
        own_rows.start()
        send = pltpu.make_async_remote_copy(
            stage, received.at[step], send_sem, recv_sems.at[step],
            device_id={axis_name: right},
        )
        send.start()
        own_rows.wait()
        send.wait_send()  # stage may now be overwritten
        send.wait_recv()  # the left neighbour's partial sum is in received[step]
        total = received[step] + own[slot].astype(stage.dtype)
        if step < n - 2:
            stage[...] = total
        else:
            o_ref[...] = total.astype(o_ref.dtype)


def _reduce_scatter_call(x, *, axis_name: Any) -> jax.Array:
    num_devices = _axis_size(axis_name, "reduce_scatter")
    if x.shape[0] % num_devices:
        raise ValueError(
            f"reduce_scatter: x has {x.shape[0]} rows, not a multiple of the {num_devices} "
            f"devices of axis {axis_name!r}; give every device (devices * rows, ...)"
        )
    if num_devices == 1:
        return x
    rows = x.shape[0] // num_devices
    tile = native_sublanes(x.dtype)
    if x.ndim > 1 and rows % tile:
        # The kernel copies block i of x out of HBM at row i * rows: the TPU compiler
        # accepts only offsets that are whole tiles of rows ("Offsets along tiled
        # dimensions must be aligned to tiles"). Pad each block to whole tiles, drop the
        # padding from the result.
        padded = round_up(rows, tile)
        blocks = x.reshape(num_devices, rows, *x.shape[1:])
        blocks = jnp.pad(blocks, [(0, 0), (0, padded - rows)] + [(0, 0)] * (x.ndim - 1))
        out = _reduce_scatter_call(blocks.reshape(num_devices * padded, *x.shape[1:]),
                                   axis_name=axis_name)
        return out[:rows]
    block = (rows, *x.shape[1:])
    wire = _wire_dtype(x.dtype)
    return pl.pallas_call(
        functools.partial(_reduce_scatter_kernel, axis_name=axis_name, num_devices=num_devices),
        out_shape=_varying_out_shape(x, axis_name, block),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
            scratch_shapes=[
                pltpu.VMEM((2, *block), x.dtype),  # own: this device's rows, double-buffered
                pltpu.VMEM(block, wire),  # stage: the partial sum being sent
                pltpu.VMEM((num_devices - 1, *block), wire),  # received: one slot per step
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.SemaphoreType.DMA,
                pltpu.SemaphoreType.DMA((num_devices - 1,)),
            ],
        ),
        compiler_params=pltpu.CompilerParams(collective_id=_REDUCE_SCATTER_COLLECTIVE_ID),
        cost_estimate=reduce_scatter_cost(x, num_devices=num_devices),
        name="reduce_scatter",
    )(_peer_indices(axis_name, num_devices, 1), x)


def reduce_scatter(x: jax.Array, *, axis_name: Any) -> jax.Array:
    """Rows block i of the sum over devices of x, on device i:
    ``lax.psum_scatter(x, axis_name, tiled=True)``.

    Call it inside ``jax.shard_map``; ``x`` is this device's ``(n * rows, ...)``
    array, float32, bfloat16 or int32 (integer sums wrap). Floating sums are
    accumulated in float32. Under ``jax.vmap`` each batch element is reduced and
    scattered along its own rows. Needs a TPU or TPU interpret mode.
    """
    _check_block("reduce_scatter", x)

    @jax.custom_batching.custom_vmap
    def call(block):
        return _reduce_scatter_call(block, axis_name=axis_name)

    @call.def_vmap
    def _batched(axis_size, in_batched, block):
        del axis_size, in_batched
        # (batch, n * rows, ...) -> rows first, so that each device's slice holds every
        # batch element's rows of its block.
        out = _reduce_scatter_call(jnp.moveaxis(block, 0, 1), axis_name=axis_name)
        return jnp.moveaxis(out, 1, 0), True

    return call(x)
