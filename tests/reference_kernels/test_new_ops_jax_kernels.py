"""The kernels JAX ships, as second implementations of the 0.2 ops, through the conformance
suite (``conformance_tests``): the same drawn inputs, oracles, allowances, ``written`` and
``deterministic`` properties, TPU rules and report rows as the reference kernels. A correct
second implementation must pass (no false alarm); a documented defect must fail, as a strict
expected failure whose evidence is a test of its own below.

Adapters to the contract signatures (docs/contract.md, "Operations added in version 0.2"),
with the part of each op's domain the kernel handles declared by ``@supports`` (the report's
"restrictions" column) and an evidence test for each restriction:

* ``flash_attention.flash_attention``: MHA only, so the adapter repeats k and v to the query
  heads (GQA, MQA); key blocks divide t, 128 by default (t % 128);
* megablox ``gmm``: m must be a multiple of its row tile (m % 16);
* ``paged_attention``: one page per compute block (it must divide pages_per_sequence); the
  TPU compiler takes it only with a head dimension that is a multiple of 128 (d % 128);
* ``all_gather``: JAX's wrapper makes its own ``shard_map``; the adapter calls its kernel
  (``ag_kernel``) the way the wrapper does, inside the suite's ``shard_map``. It sends each
  block as two halves of rows, so rows must be even (rows % 2).

Verdicts, the same on jax 0.10.2 and 0.12.0.1: flash attention, megablox gmm, paged
attention in bfloat16 and all_gather on 2 devices pass; paged attention in float32 fails (it
rounds K and V to bfloat16), and all_gather on 4 and 8 devices fails (one receive semaphore
per direction is reused across the ring's steps).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import all_gather as jax_all_gather
from jax.experimental.pallas.ops.tpu import flash_attention as jax_flash
from jax.experimental.pallas.ops.tpu.megablox import gmm as jax_gmm  # ops.gmm, a custom_vjp
from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention_kernel as jax_paged
from jax.sharding import PartitionSpec as P
from test_paged_attention import assert_within_allowance as paged_within_allowance

from pytest_pallas import check_kernel, conformance_tests, operations, supports
from pytest_pallas._compat import jax_internals, tpu_interpreter
from pytest_pallas.checks.kernel_check import kernel_exits_checked
from pytest_pallas.checks.violations import TpuRuleViolation
from pytest_pallas.ops import inputs as op_inputs
from pytest_pallas.ops.domains import declared_domain

pytestmark = pytest.mark.pallas

# Drawn examples of the value property per class, on top of the sweep's explicit ones (each
# value profile once, on a ragged multi-block shape); the written, deterministic and vmap
# properties run two. Each example costs a compilation (a second or so for paged attention),
# so the file stays about a minute.
EXAMPLES = 2
PAGED_EXAMPLES = 1


# --- adapters ---------------------------------------------------------------------------------


# JAX's flash attention takes key blocks that divide the key length; its default, 128, asks
# t % 128 == 0, and so does the adapter. Under the causal mask the op ties s = t (the shorter
# of the two drawn), and the key block is then the whole t when it is below 128. A block of
# one key is not enough in bfloat16 with several queries: the TPU compiler rejects the kernel
# (test_jax_flash_attention_one_key_in_bfloat16); the restriction keeps t = 1 to s = 1.
FLASH_KEY_BLOCK = 128


# Its blocks divide their dimension (ragged_blocks=False): the suite picks the largest
# dividing multiple of the tile below the size, so that s = 256 and t = 256 run two blocks.
@supports(multiple_of={"t": FLASH_KEY_BLOCK}, ragged_blocks=False,
          blocks={"block_q": "s", "block_kv": ("t", FLASH_KEY_BLOCK)})
def jax_flash_attention(q, k, v, *, causal, sm_scale, block_q=None, block_kv=None):
    """JAX's flash attention, k and v repeated to the h query heads (it is MHA only); query
    blocks of 128 rows or the whole of a shorter s, key blocks of 128 or the whole t, unless
    given."""
    ratio = q.shape[1] // k.shape[1]
    k, v = jnp.repeat(k, ratio, axis=1), jnp.repeat(v, ratio, axis=1)
    s, t = q.shape[2], k.shape[2]
    key_block = block_kv or (FLASH_KEY_BLOCK if t % FLASH_KEY_BLOCK == 0 else t)
    blocks = jax_flash.BlockSizes(block_q=block_q or min(FLASH_KEY_BLOCK, s),
                                  block_k_major=key_block, block_k=key_block, block_b=1)
    return jax_flash.flash_attention(q, k, v, causal=causal, sm_scale=sm_scale,
                                     block_sizes=blocks)


GMM_ROW_TILE = 16  # a multiple of the sublane tile of float32 (8) and bfloat16 (16)


@supports(multiple_of={"m": GMM_ROW_TILE})
def jax_grouped_matmul(lhs, rhs, group_sizes):
    """megablox gmm, output in lhs's dtype; m tiles of 16 rows so that groups straddle tiles."""
    # Positional: preferred_element_type and tiling are nondiff arguments of the custom_vjp.
    return jax_gmm(lhs, rhs, group_sizes, lhs.dtype, (GMM_ROW_TILE, 128, 128))


