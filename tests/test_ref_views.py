"""Reshaped and bitcast refs in JAX's TPU interpreter (pytest_pallas._compat.ref_views): loads,
stores and DMAs through ``ref.reshape(...)`` and ``ref.bitcast(...)``, with the race detector
seeing exactly the elements a write through a view sets, at whichever end of the supported JAX
range is installed."""

import textwrap

import numpy as np
import pytest

from pytest_pallas._compat import ref_views

NO_FALLBACK = ("-W", "error::pytest_pallas.supervision.kernel_run.PallasInterpreterFallback")

# Loads and a DMA from ref.reshape(...) and ref.bitcast(...) views, as JAX's ragged paged
# attention reads its KV buffer; the TPU interpreter stopped at them ("'ReshapeTransform'
# object has no attribute 'indices'"). The expected values follow JAX's state discharge: a
# bitcast from 16 to 32 bits packs rows 2i (low half) and 2i + 1 (high half).
RESHAPED_AND_BITCAST_REFS = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def views(x_hbm, rows_ref, words_ref, buf, sem):
        copy = pltpu.make_async_copy(x_hbm.reshape(2, 8, 128), buf, sem)
        copy.start()
        copy.wait()
        rows_ref[...] = buf.reshape(16, 128)[pl.ds(4, 8)]
        words_ref[...] = buf.reshape(16, 128).bitcast(jnp.uint32)[...]

    @pytest.mark.pallas
    def test_views():
        x = (jnp.arange(16 * 128, dtype=jnp.float32) / 7).astype(jnp.bfloat16).reshape(16, 128)
        rows, words = pl.pallas_call(
            views,
            out_shape=(jax.ShapeDtypeStruct((8, 128), jnp.bfloat16),
                       jax.ShapeDtypeStruct((8, 128), jnp.uint32)),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            scratch_shapes=[pltpu.VMEM((2, 8, 128), jnp.bfloat16), pltpu.SemaphoreType.DMA],
        )(x)
        flat = np.asarray(x).reshape(16, 128)
        np.testing.assert_array_equal(np.asarray(rows), flat[4:12])
        halves = flat.view(np.uint16).astype(np.uint32)
        np.testing.assert_array_equal(np.asarray(words), halves[0::2] | (halves[1::2] << 16))
''')


def test_loads_and_dmas_from_reshaped_and_bitcast_refs_run(pytester, run_pytest):
    pytester.makepyfile(test_views=RESHAPED_AND_BITCAST_REFS)
    result = run_pytest("--pallas-interpret=tpu", "-p", "no:xdist", *NO_FALLBACK)
    result.assert_outcomes(passed=1)


# Stores through a reshaped VMEM ref (a whole sub-view and part of one) and a DMA into a bitcast
# one, as tpu-inference's fused MoE and ragged paged attention v3 write; the TPU interpreter
# stopped at them. The DMA of 32-bit words into a bfloat16 buffer seen as uint32 unpacks each
# word into rows 2i (low half) and 2i + 1 (high half).
WRITES_THROUGH_VIEWS = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def writes(x_ref, w_hbm, o_ref, halves_ref, buf, buf16, sem):
        buf[...] = x_ref[...]
        buf.reshape(2, 8, 128)[1] = buf[pl.ds(8, 8)] + 1.0
        buf.reshape(2, 8, 128)[0, pl.ds(0, 4)] = jnp.full((4, 128), -1.0)
        copy = pltpu.make_async_copy(w_hbm, buf16.bitcast(jnp.uint32), sem)
        copy.start()
        copy.wait()
        o_ref[...] = buf[...]
        halves_ref[...] = buf16[...]

    @pytest.mark.pallas
    def test_writes():
        x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
        w = jnp.arange(8 * 128, dtype=jnp.uint32).reshape(8, 128) * 65539
        out, halves = pl.pallas_call(
            writes,
            out_shape=(jax.ShapeDtypeStruct((16, 128), jnp.float32),
                       jax.ShapeDtypeStruct((16, 128), jnp.bfloat16)),
            in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM), pl.BlockSpec(memory_space=pl.ANY)],
            scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32),
                            pltpu.VMEM((16, 128), jnp.bfloat16), pltpu.SemaphoreType.DMA],
        )(x, w)
        expected = np.asarray(x).copy()
        expected[8:] += 1.0
        expected[:4] = -1.0
        np.testing.assert_array_equal(np.asarray(out), expected)
        words = np.asarray(w)
        packed = np.empty((16, 128), np.uint16)
        packed[0::2], packed[1::2] = words & 0xFFFF, words >> 16
        np.testing.assert_array_equal(np.asarray(halves).view(np.uint16), packed)
''')


