"""reference_kernels.matmul: blocked matmul, its activation epilogue, vmap and emit_pipeline."""

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pytest_pallas import assert_allclose
from pytest_pallas.checks.compile_check import libtpu_version
from pytest_pallas.reference_kernels import matmul as mm

pytestmark = pytest.mark.pallas


def _values(shape, dtype, seed):
    values = np.random.default_rng(seed).standard_normal(shape)
    return values.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)


def _operands(m, k, n, dtype, seed=0):
    return _values((m, k), dtype, seed), _values((k, n), dtype, seed + 1)


def _check(out, expected, x, k):
    assert out.shape == expected.shape and out.dtype == x.dtype
    assert_allclose(out, expected, reduction_length=k)


@pytest.mark.parametrize(
    "m, k, n, dtype",
    [
        pytest.param(1, 1, 1, "float32", id="1x1x1"),
        pytest.param(3, 5, 7, "bfloat16", id="3x5x7-bf16"),
        pytest.param(100, 300, 200, "float32", id="ragged-one-block"),
        pytest.param(100, 300, 200, "bfloat16", id="ragged-one-block-bf16"),
        # m=600 and n=520 exceed the 512 default: 2 x 2 blocks of 304 x 384, padded.
        pytest.param(600, 130, 520, "float32", id="default-2x2-blocks"),
        # k=1100: three 384-deep k blocks accumulated in float32 (bfloat16
        # accumulation over k >= 512 would fail the tolerance).
        pytest.param(16, 1100, 128, "bfloat16", id="default-3-k-blocks-bf16"),
    ],
)
def test_matmul(m, k, n, dtype):
    x, y = _operands(m, k, n, dtype)
    _check(jax.jit(mm.matmul)(x, y), mm.matmul_reference(x, y), x, k)


@pytest.mark.parametrize(
    "dtype, blocks",
    [
        pytest.param("float32", (16, 128, 128), id="f32-3x2x3-grid"),
        pytest.param("bfloat16", (16, 128, 128), id="bf16-3x2x3-grid"),
        pytest.param("float32", (40, 300, 200), id="f32-blocks-equal-full-dims"),
    ],
)
def test_matmul_blocked_multi_block(dtype, blocks):
    """Unequal, ragged m, k, n split into several blocks along each axis."""
    block_m, block_k, block_n = blocks
    x, y = _operands(40, 300, 200, dtype, seed=2)
    out = mm.matmul_blocked(x, y, block_m=block_m, block_k=block_k, block_n=block_n)
    _check(out, mm.matmul_reference(x, y), x, 300)


ACTIVATIONS = [
    pytest.param(None, id="none"),
    pytest.param(jax.nn.relu, id="relu"),
    pytest.param(jax.nn.gelu, id="gelu-tanh"),
    # Known limit: Pallas TPU does not lower erfc (exact gelu); the TPU compile
    # check, on with libtpu installed, rejects the kernel (docs/hardware.md).
    pytest.param(functools.partial(jax.nn.gelu, approximate=False), id="gelu-erf",
                 marks=pytest.mark.xfail(libtpu_version() is not None, strict=True,
                                         reason="erfc is not lowered for the TPU")),
    pytest.param(jax.nn.silu, id="silu"),
]


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_activation_applied_once_after_the_last_k_block(activation):
    """Three k blocks: an activation applied per block (relu of partial sums) would show."""
    x, y = _operands(16, 300, 72, "float32", seed=3)
    out = mm.matmul_blocked(x, y, block_m=16, block_k=128, block_n=72, activation=activation)
    expected = mm.matmul_activation_reference(x, y, activation=activation)
    _check(out, expected, x, 300)


def test_matmul_activation_contract_op():
    activation = jax.nn.silu
    x, y = _operands(24, 200, 72, "bfloat16", seed=4)
    out = jax.jit(functools.partial(mm.matmul_activation, activation=activation))(x, y)
    _check(out, mm.matmul_activation_reference(x, y, activation=activation), x, 200)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batched_matmul(dtype):
    x, y = _values((3, 20, 50), dtype, 5), _values((3, 50, 30), dtype, 6)
    out = jax.jit(mm.batched_matmul)(x, y)
    _check(out, mm.batched_matmul_reference(x, y), x, 50)


def test_vmap_with_a_shared_operand():
    """vmap maps x only: y is read in place by every batch step, not broadcast."""
    x, y = _values((4, 20, 140), "float32", 7), _values((140, 30), "float32", 8)
    out = jax.jit(jax.vmap(mm.matmul, in_axes=(0, None)))(x, y)
    assert_allclose(out, mm.batched_matmul_reference(x, y[None]), reduction_length=140)


@pytest.mark.parametrize(
    "dtype, blocks",
    [
        pytest.param("float32", (None, None, None), id="f32-default-one-block"),
        pytest.param("float32", (16, 128, 128), id="f32-3x2x3-grid"),
        pytest.param("bfloat16", (16, 128, 128), id="bf16-3x2x3-grid"),
    ],
)
def test_matmul_emit_pipeline(dtype, blocks, pallas_backend):
    if (not pallas_backend.is_tpu and pallas_backend.interpreter == "plain"
            and pallas_backend.tpu_info.num_cores > 1):
        pytest.skip("plain interpret mode does not bind the TensorCore mesh's core axis, which "
                    "emit_pipeline needs to split the grid over a megacore chip's two cores")
    block_m, block_k, block_n = blocks
    x, y = _operands(40, 300, 200, dtype, seed=9)
    out = mm.matmul_emit_pipeline(x, y, block_m=block_m, block_k=block_k, block_n=block_n)
    _check(out, mm.matmul_reference(x, y), x, 300)


