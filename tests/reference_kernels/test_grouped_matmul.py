"""reference_kernels.grouped_matmul: scalar-prefetched group offsets, ragged and empty groups."""

import jax
import ml_dtypes
import numpy as np
import pytest
from seeded_bugs import new_ops as bugs

from pytest_pallas import assert_allclose
from pytest_pallas.reference_kernels import grouped_matmul as gm

pytestmark = pytest.mark.pallas


def _operands(m, k, n, sizes, dtype, seed=0):
    rng = np.random.default_rng(seed)
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    lhs = rng.standard_normal((m, k)).astype(np_dtype)
    rhs = rng.standard_normal((len(sizes), k, n)).astype(np_dtype)
    return lhs, rhs, np.asarray(sizes, np.int32)


def assert_within_allowance(out, lhs, rhs, group_sizes):
    """The comparator's default for the output dtype with reduction length k."""
    expected = gm.grouped_matmul_reference(lhs, rhs, group_sizes)
    assert out.shape == expected.shape and out.dtype == lhs.dtype
    assert_allclose(out, expected, reduction_length=lhs.shape[1])


@pytest.mark.parametrize(
    "m, k, n, sizes, dtype, blocks",
    [
        pytest.param(1, 1, 1, [1], "float32", {}, id="1x1x1"),
        pytest.param(1, 3, 2, [0, 0, 1, 0, 0], "float32", {}, id="one-row-five-groups"),
        pytest.param(40, 24, 20, [40, 0, 0], "float32", {"block_m": 16},
                     id="one-group-holds-all"),
        pytest.param(40, 24, 20, [0, 0, 40], "bfloat16", {"block_m": 16},
                     id="last-group-holds-all-bf16"),
        # Boundaries at rows 3, 3, 21 and 22: mid-tile, an empty group mid-tile, a
        # one-row group; 16-row tiles, tile 1 holds three groups.
        pytest.param(40, 24, 20, [3, 0, 18, 1, 18], "float32", {"block_m": 16},
                     id="ragged-with-empties"),
        pytest.param(40, 24, 20, [3, 0, 18, 1, 18], "bfloat16", {"block_m": 16},
                     id="ragged-with-empties-bf16"),
        # Several k and n blocks, padded: 300 = 3 x 128 - 84, 200 = 2 x 128 - 56.
        pytest.param(24, 300, 200, [0, 10, 14], "float32",
                     {"block_m": 8, "block_k": 128, "block_n": 128}, id="k-and-n-blocks"),
        pytest.param(50, 40, 30, [7, 0, 33, 10, 0], "bfloat16", {}, id="default-blocks-bf16"),
    ],
)
def test_grouped_matmul(m, k, n, sizes, dtype, blocks):
    lhs, rhs, group_sizes = _operands(m, k, n, sizes, dtype, seed=m + k)
    out = gm.grouped_matmul_blocked(lhs, rhs, group_sizes, **blocks)
    assert_within_allowance(out, lhs, rhs, group_sizes)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_input_builder_under_jit(seed):
    """The builder's draws (one group holding everything, or ragged with empties), sizes traced."""
    rng = np.random.default_rng(seed)
    lhs, rhs, group_sizes = gm.grouped_matmul_inputs({"m": 37, "k": 16, "n": 24, "g": 4},
                                                     "float32", rng)
    assert group_sizes.dtype == np.int32 and group_sizes.sum() == 37
    assert (group_sizes == 0).any()
    out = jax.jit(gm.grouped_matmul)(lhs, rhs, group_sizes)
    assert_within_allowance(out, lhs, rhs, group_sizes)


def test_the_builder_draws_both_stress_patterns():
    rng = np.random.default_rng(0)
    draws = [gm.grouped_matmul_inputs({"m": 64, "k": 1, "n": 1, "g": 5}, "bfloat16", rng)[2]
             for _ in range(20)]
    assert any((sizes == 64).any() for sizes in draws)
    assert any(((sizes > 0) & (sizes < 64)).sum() >= 2 for sizes in draws)