def jax_paged_attention(q, k_pages, v_pages, lengths, page_indices):
    """JAX's paged attention, one page per compute block (it divides every table's width)."""
    return jax_paged.paged_attention(q, k_pages, v_pages, lengths, page_indices,
                                     pages_per_compute_block=1)


# Its head dimension must be a multiple of 128: with fewer than 8 query heads per kv head its
# m and l outputs take q's (.., head_dim) block over a last dimension of 1, which the TPU
# compiler rejects unless head_dim is a multiple of 128 (test_jax_paged_attention_head_dim).
PAGED_HEAD_DIM = 128
jax_paged_attention_bfloat16 = supports(dtypes=("bfloat16",),
                                        multiple_of={"d": PAGED_HEAD_DIM})(
    functools.partial(jax_paged_attention))
jax_paged_attention_float32 = supports(dtypes=("float32",),
                                       multiple_of={"d": PAGED_HEAD_DIM})(
    functools.partial(jax_paged_attention))


def jax_all_gather_in_shard_map(x, *, axis_name):
    """JAX's all_gather kernel on this device's block, as ``all_gather``'s wrapper calls it
    (its blocks in HBM: ``memory_space=pl.ANY``), inside the caller's ``shard_map``."""
    devices = lax.axis_size(axis_name)
    kernel = functools.partial(jax_all_gather.ag_kernel, axis_name=axis_name,
                               mesh=jax.sharding.get_abstract_mesh())
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((devices, *x.shape), x.dtype),
        compiler_params=pltpu.CompilerParams(collective_id=0),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            scratch_shapes=((pltpu.SemaphoreType.DMA,) * 2, (pltpu.SemaphoreType.DMA,) * 2),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
        ),
    )(x)
    return out.reshape(devices * x.shape[0], *x.shape[1:])


# One ring step (2 devices): the shared receive semaphore has only one copy to count.
jax_all_gather_two_devices = supports(max_size={"devices": 2}, multiple_of={"rows": 2})(
    functools.partial(jax_all_gather_in_shard_map))
# Three or more ring steps' copies share each receive semaphore: 4 and 8 devices.
jax_all_gather_ring = supports(multiple_of={"devices": 4, "rows": 2})(
    functools.partial(jax_all_gather_in_shard_map))


# --- through the conformance suite ------------------------------------------------------------


@pytest.fixture
def _tpu_interpreter(pallas_backend):
    """Remote DMAs, semaphores and devices exist in the TPU interpreter only."""
    if pallas_backend.interpreter == "plain":
        pytest.skip("remote DMAs need TPU interpret mode (--pallas-interpret=tpu)")


def _in_the_tpu_interpreter(cls):
    """A ``conformance_tests`` class that skips under ``--pallas-interpret=plain``."""
    cls.pytestmark = [*cls.pytestmark, pytest.mark.usefixtures("_tpu_interpreter")]
    return cls


def _value_expected_to_fail(cls, reason):
    """A ``conformance_tests`` class whose value property is a strict expected failure.

    Its other properties are left out, each costing as much again: paged attention's are the
    bfloat16 class's on the same kernel; the ring's ``written`` fails on the same unwritten
    rows.
    """
    cls.test_value = pytest.mark.xfail(strict=True, raises=AssertionError,
                                       reason=reason)(cls.test_value)
    for name in ("test_written_and_deterministic", "test_vmap"):
        if hasattr(cls, name):
            delattr(cls, name)
    return cls


TestJaxFlashAttention = conformance_tests(
    operations.flash_attention, jax_flash_attention, examples=EXAMPLES,
    label="jax flash_attention (k, v repeated)")

TestJaxMegabloxGmm = conformance_tests(
    operations.grouped_matmul, jax_grouped_matmul, examples=EXAMPLES, label="jax megablox gmm")

TestJaxPagedAttention = conformance_tests(
    operations.paged_attention, jax_paged_attention_bfloat16, examples=PAGED_EXAMPLES,
    label="jax paged_attention")

PAGED_FLOAT32_DEFECT = (
    "JAX's paged_attention rounds float32 K and V to bfloat16 (_maybe_dequantize(x, "
    "dtype=jnp.bfloat16)): its logits err by 2**-9 relative, beyond float32's allowance; "
    "evidence: test_jax_paged_attention_float32_error_is_the_bfloat16_rounding_of_k_and_v")