@pytest.mark.parametrize("races", [(), ("--pallas-detect-races",)], ids=["plain", "races"])
def test_stores_and_dmas_into_reshaped_and_bitcast_refs_run(pytester, run_pytest, races):
    pytester.makepyfile(test_writes=WRITES_THROUGH_VIEWS)
    result = run_pytest("--pallas-interpret=tpu", "-p", "no:xdist", *races, *NO_FALLBACK)
    result.assert_outcomes(passed=1)


# Two TensorCores (v5p) each DMA 8 rows into one (16, 128) HBM output through its (2, 8, 128)
# view. Into different halves, nothing races: the detector must see each write's 8 rows, not
# the whole buffer (which writing back the whole view would claim). Into the same half, the
# two unordered writes are a real race, and it must still be found. The same for reads: a DMA
# reading a core's own half back through the view does not race with the other core's write
# to the other half (reading the whole buffer and then the view would); reading the other
# core's half does.
TWO_CORES_WRITE_THROUGH_A_VIEW = textwrap.dedent('''
    import functools
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def halves(x_ref, o_hbm, sem, *, same_half):
        half = 0 if same_half else pl.program_id(0)
        copy = pltpu.make_async_copy(x_ref, o_hbm.reshape(2, 8, 128).at[half], sem)
        copy.start()
        copy.wait()

    def call(x, same_half):
        return pl.pallas_call(
            functools.partial(halves, same_half=same_half),
            out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32), grid=(2,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        )(x)

    @pytest.mark.pallas
    def test_different_halves():
        x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
        np.testing.assert_array_equal(np.asarray(call(x, same_half=False)), np.asarray(x))

    @pytest.mark.pallas
    def test_same_half():
        call(jnp.ones((16, 128), jnp.float32), same_half=True)

    # Each core writes its half directly, then reads a half back through the view.
    def read_back(x_ref, o_hbm, buf, sem, *, other_half):
        i = pl.program_id(0)
        write = pltpu.make_async_copy(x_ref, o_hbm.at[pl.ds(i * 8, 8)], sem)
        write.start()
        write.wait()
        half = 1 - i if other_half else i
        read = pltpu.make_async_copy(o_hbm.reshape(2, 8, 128).at[half], buf, sem)
        read.start()
        read.wait()

    def call_read_back(x, other_half):
        return pl.pallas_call(
            functools.partial(read_back, other_half=other_half),
            out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32), grid=(2,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        )(x)

    @pytest.mark.pallas
    def test_read_back_own_half():
        x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
        np.testing.assert_array_equal(np.asarray(call_read_back(x, False)), np.asarray(x))

    @pytest.mark.pallas
    def test_read_back_other_half():
        call_read_back(jnp.ones((16, 128), jnp.float32), other_half=True)
''')


def test_accesses_through_a_view_race_only_where_they_overlap(pytester, run_pytest):
    pytester.makepyfile(test_halves=TWO_CORES_WRITE_THROUGH_A_VIEW)
    result = run_pytest("--pallas-interpret=tpu", "--pallas-detect-races", "--pallas-chip=v5p",
                        "-p", "no:xdist", *NO_FALLBACK)
    result.assert_outcomes(passed=2, failed=2)
    output = result.stdout.str()
    assert "FAILED test_halves.py::test_same_half" in output
    assert "FAILED test_halves.py::test_read_back_other_half" in output
    assert "[data-race] broken by kernel 'halves" in output
    assert "[data-race] broken by kernel 'read_back" in output
    assert output.count("RACE DETECTED") >= 1


