"""Block shapes the TPU rejects are caught on the CPU, by the rule Mosaic applies.

The oracle is Mosaic itself: lowering for the TPU runs on the CPU (no chip
needed), and its block-shape check must agree with the static check on every
case here.
"""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import flash_attention as fa
from jax.experimental.pallas.ops.tpu.matmul import matmul

from pytest_pallas._compat import pallas_call_hooks
from pytest_pallas.checks.kernel_check import CheckOptions, check_kernel, checking_pallas_calls
from pytest_pallas.checks.static_rules import TILING
from pytest_pallas.checks.violations import TpuRuleViolation

pytestmark = pytest.mark.pallas

STATIC_ONLY = CheckOptions(lower_for_tpu=False)
MOSAIC_ONLY = CheckOptions(checks=(), lower_for_tpu=True)


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def blocked_copy(x, block):
    """A one-step copy whose input and output use ``block`` at block index 0."""
    spec = pl.BlockSpec(block, lambda i: (0,) * len(block))
    return pl.pallas_call(
        _copy_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(1,),
        in_specs=[spec],
        out_specs=spec,
        name="blocked_copy",
    )(x)


def _verdict(options, shape, block, dtype, chip="v5e"):
    try:
        check_kernel(
            blocked_copy,
            jax.ShapeDtypeStruct(shape, dtype),
            block,
            chip=chip,
            check_options=options,
            use_compiler=False,  # Mosaic's lowering is the oracle here
        )
    except TpuRuleViolation as error:
        return error.rule
    return None


# (array shape, block shape, dtype, legal on the TPU)
CASES = [
    ((16, 256), (8, 128), jnp.float32, True),
    ((16, 256), (4, 128), jnp.float32, False),  # second-minor not a multiple of 8
    ((16, 256), (8, 64), jnp.float32, False),  # minor not a multiple of 128
    ((16, 100), (8, 100), jnp.float32, True),  # minor equal to the array's
    ((12, 256), (12, 128), jnp.float32, True),  # second-minor equal to the array's
    ((32, 256), (8, 128), jnp.bfloat16, True),  # Mosaic accepts 8 rows of a 16-bit dtype
    ((64, 256), (32, 128), jnp.int8, True),  # an 8-bit dtype is tiled (32, 128)
    ((16, 256), (None, 256), jnp.float32, False),  # a squeezed second-minor counts as 1
    ((1, 256), (None, 256), jnp.float32, True),  # ... which is the full dimension here
    ((4, 16, 256), (None, 8, 128), jnp.float32, True),  # squeezing a leading dimension is free
    ((2048,), (1024,), jnp.float32, True),  # rank 1: a multiple of 8 x 128
    ((2048,), (512,), jnp.float32, True),  # rank 1: a power of two >= 128
    ((2048,), (64,), jnp.float32, False),  # rank 1: a power of two below 128
    ((2048,), (128,), jnp.bfloat16, False),  # rank 1: 16-bit needs a power of two >= 256
    ((2048,), (256,), jnp.bfloat16, True),
    ((3072,), (768,), jnp.float32, False),  # rank 1: neither a power of two nor a multiple of 1024
    ((1000,), (1000,), jnp.float32, True),  # rank 1: the full dimension
]


@pytest.mark.parametrize(
    "shape, block, dtype, legal",
    CASES,
    ids=[f"{s}-{b}-{jnp.dtype(d).name}" for s, b, d, _ in CASES],
)
def test_static_check_agrees_with_mosaic(shape, block, dtype, legal):
    static = _verdict(STATIC_ONLY, shape, block, dtype)
    mosaic = _verdict(MOSAIC_ONLY, shape, block, dtype)
    assert static == (None if legal else TILING)
    assert mosaic == (None if legal else "mosaic-lowering")