def test_an_inf_in_one_group_stays_out_of_the_others():
    """Group 1's rhs holds an inf; rows of group 0 sharing the tile must stay finite."""
    lhs, rhs, group_sizes = _operands(16, 8, 8, [5, 11], "float32", seed=3)
    rhs[1, 0, 0] = np.inf
    out = np.asarray(gm.grouped_matmul(lhs, rhs, group_sizes))
    assert np.isfinite(out[:5]).all()


# --- the allowance is tight ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "bug, k, sizes",
    [
        pytest.param(bugs.grouped_matmul_bfloat16_accumulator, 512, [0, 5, 11],
                     id="bfloat16-accumulator"),
        pytest.param(bugs.grouped_matmul_group_end_off_by_one, 16, [5, 0, 11],
                     id="group-end-off-by-one"),
    ],
)
def test_seeded_bugs_fail_and_the_kernel_passes(bug, k, sizes):
    lhs, rhs, group_sizes = _operands(16, k, 8, sizes, "float32", seed=4)
    assert_within_allowance(gm.grouped_matmul(lhs, rhs, group_sizes), lhs, rhs, group_sizes)
    with pytest.raises(AssertionError, match="Arrays are not close"):
        assert_within_allowance(bug(lhs, rhs, group_sizes), lhs, rhs, group_sizes)


# --- validation, schedule and cost ----------------------------------------------------------------


@pytest.mark.parametrize(
    "shapes, dtypes, kwargs, message",
    [
        ([(4, 8), (2, 8, 4), (3,)], ("float32", "float32", "int32"), {},
         "matching k and g"),
        ([(4, 8), (2, 8, 4), (2,)], ("float32", "bfloat16", "int32"), {},
         "lhs and rhs must both be float32 or both bfloat16"),
        ([(4, 8), (2, 8, 4), (2,)], ("float32", "float32", "float32"), {},
         "group_sizes must be int32"),
        ([(40, 8), (2, 8, 4), (2,)], ("bfloat16", "bfloat16", "int32"), {"block_m": 8},
         "block_m=8 must be a multiple of 16 (TPU sublane tiling of bfloat16"),
        ([(40, 300), (2, 300, 4), (2,)], ("float32", "float32", "int32"), {"block_k": 100},
         "block_k=100 must be a multiple of 128"),
    ],
)
def test_validation(shapes, dtypes, kwargs, message):
    arrays = [np.zeros(shape, dtype if dtype != "bfloat16" else ml_dtypes.bfloat16)
              for shape, dtype in zip(shapes, dtypes)]
    with pytest.raises(ValueError) as error:
        gm.grouped_matmul_blocked(*arrays, **kwargs)
    assert message in str(error.value)


def test_schedule_visits_each_tile_once_per_group_it_holds():
    offsets, tiles, groups, first, real = (
        np.asarray(a) for a in gm._schedule(np.array([3, 0, 18, 1, 18], np.int32), block_m=16,
                                             num_tiles=3))
    assert offsets.tolist() == [0, 3, 3, 21, 22, 40]
    # Tile 0: groups 0 and 2; tile 1: groups 2, 3, 4; tile 2: group 4; then padding.
    assert tiles.tolist()[:6] == [0, 0, 1, 1, 1, 2]
    assert groups.tolist()[:6] == [0, 2, 2, 3, 4, 4]
    assert first.tolist()[:6] == [1, 0, 1, 0, 0, 1] and real.tolist() == [1] * 6 + [0]


def test_cost_model():
    cost = gm.grouped_matmul_cost(jax.ShapeDtypeStruct((64, 32), np.float32),
                                  jax.ShapeDtypeStruct((4, 32, 16), np.float32),
                                  jax.ShapeDtypeStruct((4,), np.int32))
    assert cost.flops == 2 * 64 * 32 * 16
    assert cost.bytes_accessed == 4 * (64 * 32 + 4 * 32 * 16 + 64 * 16) + 16