def _to_range(transforms):
    (transform,) = transforms
    return tuple(slice(i.start, i.start + i.size) if hasattr(i, "size") else i
                 for i in transform.indices)


class _Reshape:  # JAX's ReshapeTransform, by the name ref_views dispatches on
    def __init__(self, shape):
        self.shape = shape


_Reshape.__name__ = "ReshapeTransform"


class _Bitcast:
    def __init__(self, dtype):
        self.dtype = dtype


_Bitcast.__name__ = "BitcastTransform"


def test_a_write_through_a_bitcast_is_the_inverse_of_the_read():
    block = np.arange(16 * 4, dtype=np.uint16).reshape(16, 4)
    views = (_Bitcast(np.uint32),)
    words = ref_views._apply_views(views, block, _to_range)
    assert words.shape == (8, 4)
    assert int(words[0, 0]) == int(block[0, 0]) | (int(block[1, 0]) << 16)
    written = ref_views._write_through_views(views, np.zeros_like(block), words, _to_range)
    np.testing.assert_array_equal(written, block)


def test_a_write_through_a_reshape_addresses_only_its_elements():
    write = ref_views._ViewWrite((_Reshape((4, 4, 8)),), (16, 8), np.float32,
                                 np.ones((4, 4, 8), np.float32), None, _to_range)
    assert ref_views._boxes(write.addressed) == [(slice(0, 16), slice(0, 8))]
    assert ref_views._boxes(np.eye(3, dtype=bool)) == [
        (slice(0, 1), slice(0, 1)), (slice(1, 2), slice(1, 2)), (slice(2, 3), slice(2, 3))]


def test_a_write_of_half_a_packed_word_is_refused_not_guessed():
    # One bfloat16 row of a uint32 buffer seen as bfloat16 is half of each word in a row:
    # writing it without the other half would need a read the kernel never made.
    class _Rows:
        def __init__(self, start, size):
            self.indices = (_Slice(start, size),)

    class _Slice:
        def __init__(self, start, size):
            self.start, self.size = start, size

    views = (_Bitcast(np.uint16), _Rows(0, 1))
    with pytest.raises(NotImplementedError, match="part of a packed element"):
        ref_views._ViewWrite(views, (8, 4), np.uint32, np.ones((1, 4), np.uint16), None,
                             _to_range)


def test_a_masked_store_jax_refuses_though_in_bounds_is_recognised():
    # Rows 0:8, columns 0:2 of an (8, 2, 128) block, all in bounds: JAX's check slices the
    # first axis at 2 (the size of axis 1) and refuses rows 2:8.
    mask = np.zeros((8, 2, 128), bool)
    mask[:, :, :64] = True
    assert ref_views._wrongly_refused(mask, (8, 2, 128))
    # Truly out of bounds (the buffer ends after 4 rows): JAX's refusal stands.
    assert not ref_views._wrongly_refused(mask, (4, 2, 128))
    # A shape JAX checks right is left to JAX.
    assert not ref_views._wrongly_refused(np.ones((2, 8, 128), bool), (2, 8, 128))


