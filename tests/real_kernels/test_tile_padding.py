"""Class 5: a read inside an array's (8, 128) tile padding is legal on the chip; past it is not.

tokamax's grouped matmul with k = 200 copies whole (.., 128) column tiles and
masks the columns past 200; on the TPU, HBM and VMEM arrays are stored in
whole tiles, so that read touches padding, not another buffer. The TPU
interpreter runs with tile-padded bounds; a copy past the padding still fails and
says so (the chip halts it). A load past the end of an (unpadded) SMEM array, which
the chip does not check, reads poison: a test that uses the value fails naming the read.
"""

import textwrap

KERNELS = textwrap.dedent('''
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from pytest_pallas import assert_allclose

def _tail_kernel(x_hbm, o_ref, buf, sem):
    start = pl.multiple_of(pl.program_id(0) * 128, 128)
    copy = pltpu.make_async_copy(x_hbm.at[:, pl.ds(start, 128)], buf, sem)
    copy.start(); copy.wait()
    column = start + jax.lax.broadcasted_iota(jnp.int32, (8, 128), 1)
    o_ref[...] = jnp.where(column < x_hbm.shape[1], buf[...], 0.0)   # mask what lies past the end

def tail(x):
    return pl.pallas_call(_tail_kernel, grid=(2,),
        out_shape=jax.ShapeDtypeStruct((8, 256), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda j: (0, j)),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA])(x)

def _smem_kernel(s_ref, o_ref):
    o_ref[...] = jnp.full((8, 128), s_ref[4], jnp.float32)

def smem(s):
    return pl.pallas_call(_smem_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)])(s)

X = jnp.arange(8 * 200, dtype=jnp.float32).reshape(8, 200)

@pytest.mark.pallas
def test_in_padding():
    expected = np.zeros((8, 256)); expected[:, :200] = np.asarray(X)
    assert_allclose(tail(X), expected)

@pytest.mark.pallas
def test_past_padding():
    tail(X[:, :100])

@pytest.mark.pallas
def test_smem():
    assert_allclose(smem(jnp.arange(4, dtype=jnp.float32)), np.full((8, 128), 3.0))
''')


def test_reads_inside_the_tile_padding_pass_and_past_it_fail_saying_which(run_pytest, pytester):
    pytester.makepyfile(test_padding=KERNELS)
    result = run_pytest("-q", "-rA")
    output = result.stdout.str()
    result.assert_outcomes(passed=1, failed=2)
    assert "PASSED test_padding.py::test_in_padding" in output
    assert "goes past the array's tile padding too (padded shape (8, 128))" in output
    assert "'_smem_kernel at test_padding.py:23' loaded [4] of a (4,) SMEM buffer" in output
