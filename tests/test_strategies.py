"""Properties of pytest_pallas.strategies: legal blocks, shapes, sizes and adversarial values."""

import textwrap

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pytest_pallas import strategies as ps

FAST = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])
DTYPE_NAMES = ("float32", "bfloat16", "float16", "int32", "int8", "float8_e4m3fn", "float8_e5m2")
FLOAT_NAMES = tuple(name for name in DTYPE_NAMES if not name.startswith("int"))
INT_NAMES = ("int32", "int8")

array_shapes = st.lists(st.integers(1, 600), min_size=1, max_size=4).map(tuple)


def legal_by_the_tpu_rule(block, shape, dtype_name, packed=False):
    """Mosaic's block rule (``_check_block_mappings`` in jax/_src/pallas/mosaic/lowering.py),
    written from that source rather than from the module.

    Rank >= 2: the last dimension of a block is a multiple of 128 lanes or the whole
    dimension; the one before it a multiple of 8 rows (of 32 for 8-bit values, their
    native tile, which the TPU compiler asks though Mosaic's lowering accepts 8; of 16 for
    16-bit values too when ``packed``) or the whole dimension.
    Rank 1: the whole dimension, a multiple of 1024, or a power of two of at least
    128 x (32 / bits). And every dimension fits in the array.
    """
    bits = {"float32": 32, "int32": 32, "bfloat16": 16, "float16": 16,
            "int8": 8, "float8_e4m3fn": 8, "float8_e5m2": 8}[dtype_name]
    block = [1 if size is None else size for size in block]
    if len(block) != len(shape) or not all(1 <= b <= a for b, a in zip(block, shape)):
        return False
    if len(block) == 1:
        (b,), (a,) = block, shape
        return b == a or b % 1024 == 0 or (b >= 128 * 32 // bits and b & (b - 1) == 0)
    if not (block[-1] % 128 == 0 or block[-1] == shape[-1]):
        return False
    rows = 8 * 32 // bits if packed or bits < 16 else 8
    return block[-2] % rows == 0 or block[-2] == shape[-2]


# --- blocks ---------------------------------------------------------------------------


@FAST
@given(shape=array_shapes, dtype_name=st.sampled_from(DTYPE_NAMES), data=st.data())
def test_every_drawn_block_is_tile_legal(shape, dtype_name, data):
    block = data.draw(ps.tile_legal_block_shapes(shape, dtype_name), label="block")
    assert ps.is_tile_legal_block(block, shape, dtype_name)
    assert legal_by_the_tpu_rule(block, shape, dtype_name)


@FAST
@given(shape=array_shapes, dtype_name=st.sampled_from(DTYPE_NAMES), data=st.data())
def test_is_tile_legal_block_agrees_with_the_rule_on_any_block(shape, dtype_name, data):
    block = tuple(data.draw(st.one_of(st.integers(1, size), st.sampled_from([size, 128, 8, 16])))
                  for size in shape)
    assert ps.is_tile_legal_block(block, shape, dtype_name) == \
        legal_by_the_tpu_rule(block, shape, dtype_name)
    assert ps.is_tile_legal_block(block, shape, dtype_name, packed=True) == \
        legal_by_the_tpu_rule(block, shape, dtype_name, packed=True)


def test_is_tile_legal_block_examples():
    assert ps.is_tile_legal_block((8, 128), (64, 512), "float32")
    assert ps.is_tile_legal_block((64, 512), (64, 512), "float32")  # the whole array
    assert ps.is_tile_legal_block((2, 8, 128), (4, 64, 512), "float32")  # leading axes are free
    assert not ps.is_tile_legal_block((8, 100), (64, 512), "float32")
    # Mosaic lowers 8-row blocks of any dtype; the packed tile is asked for explicitly.
    assert ps.is_tile_legal_block((8, 128), (64, 512), "bfloat16")
    assert not ps.is_tile_legal_block((8, 128), (64, 512), "bfloat16", packed=True)
    assert ps.is_tile_legal_block((16, 128), (64, 512), "bfloat16", packed=True)
    assert not ps.is_tile_legal_block((16, 128), (64, 512), "int8", packed=True)
    assert not ps.is_tile_legal_block((4, 128), (64, 512), "int8")
    assert not ps.is_tile_legal_block((8, 128), (64,), "float32")  # rank mismatch
    assert not ps.is_tile_legal_block((128, 128), (64, 512), "float32")  # bigger than the array


@FAST
@given(block=st.lists(st.integers(1, 300), min_size=1, max_size=4), max_blocks=st.integers(1, 4),
       data=st.data())
def test_shapes_divisible_by_divides(block, max_blocks, data):
    shape = data.draw(ps.shapes_divisible_by(block, max_blocks=max_blocks), label="shape")
    assert len(shape) == len(block)
    for size, block_size in zip(shape, block):
        assert size % block_size == 0
        assert block_size <= size <= block_size * max_blocks


@FAST
@given(block=st.lists(st.integers(1, 300), min_size=1, max_size=4), max_blocks=st.integers(1, 4),
       data=st.data())
def test_ragged_shapes_have_a_dimension_the_block_does_not_divide(block, max_blocks, data):
    assume(any(size > 1 for size in block))
    shape = data.draw(ps.ragged_shapes(block, max_blocks=max_blocks), label="shape")
    assert len(shape) == len(block)
    assert all(size >= 1 for size in shape)
    assert any(size % block_size for size, block_size in zip(shape, block))


# --- sizes --------------------------------------------------------------------------------


@FAST
@given(data=st.data())
def test_sizes_come_from_their_bucket(data):
    kind = data.draw(st.sampled_from(sorted(ps.SIZE_BUCKETS)))
    assert data.draw(ps.sizes(kind)) in ps.SIZE_BUCKETS[kind]


def test_sizes_buckets_bound_the_distinct_shapes():
    # Every distinct shape is a compilation: however many examples run, an op with these
    # dimensions and dtypes sees at most len(bucket) ** rank * dtypes of them.
    kinds = ("leading", "second_minor", "minor")
    seen = set()

    @settings(max_examples=300, deadline=None, database=None)
    @given(shape=st.tuples(*(ps.sizes(kind) for kind in kinds)), dtype=ps.dtypes())
    def draw_shapes(shape, dtype):
        seen.add((shape, dtype))

    draw_shapes()
    bound = np.prod([len(ps.SIZE_BUCKETS[kind]) for kind in kinds]) * 2
    assert 1 < len(seen) <= bound


def test_unknown_size_kind_is_named():
    with pytest.raises(ValueError, match="unknown size kind 'middle'; known: minor"):
        ps.sizes("middle")


@FAST
@given(bucket=st.sampled_from(sorted(ps.SIZE_BUCKETS.values())),
       multiple_of=st.sampled_from([1, 2, 5, 8, 16, 100, 128, 256, 512]),
       max_size=st.none() | st.integers(1, 1024))
def test_restrict_sizes(bucket, multiple_of, max_size):
    def allowed(size):
        return size % multiple_of == 0 and (max_size is None or size <= max_size)

    in_bucket = [size for size in bucket if allowed(size)]
    if not in_bucket and max_size is not None and max_size < multiple_of:
        with pytest.raises(ValueError, match="the declared domain is empty"):
            ps.restrict_sizes(bucket, multiple_of=multiple_of, max_size=max_size)
        return
    chosen = ps.restrict_sizes(bucket, multiple_of=multiple_of, max_size=max_size)
    assert chosen and all(allowed(size) for size in chosen)
    if in_bucket:
        assert list(chosen) == in_bucket  # the bucket's own sizes, when any qualifies
    else:
        assert chosen[0] == multiple_of  # one block, then several, as the cap allows


def test_restrict_sizes_examples():
    assert ps.restrict_sizes((1, 100, 128, 200, 384), multiple_of=128) == (128, 384)
    assert ps.restrict_sizes((1, 100, 128, 200, 384), max_size=150) == (1, 100, 128)
    assert ps.restrict_sizes((1, 5, 8), multiple_of=256) == (256, 512, 768)
    assert ps.restrict_sizes((1, 5, 8), multiple_of=256, max_size=600) == (256, 512)


# --- values ---------------------------------------------------------------------------------

value_shapes = st.lists(st.integers(1, 24), min_size=1, max_size=3).map(tuple)


@FAST
@given(shape=value_shapes, dtype_name=st.sampled_from(DTYPE_NAMES),
       profile=st.sampled_from(ps.VALUE_PROFILES), seed=st.integers(0, 2**32 - 1))
def test_generate_values_is_deterministic_and_has_the_dtype(shape, dtype_name, profile, seed):
    values = ps.generate_values(shape, dtype_name, seed=seed, profile=profile)
    again = ps.generate_values(shape, dtype_name, seed=seed, profile=profile)
    assert values.dtype == ps.as_dtype(dtype_name)
    assert values.shape == shape
    assert values.tobytes() == again.tobytes()
    if values.dtype.kind == "f" or dtype_name in FLOAT_NAMES:
        assert np.isfinite(values.astype(np.float64)).all(), "profiles draw finite values"


@FAST
@given(dtype_name=st.sampled_from(DTYPE_NAMES), profile=st.sampled_from(ps.VALUE_PROFILES),
       seed=st.integers(0, 2**31))
def test_generate_values_depends_on_the_seed(dtype_name, profile, seed):
    one = ps.generate_values((16, 128), dtype_name, seed=seed, profile=profile)
    two = ps.generate_values((16, 128), dtype_name, seed=seed + 1, profile=profile)
    assert one.tobytes() != two.tobytes()


# Large enough that each profile's features show up with overwhelming probability.
PROFILE_SHAPE = (8, 128)


def as_float64(values):
    return values.astype(np.float64)


@FAST
@given(dtype_name=st.sampled_from(FLOAT_NAMES), seed=st.integers(0, 2**32 - 1))
def test_large_profile_has_large_finite_magnitudes(dtype_name, seed):
    values = as_float64(ps.generate_values(PROFILE_SHAPE, dtype_name, seed=seed, profile="large"))
    largest = float(ml_dtypes.finfo(ps.as_dtype(dtype_name)).max)
    assert np.isfinite(values).all()
    # Large for the dtype: past 1e4 where the dtype reaches it, else within 100x of its max.
    assert np.abs(values).max() >= min(1e4, largest / 100)
    assert (values < 0).any() and (values > 0).any()


@FAST
@given(dtype_name=st.sampled_from(INT_NAMES), profile=st.sampled_from(["large", "extremes"]),
       seed=st.integers(0, 2**32 - 1))
def test_integer_extremes_profiles_sit_at_the_ends_of_the_range(dtype_name, profile, seed):
    values = ps.generate_values(PROFILE_SHAPE, dtype_name, seed=seed, profile=profile)
    info = np.iinfo(values.dtype)
    wide = values.astype(np.int64)
    near_top = wide >= int(info.max) - 63
    near_bottom = wide <= int(info.min) + 63
    assert (near_top | near_bottom).all()
    assert near_top.any() and near_bottom.any()


def test_int32_extremes_reach_the_exact_limits():
    values = ps.generate_values((64, 128), "int32", seed=0, profile="extremes")
    assert values.max() == np.iinfo(np.int32).max
    assert values.min() == np.iinfo(np.int32).min


@FAST
@given(dtype_name=st.sampled_from(DTYPE_NAMES), seed=st.integers(0, 2**32 - 1))
def test_ties_profile_repeats_few_values(dtype_name, seed):
    values = ps.generate_values(PROFILE_SHAPE, dtype_name, seed=seed, profile="ties")
    assert len(np.unique(as_float64(values))) <= 5
    assert (values == values.max()).sum() >= 2, "the maximum is tied"
    rows_with_tied_max = [(row == row.max()).sum() >= 2 for row in values]
    assert any(rows_with_tied_max)


@FAST
@given(dtype_name=st.sampled_from(FLOAT_NAMES), seed=st.integers(0, 2**32 - 1))
def test_small_profile_has_subnormals(dtype_name, seed):
    values = as_float64(ps.generate_values(PROFILE_SHAPE, dtype_name, seed=seed, profile="small"))
    tiny = float(ml_dtypes.finfo(ps.as_dtype(dtype_name)).tiny)
    subnormal = (values != 0) & (np.abs(values) < tiny)
    assert subnormal.any()


@FAST
@given(dtype_name=st.sampled_from(FLOAT_NAMES), seed=st.integers(0, 2**32 - 1))
def test_extremes_profile_has_signed_zeros_and_huge_values(dtype_name, seed):
    values = ps.generate_values(PROFILE_SHAPE, dtype_name, seed=seed, profile="extremes")
    wide = as_float64(values)
    largest = float(ml_dtypes.finfo(values.dtype).max)
    assert np.isfinite(wide).all()
    assert np.abs(wide).max() >= largest / 8
    zeros = wide[wide == 0]
    assert np.signbit(zeros).any() and (~np.signbit(zeros)).any(), "+0 and -0 both appear"


@FAST
@given(dtype_name=st.sampled_from(DTYPE_NAMES), data=st.data())
def test_arrays_strategy_draws_the_shape_and_dtype(dtype_name, data):
    shape = data.draw(value_shapes)
    array = data.draw(ps.arrays(shape, dtype_name, profiles=("normal", "ties")))
    assert array.shape == shape and array.dtype == ps.as_dtype(dtype_name)


def test_dtype_names():
    assert ps.as_dtype("bfloat16") == np.dtype(ml_dtypes.bfloat16)
    assert ps.as_dtype(np.float32) == np.dtype(np.float32)
    assert [ps.sublane_multiple(name) for name in ("float32", "bfloat16", "int8")] == [8, 16, 32]
    with pytest.raises(ValueError, match="unknown dtype 'float13'; known: float32"):
        ps.as_dtype("float13")


@given(rows=st.integers(1, 6), cols=st.integers(1, 40), seed=st.integers(0, 2**31 - 1),
       dtype=st.sampled_from(["float32", "bfloat16"]))
def test_neg_inf_values_keep_a_finite_entry_in_every_row(rows, cols, seed, dtype):
    values = np.asarray(ps.generate_values((rows, cols), dtype, seed=seed, profile="neg_inf"),
                        dtype=np.float64)
    assert not np.isnan(values).any() and not np.isposinf(values).any()
    assert np.isfinite(values).any(axis=-1).all()
    if rows * cols >= 200:
        assert np.isneginf(values).any()


def test_only_the_thorough_profile_shrinks_a_failure(pytester):
    pytester.makepyfile(textwrap.dedent(
        """
        import pytest
        from hypothesis import given, strategies as st

        @pytest.mark.pallas
        @given(st.integers(0, 10**6))
        def test_fails_above_1000(x):
            with open("calls.txt", "a") as calls:
                calls.write(f"{x}\\n")
            assert x <= 1000
        """
    ))
    shown = {}
    for profile in ("dev", "ci", "thorough"):
        calls = pytester.path / "calls.txt"
        calls.unlink(missing_ok=True)
        result = pytester.runpytest("-p", "no:cacheprovider", f"--pallas-profile={profile}",
                                    "--pallas-seed=3")
        result.assert_outcomes(failed=1)
        failing = [int(x) for x in calls.read_text().split() if int(x) > 1000]
        shown[profile] = (len(failing), "x=1001" in result.stdout.str())
    # Without shrinking: the first failing input, run again to report it; with it, many more
    # runs down to the smallest failing input.
    assert shown["dev"][0] <= 3 and not shown["dev"][1], shown
    assert shown["ci"][0] <= 3 and not shown["ci"][1], shown
    assert shown["thorough"][0] > 3 and shown["thorough"][1], shown


# (array shape, block shape, dtype): blocks where the strategies once disagreed with the
# static check (8 rows of bfloat16), and their neighbours.
_AGREEMENT_CASES = [
    ((64, 512), (8, 128), "bfloat16"), ((64, 512), (16, 128), "bfloat16"),
    ((64, 512), (4, 128), "bfloat16"), ((64, 512), (8, 128), "int8"),
    ((64, 512), (8, 100), "float32"), ((24, 200), (24, 200), "bfloat16"),
    ((4096,), (1024,), "float32"), ((4096,), (256,), "bfloat16"), ((4096,), (100,), "float32"),
]


@pytest.mark.pallas
@pytest.mark.parametrize("shape, block, dtype_name", _AGREEMENT_CASES)
def test_strategies_and_the_static_check_share_one_tiling_rule(shape, block, dtype_name):
    """A block the strategies draw as legal passes the static check, and no other."""
    import jax
    from jax.experimental import pallas as pl

    from pytest_pallas.checks.kernel_check import CheckOptions, check_kernel
    from pytest_pallas.checks.violations import TpuRuleViolation

    def copy(x):
        spec = pl.BlockSpec(block, lambda i: (0,) * len(block))

        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...]

        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              grid=(1,), in_specs=[spec], out_specs=spec)(x)

    try:
        check_kernel(copy, jax.ShapeDtypeStruct(shape, ps.as_dtype(dtype_name)),
                     check_options=CheckOptions(lower_for_tpu=False))
        accepted = True
    except TpuRuleViolation as error:
        assert error.rule == "block-tiling", error
        accepted = False
    assert ps.is_tile_legal_block(block, shape, dtype_name) == accepted