TestJaxPagedAttentionFloat32 = _value_expected_to_fail(conformance_tests(
    operations.paged_attention, jax_paged_attention_float32, examples=PAGED_EXAMPLES,
    label="jax paged_attention, float32"), PAGED_FLOAT32_DEFECT)

TestJaxAllGather = _in_the_tpu_interpreter(conformance_tests(
    operations.all_gather, jax_all_gather_two_devices, examples=EXAMPLES,
    label="jax all_gather, 2 devices"))

ALL_GATHER_RING_DEFECT = (
    "JAX's all_gather waits on one receive semaphore per direction across the ring's steps: "
    "a later step's copy satisfies the wait for an earlier one and the device forwards rows "
    "that have not arrived (NaN-poisoned in the TPU interpreter); evidence: "
    "test_jax_all_gather_forwards_rows_before_they_arrive")
TestJaxAllGatherRing = _in_the_tpu_interpreter(_value_expected_to_fail(conformance_tests(
    operations.all_gather, jax_all_gather_ring, examples=EXAMPLES,
    label="jax all_gather, 4 and 8 devices"), ALL_GATHER_RING_DEFECT))


# --- the evidence for the expected failures ---------------------------------------------------


# The suite's float32 sweep cases whose values bfloat16 cannot hold ("ties" and "offset" are
# small integers, which it holds exactly): the examples the expected failure fails on.
_PAGED_FLOAT32_DOMAIN = declared_domain(jax_paged_attention_float32)
_ROUNDED_BY_BFLOAT16 = [
    index for index, (_, profile) in enumerate(op_inputs.sweep(operations.paged_attention,
                                                               _PAGED_FLOAT32_DOMAIN))
    if profile not in ("ties", "offset")]


@pytest.mark.parametrize("sweep_case", _ROUNDED_BY_BFLOAT16)
def test_jax_paged_attention_float32_error_is_the_bfloat16_rounding_of_k_and_v(sweep_case):
    """The evidence for the float32 expected failure, on the suite's own sweep case: with K
    and V rounded to bfloat16, the float64 oracle agrees with JAX's float32 result within the
    float32 allowance; the oracle of the inputs as given does not."""
    case = op_inputs.sweep_case(operations.paged_attention, _PAGED_FLOAT32_DOMAIN, sweep_case)
    q, k_pages, v_pages, lengths, page_indices = case.args
    assert case.dtype == "float32"
    out = jax.jit(jax_paged_attention)(*case.args)
    rounded = [np.asarray(jnp.asarray(p).astype(jnp.bfloat16).astype(jnp.float32))
               for p in (k_pages, v_pages)]
    paged_within_allowance(out, q, *rounded, lengths, page_indices)
    with pytest.raises(AssertionError):
        paged_within_allowance(out, *case.args)


@pytest.fixture
def _tpu_compiler():
    from pytest_pallas.checks.compile_check import libtpu_version

    if libtpu_version() is None:
        pytest.skip("the TPU compiler's verdict needs libtpu: pip install 'pytest-pallas[tpu]'")


@pytest.mark.usefixtures("_tpu_compiler")
def test_jax_flash_attention_one_key_in_bfloat16():
    """The evidence for its t % 128 == 0: with a key block of the whole t = 1 and 100 queries,
    the TPU compiler rejects JAX's kernel in bfloat16 (Mosaic: "'vector.broadcast' op failed
    to verify that source operand and result have same element type") and accepts it in
    float32, and with a single query."""
    def shapes(s, t, dtype):
        return [jax.ShapeDtypeStruct((1, 2, n, 32), dtype) for n in (s, t, t)]

    attention = functools.partial(jax_flash_attention, causal=False, sm_scale=1.0)
    with pytest.raises(TpuRuleViolation, match="vector.broadcast"):
        check_kernel(attention, *shapes(100, 1, jnp.bfloat16), chip="v5e", use_compiler=True)
    check_kernel(attention, *shapes(100, 1, jnp.float32), chip="v5e", use_compiler=True)
    check_kernel(attention, *shapes(1, 1, jnp.bfloat16), chip="v5e", use_compiler=True)