def test_eight_rows_of_an_8_bit_dtype_pass_mosaic_lowering_but_not_the_compiler():
    # Mosaic's lowering accepts the block; the TPU compiler rejects it (E2002,
    # CompileTimeMosaicMisalignedBlockAndTiling: int8 is tiled (32, 128)), and so
    # does the static rule.
    assert _verdict(MOSAIC_ONLY, (64, 256), (8, 128), jnp.int8) is None
    assert _verdict(STATIC_ONLY, (64, 256), (8, 128), jnp.int8) == TILING
    assert _verdict(STATIC_ONLY, (64, 256), (16, 128), jnp.int8) == TILING
    from pytest_pallas.checks import compile_check

    version = compile_check.libtpu_version()
    if version is not None:
        compiled = CheckOptions(lower_for_tpu=False, checks=())
        release = tuple(int(part) for part in version.split(".") if part.isdigit())
        if release < (0, 0, 50):
            with pytest.raises(TpuRuleViolation, match="E2002"):
                check_kernel(blocked_copy, jax.ShapeDtypeStruct((64, 256), jnp.int8), (8, 128),
                             check_options=compiled, use_compiler=True)
        else:  # libtpu 0.0.50 (jax 0.12's) compiles it: the static rule is stricter there
            check_kernel(blocked_copy, jax.ShapeDtypeStruct((64, 256), jnp.int8), (8, 128),
                         check_options=compiled, use_compiler=True)


def test_a_kernel_traced_before_checking_began_is_checked_when_traced_again():
    x = jnp.ones((16, 256), jnp.float32)
    with pltpu.force_tpu_interpret_mode(pltpu.InterpretParams()):
        with pallas_call_hooks.suspend_pallas_call_observers():
            jax.make_jaxpr(lambda x: blocked_copy(x, (4, 128)))(x)
        with checking_pallas_calls(), pytest.raises(TpuRuleViolation, match=TILING):
            jax.make_jaxpr(lambda x: blocked_copy(x, (4, 128)))(x)


def test_check_kernel_applies_its_own_options_inside_a_checking_harness():
    with checking_pallas_calls():  # what the plugin wraps a Pallas test in
        assert _verdict(MOSAIC_ONLY, (16, 256), (4, 128), jnp.float32) == "mosaic-lowering"
        strict = CheckOptions(lower_for_tpu=False, packed_sublanes=True)
        assert _verdict(strict, (32, 256), (8, 128), jnp.bfloat16) == TILING


def test_message_names_kernel_rule_operand_and_fix():
    with pytest.raises(TpuRuleViolation) as caught:
        check_kernel(blocked_copy, jax.ShapeDtypeStruct((16, 256), jnp.float32), (4, 128),
                     use_compiler=False)  # the static rule's message
    error = caught.value
    assert error.rule == TILING
    assert "blocked_copy" in error.kernel
    assert error.operand.startswith("input 0 (args[0], kernel parameter x_ref)")
    message = str(error)
    assert "block shape (4, 128) over a float32[16, 256] array" in message
    assert "second-minor dimension is 4" in message
    assert "make the second-minor block dimension 8 (a multiple of 8) or the full 16" in message
    assert "\n" not in str(error.violations[0])  # one paragraph per violation
    # The output uses the same block and is reported too.
    assert [v.operand.split(" (")[0] for v in error.violations] == ["input 0", "output 0"]


def test_squeezed_minor_dimension_fix_says_keep_it():
    with pytest.raises(TpuRuleViolation, match="squeezed .None, counted as 1.") as caught:
        check_kernel(blocked_copy, jax.ShapeDtypeStruct((16, 256), jnp.float32), (None, 256),
                     use_compiler=False)
    assert "keep the second-minor dimension in the block" in caught.value.fix