@pytest.mark.parametrize(
    "dtype, blocks, message",
    [
        ("float32", {"block_m": 12}, ("block_m=12 must be a multiple of 8 (TPU sublane tiling "
         "of float32, the second-minor dimension of x's block) or equal the full dimension m=40")),
        ("bfloat16", {"block_m": 8}, ("block_m=8 must be a multiple of 16 (TPU sublane tiling "
         "of bfloat16")),
        ("float32", {"block_k": 100}, ("block_k=100 must be a multiple of 128 (TPU lane tiling, "
         "the minor dimension of x's block) or equal the full dimension k=300")),
        ("float32", {"block_n": 64}, ("block_n=64 must be a multiple of 128 (TPU lane tiling, "
         "the minor dimension of y's and the output's block) or equal the full dimension n=200")),
        ("float32", {"block_n": 0}, "block_n must be a positive int, got 0"),
        ("float32", {"block_k": 128.0}, "block_k must be a positive int, got 128.0"),
    ],
)
@pytest.mark.parametrize("variant", [mm.matmul_blocked, mm.matmul_emit_pipeline])
def test_block_validation(variant, dtype, blocks, message):
    x, y = _operands(40, 300, 200, dtype)
    with pytest.raises(ValueError) as error:
        variant(x, y, **blocks)
    assert message in str(error.value)


@pytest.mark.parametrize(
    "x_shape, y_shape, dtypes, message",
    [
        ((4, 5), (6, 7), ("float32", "float32"), "dimensions disagree"),
        ((4, 5, 6), (6, 7), ("float32", "float32"), "expected (m, k) @ (k, n)"),
        ((4, 5), (5, 7), ("float32", "bfloat16"), "must both be float32 or both bfloat16"),
        ((4, 5), (5, 7), ("int32", "int32"), "must both be float32 or both bfloat16"),
    ],
)
def test_operand_validation(x_shape, y_shape, dtypes, message):
    x, y = jnp.zeros(x_shape, dtypes[0]), jnp.zeros(y_shape, dtypes[1])
    with pytest.raises(ValueError) as error:
        mm.matmul(x, y)
    assert message in str(error.value)


def test_batched_operand_validation():
    with pytest.raises(ValueError, match="dimensions disagree"):
        mm.batched_matmul(jnp.zeros((2, 4, 5)), jnp.zeros((3, 5, 6)))


def test_oracle_rejects_an_activation_it_has_no_twin_for():
    with pytest.raises(ValueError, match="no float64 oracle for activation"):
        mm.matmul_activation_reference(np.ones((2, 2)), np.ones((2, 2)), activation=jnp.tanh)


def test_oracle_activations_match_jax_nn():
    z = np.linspace(-6.0, 6.0, 101)[:, None]
    for activation in (jax.nn.relu, jax.nn.gelu, jax.nn.silu,
                       functools.partial(jax.nn.gelu, approximate=False)):
        twin = mm.matmul_activation_reference(z, np.ones((1, 1)), activation=activation)
        np.testing.assert_allclose(twin, np.asarray(activation(z.astype(np.float32))),
                                   rtol=1e-5, atol=1e-6)


def test_cost_models():
    x, y = jnp.zeros((100, 300), jnp.bfloat16), jnp.zeros((300, 200), jnp.bfloat16)
    cost = mm.matmul_cost(x, y)
    assert cost.flops == 2 * 100 * 300 * 200
    assert cost.transcendentals == 0
    assert cost.bytes_accessed == 2 * (100 * 300 + 300 * 200 + 100 * 200)
    blocked = mm.matmul_cost(x, y, block_m=50, block_n=100)  # x read twice, y twice
    assert blocked.bytes_accessed == 2 * (2 * 100 * 300 + 2 * 300 * 200 + 100 * 200)
    gelu = mm.matmul_activation_cost(x, y, activation=jax.nn.gelu)
    assert gelu.flops > cost.flops and gelu.transcendentals == 100 * 200
    assert mm.matmul_activation_cost(x, y, activation=None).flops == cost.flops
    batched = mm.batched_matmul_cost(jnp.zeros((3, 100, 300)), jnp.zeros((3, 300, 200)))
    assert batched.flops == 3 * cost.flops
    assert batched.bytes_accessed == 4 * 3 * (100 * 300 + 300 * 200 + 100 * 200)


def test_the_silu_oracle_is_quiet_and_right_where_exp_overflows():
    x, y = np.array([[-1000.0]]), np.array([[1.0]])  # the product is -1000: exp(1000) overflows
    with np.errstate(all="raise"):
        out = mm.matmul_activation_reference(x, y, activation=jax.nn.silu)
    assert out.shape == (1, 1) and out[0, 0] == 0.0