@pytest.mark.parametrize("h, g", [(4, 2), (16, 2)], ids=["2-heads-per-kv", "8-heads-per-kv"])
def test_jax_paged_attention_head_dim(h, g):
    """The evidence for its ``d % 128 == 0``: at d = 32 its m and l outputs take a
    (.., 32) block over a last dimension of 1, which the TPU compiler (with libtpu; else the
    static rule it states) rejects; at d = 128 it compiles."""
    shapes = [((4, h, d), (g, 8, 16, d)) for d in (32, PAGED_HEAD_DIM)]
    for (q_shape, pages_shape), compiles in zip(shapes, (False, True)):
        args = (jax.ShapeDtypeStruct(q_shape, jnp.bfloat16),
                jax.ShapeDtypeStruct(pages_shape, jnp.bfloat16),
                jax.ShapeDtypeStruct(pages_shape, jnp.bfloat16),
                jax.ShapeDtypeStruct((4,), jnp.int32), jax.ShapeDtypeStruct((4, 2), jnp.int32))
        if compiles:
            check_kernel(jax_paged_attention, *args, chip="v5e")
        else:
            with pytest.raises(TpuRuleViolation, match="tiling"):
                check_kernel(jax_paged_attention, *args, chip="v5e")


def _all_gather_on(mesh, rows=8, cols=128):
    """JAX's all_gather kernel through the adapter on ``mesh``: (result, expected)."""
    devices = mesh.devices.size
    x = np.random.default_rng(devices).standard_normal((devices * rows, cols)).astype(np.float32)
    gather = jax.jit(jax.shard_map(
        functools.partial(jax_all_gather_in_shard_map, axis_name=mesh.axis_names[0]), mesh=mesh,
        in_specs=P(mesh.axis_names[0]), out_specs=P(mesh.axis_names[0]), check_vma=False))
    return np.asarray(jax.block_until_ready(gather(x))), np.concatenate([x] * devices)


@pytest.mark.usefixtures("_tpu_interpreter")
@pytest.mark.parametrize("devices", [4, 8])
def test_jax_all_gather_forwards_rows_before_they_arrive(device_mesh, devices):
    """The evidence for the ring's expected failure. The TPU interpreter completes a DMA when
    its semaphore is waited on, the latest issued first, as the chip may complete copies out
    of order: a device's wait for step i's copy is then satisfied by its neighbour's step
    i + 1 copy (the same byte count on the same semaphore), and it forwards rows of step i
    that have not arrived; memory nobody wrote is NaN. With every DMA completed as soon as it
    is issued, in order, the same kernel is exact and race-free: only the order breaks it."""
    mesh = device_mesh(devices)
    in_order = jax_internals.interpret_params(dma_execution_mode="eager", detect_races=True,
                                            uninitialized_memory="nan")
    with pltpu.force_tpu_interpret_mode(in_order), kernel_exits_checked():
        out, expected = _all_gather_on(mesh)
    np.testing.assert_array_equal(out, expected)

    completed_on_wait = jax_internals.interpret_params(uninitialized_memory="nan")
    with pltpu.force_tpu_interpret_mode(completed_on_wait):
        out, expected = _all_gather_on(mesh)
    unwritten = np.isnan(out)
    assert unwritten.any(), "every row arrived"
    assert np.array_equal(out[~unwritten], expected[~unwritten])  # the rest is right


@pytest.mark.usefixtures("_tpu_interpreter")
def test_jax_all_gather_on_eight_devices_for_the_race_detector(device_mesh):
    """The race detector's report on JAX's all_gather over 8 devices: ag_kernel reads a slot it
    forwards before the copy into it is ordered before the read. The test asks JAX to detect
    races itself, so the verdict is the test's: the plugin judges races only when
    --pallas-detect-races asks it to."""
    detecting = jax_internals.interpret_params(detect_races=True, uninitialized_memory="nan")
    with pltpu.force_tpu_interpret_mode(detecting):
        _all_gather_on(device_mesh(8))
    assert tpu_interpreter.races_found(), "JAX's race detector found no race in all_gather"


@pytest.mark.usefixtures("_tpu_interpreter")
def test_jax_all_gather_with_odd_rows_never_sends_the_last_row(device_mesh):
    """The evidence for its rows % 2 == 0: it sends each block as two halves of rows // 2, so
    with 5 rows the fifth never leaves its device (NaN elsewhere), even with every DMA
    completed in order on 2 devices, where the shared semaphore does no harm."""
    in_order = jax_internals.interpret_params(dma_execution_mode="eager",
                                            uninitialized_memory="nan")
    with pltpu.force_tpu_interpret_mode(in_order):
        out, expected = _all_gather_on(device_mesh(2), rows=5)
    unwritten_rows = sorted({int(row) for row in np.argwhere(np.isnan(out))[:, 0]})
    # Device 0's result is rows 0-9, device 1's rows 10-19; block i is rows 5i to 5i + 4.
    assert unwritten_rows == [9, 14], unwritten_rows  # device 0 misses 1's row 4, 1 misses 0's
    assert np.array_equal(out[~np.isnan(out)], expected[~np.isnan(out)])
