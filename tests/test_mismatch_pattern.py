"""A value failure says where and how the output is wrong: one seeded bug per pattern.

Each Pallas kernel below has one bug; its test compares with assert_allclose and
no hint, so the blocks come from the output BlockSpec the plugin saw traced.
"""

import re
import textwrap

import numpy as np
import pytest

from pytest_pallas import assert_allclose

SEEDED_BUGS = '''
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from pytest_pallas import assert_allclose
from pytest_pallas.checks.mismatch import reduction_steps_left_out


def matmul_kernel(x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul(x, y, *, bm, bk, bn, y_index_map=lambda i, j, k: (k, j), k_steps=None):
    m, k = x.shape
    n = y.shape[1]
    from jax.experimental.pallas import tpu as pltpu
    return pl.pallas_call(
        matmul_kernel,
        grid=(m // bm, n // bn, k_steps or k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                  pl.BlockSpec((bk, bn), y_index_map)],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
    )(x, y)


def inputs(m, k, n):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((m, k)).astype(np.float32),
            rng.standard_normal((k, n)).astype(np.float32))


@pytest.mark.pallas
def test_wrong_index_map():
    x, y = inputs(24, 256, 256)
    # y's block ignores the output column j: every column block multiplies y's first.
    out = matmul(x, y, bm=24, bk=128, bn=128, y_index_map=lambda i, j, k: (k, 0))
    assert_allclose(out, x.astype(np.float64) @ y, reduction_length=256)


@pytest.mark.pallas
def test_dropped_last_k_step():
    x, y = inputs(24, 384, 128)
    out = matmul(x, y, bm=24, bk=128, bn=128, k_steps=2)  # 384 / 128 = 3 steps
    steps = reduction_steps_left_out(np.matmul, (x, y), argument=0, axis=1, block=128)
    assert_allclose(out, x.astype(np.float64) @ y, reduction_length=384, without_step=steps)


def blocks_kernel(x_ref, o_ref):
    # The last block along the columns is ragged (328 = 2 x 128 + 72): never written.
    @pl.when(pl.program_id(0) < pl.num_programs(0) - 1)
    def _():
        o_ref[...] = x_ref[...] + 1


@pytest.mark.pallas
def test_unwritten_ragged_last_block():
    x = np.random.default_rng(1).standard_normal((16, 328)).astype(np.float32)
    out = pl.pallas_call(
        blocks_kernel, grid=(pl.cdiv(328, 128),),
        in_specs=[pl.BlockSpec((16, 128), lambda j: (0, j))],
        out_specs=pl.BlockSpec((16, 128), lambda j: (0, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
    assert_allclose(out, x.astype(np.float64) + 1)


def scaled_kernel(x_ref, o_ref):
    scale = 0.125
    o_ref[...] = x_ref[...] * scale * scale  # the scale applied twice


@pytest.mark.pallas
def test_scaled_by_a_constant():
    x = np.random.default_rng(2).standard_normal((16, 256)).astype(np.float32)
    out = pl.pallas_call(
        scaled_kernel, grid=(2,),
        in_specs=[pl.BlockSpec((16, 128), lambda j: (0, j))],
        out_specs=pl.BlockSpec((16, 128), lambda j: (0, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
    assert_allclose(out, x.astype(np.float64) * 0.125)


def transposed_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...]).T  # each block written transposed


@pytest.mark.pallas
def test_transposed_output():
    x, y = inputs(256, 128, 256)
    out = pl.pallas_call(
        transposed_kernel, grid=(2, 2),
        in_specs=[pl.BlockSpec((128, 128), lambda i, j: (i, 0)),
                  pl.BlockSpec((128, 128), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((128, 128), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((256, 256), x.dtype),
    )(x, y)
    assert_allclose(out, x.astype(np.float64) @ y, reduction_length=128)
'''


@pytest.fixture(scope="module")
def seeded_bug_failures(tmp_path_factory):
    """Each seeded bug's failure text, from one pytest run (one JAX start for all)."""
    import subprocess
    import sys
    import xml.etree.ElementTree as ElementTree

    directory = tmp_path_factory.mktemp("seeded")
    (directory / "test_seeded_bugs.py").write_text(textwrap.dedent(SEEDED_BUGS))
    subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
         "--junitxml=results.xml", "--pallas-interpret=plain",
         # Float32 products: every element of a wrong block then misses float32's tolerance
         # (the chip's bfloat16 rounding lets a few of them pass, and "fill exactly" fails).
         "--pallas-numerics=exact", "test_seeded_bugs.py"],
        cwd=directory, capture_output=True, text=True, timeout=300)
    failures = {}
    for case in ElementTree.parse(directory / "results.xml").iter("testcase"):
        failure = case.find("failure")
        failures[case.get("name")] = "" if failure is None else failure.text
    return failures


def test_a_wrong_index_map_is_located_in_its_output_block(seeded_bug_failures):
    failure = seeded_bug_failures["test_wrong_index_map"]
    assert ("Mismatch pattern, in output blocks of (24, 128) (from the output BlockSpec of "
            "kernel 'matmul_kernel at test_seeded_bugs.py:") in failure
    assert "errors fill exactly output block (0, 1): columns 128-255 of 256" in failure
    assert ("output block (0, 1) holds the values expected in output block (0, 0): an index "
            "map that points at the wrong block") in failure
    assert "ragged" not in failure