def test_packed_sublanes_is_stricter_for_narrow_dtypes():
    strict = CheckOptions(lower_for_tpu=False, packed_sublanes=True)
    assert _verdict(strict, (32, 256), (16, 128), jnp.bfloat16) is None
    with pytest.raises(TpuRuleViolation, match=r"multiple of 16 \(2 rows of bfloat16 pack"):
        check_kernel(
            blocked_copy,
            jax.ShapeDtypeStruct((32, 256), jnp.bfloat16),
            (8, 128),
            check_options=strict,
        )
    assert _verdict(strict, (64, 256), (16, 128), jnp.int8) == TILING
    assert _verdict(strict, (64, 256), (8, 128), jnp.float32) is None


def _manual_copy_kernel(x_hbm, o_ref, buffer, semaphore):
    copy = pltpu.make_async_copy(x_hbm, buffer, semaphore)
    copy.start()
    copy.wait()
    o_ref[...] = buffer[...]


def hbm_copy(x, block):
    return pl.pallas_call(
        _manual_copy_kernel,
        out_shape=jax.ShapeDtypeStruct(block, x.dtype),
        grid=(1,),
        in_specs=[pl.BlockSpec(block, lambda i: (0, 0), memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(block, lambda i: (0, 0)),
        scratch_shapes=[pltpu.VMEM(block, x.dtype), pltpu.SemaphoreType.DMA],
    )(x)


def test_any_memory_space_block_must_be_the_whole_array():
    x = jax.ShapeDtypeStruct((16, 128), jnp.float32)
    check_kernel(hbm_copy, x, (16, 128))
    with pytest.raises(TpuRuleViolation, match="memory space any") as caught:
        check_kernel(hbm_copy, x, (8, 128), check_options=STATIC_ONLY)
    assert "pl.BlockSpec(memory_space=pl.ANY)" in caught.value.fix
    with pytest.raises(TpuRuleViolation, match="memory space ANY") as caught:
        check_kernel(hbm_copy, x, (8, 128), check_options=MOSAIC_ONLY, use_compiler=False)
    assert caught.value.rule == "mosaic-lowering"


def test_checked_at_trace_time_under_jit_vmap_and_shard_map():
    x = jnp.ones((16, 256), jnp.float32)
    mesh = jax.make_mesh((1,), ("d",))
    bad = lambda x: blocked_copy(x, (4, 128))
    sharded = jax.shard_map(
        bad, mesh=mesh, in_specs=jax.P("d"), out_specs=jax.P("d"), check_vma=False
    )
    on_mesh = jax.device_put(x, jax.NamedSharding(mesh, jax.P("d")))
    for transformed, arg in [
        (jax.jit(bad), x),
        (jax.vmap(bad), x[None]),
        (jax.jit(sharded), on_mesh),
    ]:
        with checking_pallas_calls(), pytest.raises(TpuRuleViolation, match=TILING):
            jax.make_jaxpr(transformed)(arg)
        with pytest.raises(TpuRuleViolation, match=TILING):  # found nested in the jaxpr
            check_kernel(transformed, arg, check_options=STATIC_ONLY)
    with checking_pallas_calls() as reports:
        jax.make_jaxpr(jax.vmap(lambda x: blocked_copy(x, (8, 128))))(x[None])
    assert reports and all(r.ok for r in reports)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize(
    "block_shape, block_k", [((128, 128), 128), ((256, 512), 256), ((512, 512), 512)]
)
def test_jax_matmul_passes(dtype, block_shape, block_k):
    x = jax.ShapeDtypeStruct((1024, 1024), dtype)
    (report,) = check_kernel(matmul, x, x, block_shape=block_shape, block_k=block_k)
    assert report.ok and TILING in report.checked


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_jax_flash_attention_forward_and_backward_pass(causal, head_dim):
    q = jax.ShapeDtypeStruct((2, 2, 256, head_dim), jnp.float32)

    def loss(q, k, v):
        return fa.flash_attention(q, k, v, causal=causal).sum()

    reports = check_kernel(jax.grad(loss, argnums=(0, 1, 2)), q, q, q)
    assert len(reports) == 3  # forward (with residuals), dkv, dq
    assert all(r.ok for r in reports)