# A masked store of rows 4:12 of a (16, 8, 128) block, as JAX's ragged paged attention
# stores its query rows: JAX's bounds check slices the first axis at 8 (axis 1's size) and
# refused it as out of bounds.
MASKED_STORE = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def rows(x_ref, o_ref):
        o_ref[...] = x_ref[...]
        iota = jax.lax.broadcasted_iota(jnp.int32, o_ref.shape, 0)
        pltpu.store(o_ref, jnp.ones(o_ref.shape, jnp.float32),
                    mask=jnp.logical_and(iota >= 4, iota < 12))

    @pytest.mark.pallas
    def test_masked_rows():
        x = jnp.zeros((16, 8, 128), jnp.float32)
        out = pl.pallas_call(rows, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
        expected = np.zeros((16, 8, 128), np.float32)
        expected[4:12] = 1.0
        np.testing.assert_array_equal(np.asarray(out), expected)
''')


def test_an_in_bounds_masked_store_runs_in_the_tpu_interpreter(pytester, run_pytest):
    pytester.makepyfile(test_masked_store=MASKED_STORE)
    result = run_pytest("--pallas-interpret=tpu", "--pallas-detect-races", "-p", "no:xdist",
                        *NO_FALLBACK)
    result.assert_outcomes(passed=1)


def test_a_four_bit_bitcast_view_is_named_as_the_interpreter_s_limit():
    # NumPy keeps an int4 value in a byte: packing its bytes would give a wrong shape (JAX's
    # tpu_ops_test.py test_bitcast, int4 refs seen as int8: "Incorrect output shape"). The
    # view says what it cannot do, so the test runs again in the plain interpreter.
    import jax.numpy as jnp

    nibbles = np.zeros((8, 256), jnp.int4)
    with pytest.raises(NotImplementedError, match="a bitcast between int4 and int8 refs"):
        ref_views._bitcast(nibbles, jnp.int8)
    words = ref_views._bitcast(np.zeros((4, 256), np.int8), jnp.int16)
    assert words.shape == (2, 256) and words.dtype == np.int16


class _Index:  # JAX's NDIndexer: ints and Slice(start, size) per axis
    def __init__(self, *indices):
        self.indices = tuple(_Slice(*index) if isinstance(index, tuple) else index
                             for index in indices)


class _Slice:
    def __init__(self, start, size):
        self.start, self.size = start, size


VIEW_CHAINS = [
    # A float32 scratch seen as bytes, reshaped into pages, one (4, 128) byte row of a page
    # (tokamax-style compressed caches): a width change that unpacks rows.
    ((2, 4, 8, 128), np.float32,
     (_Bitcast(np.uint8), _Reshape((2, 4, 8, 4, 128)),
      _Index(1, (0, 4), (0, 8), (0, 4), (0, 128)), _Index(2, 3, (0, 4), (0, 128)))),
    # uint16 rows packed into uint32 words, then a range of word rows.
    ((16, 256), np.uint16, (_Bitcast(np.uint32), _Index((2, 3), (0, 256)))),
    # A reshape alone, then one page.
    ((8, 64, 128), np.float32, (_Reshape((4, 2, 64, 128)), _Index(3, (0, 2), (0, 64),
                                                                   (0, 128)))),
    # bfloat16 pairs seen as float32 words, then a column band (not whole rows).
    ((8, 256), "bfloat16", (_Bitcast(np.float32), _Index((1, 2), (128, 128)))),
]


@pytest.mark.parametrize(("block_shape", "dtype", "views"), VIEW_CHAINS)
def test_an_access_through_a_view_chain_reads_and_writes_as_the_views_do(block_shape, dtype,
                                                                        views):
    # The byte-map path (one box of the block per access) against running the views over
    # the whole block, on random bits.
    import ml_dtypes

    dtype = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    rng = np.random.default_rng(0)
    nbytes = int(np.prod(block_shape)) * dtype.itemsize
    block = rng.integers(0, 256, nbytes, dtype=np.uint8).view(dtype).reshape(block_shape)
    access = ref_views._byte_access(views, block_shape, dtype, _to_range)
    assert access is not None

    seen = ref_views._apply_views(views, block, _to_range)
    np.testing.assert_array_equal(access.read(block[access.box]).view(np.uint8),
                                  seen.view(np.uint8))

    value = rng.integers(0, 256, seen.nbytes, dtype=np.uint8).view(seen.dtype).reshape(
        seen.shape)
    expected = ref_views._write_through_views(views, block, value, _to_range)
    written = block.copy()
    written[access.box] = access.box_values(value)
    np.testing.assert_array_equal(written.view(np.uint8), expected.view(np.uint8))
    # Only the box is touched: the rest of the block is the general path's too.
    assert access.box_values(value).shape == tuple(s.stop - s.start for s in access.box)


def test_a_partial_word_write_is_refused_on_the_byte_map_path_too():
    views = (_Bitcast(np.uint16), _Index((0, 1), (0, 4)))
    access = ref_views._byte_access(views, (8, 4), np.dtype(np.uint32), _to_range)
    with pytest.raises(NotImplementedError, match="part of a packed element"):
        access.box_values(np.ones((1, 4), np.uint16))