def test_an_unwritten_ragged_last_block_is_named(seeded_bug_failures):
    failure = seeded_bug_failures["test_unwritten_ragged_last_block"]
    assert "errors fill exactly output block (0, 2): columns 256-327 of 328" in failure
    assert ("all errors sit in the ragged last output block along columns (columns 256-327 "
            "of 328: 72 of 128)") in failure


def test_a_constant_factor_is_named(seeded_bug_failures):
    failure = seeded_bug_failures["test_scaled_by_a_constant"]
    assert "actual = 0.125 x expected at every element: a constant factor" in failure
    assert "errors fill" not in failure  # every block is wrong: no location to give


def test_a_transposed_output_block_is_named(seeded_bug_failures):
    failure = seeded_bug_failures["test_transposed_output"]
    assert "each 128x128 output block holds the transpose of its expected values" in failure


def test_a_dropped_last_reduction_step_is_named(seeded_bug_failures):
    failure = seeded_bug_failures["test_dropped_last_k_step"]
    assert ("actual equals the expected result without the last k block: exactly that step's "
            "contribution is missing") in failure
    assert "without the first k block" not in failure


def test_random_errors_get_no_diagnosis():
    rng = np.random.default_rng(3)
    expected = rng.standard_normal((64, 384))
    actual = expected.astype(np.float32)
    # Errors scattered over every block, of random sizes and signs.
    where = rng.random(expected.shape) < 0.05
    actual[where] += rng.standard_normal(int(where.sum())).astype(np.float32)
    for block_shape in (None, (16, 128), (8, 128)):
        with pytest.raises(AssertionError) as failure:
            assert_allclose(actual, expected, block_shape=block_shape, without_step={
                "the last block": expected * 0.5})
        assert "Mismatch pattern" not in str(failure.value)


def test_a_block_shape_given_is_used_and_tiles_are_the_fallback():
    expected = np.arange(16 * 256, dtype=np.float64).reshape(16, 256)
    actual = expected.copy()
    actual[8:, 128:] = -1
    with pytest.raises(AssertionError) as failure:
        assert_allclose(actual, expected, block_shape=(8, 128))
    assert ("Mismatch pattern, in output blocks of (8, 128) (from block_shape=(8, 128)):\n"
            "  errors fill exactly output block (1, 1): rows 8-15 of 16, columns 128-255 of 256"
            ) in str(failure.value)
    with pytest.raises(AssertionError) as failure:
        assert_allclose(actual, expected)
    assert ("Mismatch pattern, in tiles of (8, 128) (the kernel's output block shape is "
            "unknown: assert_allclose(..., block_shape=) names it):\n"
            "  errors fill exactly tile (1, 1)") in str(failure.value)


def test_a_transposed_square_output_is_named():
    expected = np.random.default_rng(4).standard_normal((40, 40))
    with pytest.raises(AssertionError) as failure:
        assert_allclose(expected.T.astype(np.float32), expected)
    assert "actual is the transpose of expected (last two axes swapped) at every element" in str(
        failure.value)


def test_integer_outputs_get_the_pattern_too():
    expected = np.arange(8 * 256, dtype=np.int32).reshape(8, 256)
    actual = expected.copy()
    actual[:, 128:] *= 3
    with pytest.raises(AssertionError) as failure:
        assert_allclose(actual, expected)
    assert "errors fill exactly tile (0, 1): columns 128-255 of 256" in str(failure.value)
    assert "actual = 3 x expected at every mismatched element" in str(failure.value)


WRONG_INDEX_MAP_MATMUL = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...],
                         preferred_element_type=jnp.float32).astype(o_ref.dtype)


def matmul(x, y):
    m, k = x.shape
    n = y.shape[1]
    bn = 128 if n % 128 == 0 else n
    return pl.pallas_call(
        _kernel, grid=(n // bn,),
        in_specs=[pl.BlockSpec((m, k), lambda j: (0, 0)),
                  pl.BlockSpec((k, bn), lambda j: (0, 0))],  # the bug: (0, j)
        out_specs=pl.BlockSpec((m, bn), lambda j: (0, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
    )(x, y)
'''


def test_the_suites_value_failure_locates_the_wrong_block(run_pytest, pytester):
    pytester.makepyfile(mymm=WRONG_INDEX_MAP_MATMUL)
    result = run_pytest("-p", "no:xdist", "--pallas-conformance", "--pallas-impl",
                        "matmul=mymm:matmul", "-k", "value", "--pallas-seed=0",
                        "--pallas-examples=5")
    assert result.ret == 1
    output = result.stdout.str()
    # The kernel is wrong only where n has several 128-column blocks; m is whatever was drawn.
    assert re.search(r"Mismatch pattern, in output blocks of \(\d+, 128\) \(from the output "
                     r"BlockSpec of kernel '_kernel at mymm.py:\d+'\):", output), output
    assert "holds the values expected in output block (0, 0): an index map that points at " \
           "the wrong block" in output


def test_a_box_of_wrong_blocks_is_one_range():
    expected = np.random.default_rng(5).standard_normal((64, 512))
    actual = expected.astype(np.float32)
    actual[:, 128:256] += 1  # a column of tiles
    with pytest.raises(AssertionError) as failure:
        assert_allclose(actual, expected)
    assert "errors fill exactly tiles (0-7, 1): columns 128-255 of 512 (8 of 32 tiles)" in str(
        failure.value)
