"""Whether a kernel may read its output block before writing it whole, read from its jaxpr
(checks/block_reads.py): what decides whether an output block the grid revisits is the
kernel's bug (it reads the stale block) or left to its values."""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas.checks.block_reads import reads_before_writing


def output_read_first(body, scratch=()):
    """Whether ``body(x_ref, o_ref, *scratch)`` may read o_ref before writing it whole."""

    def call(x):
        return pl.pallas_call(
            body, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), grid=(2,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
            scratch_shapes=list(scratch), interpret=True)(x)

    (equation,) = jax.make_jaxpr(call)(jnp.ones((8, 128), jnp.float32)).jaxpr.eqns
    kernel = equation.params["jaxpr"]
    return reads_before_writing(kernel, kernel.invars[1])


def accumulate(x_ref, o_ref):
    o_ref[...] += x_ref[...]


def write_then_accumulate(x_ref, o_ref):
    o_ref[...] = jnp.zeros_like(o_ref)
    o_ref[...] += x_ref[...]


def write_when_first_then_accumulate(x_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += x_ref[...]


def write_on_the_last_step(x_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
        o_ref[...] = x_ref[...] * 2


def write_half_then_read(x_ref, o_ref):
    o_ref[pl.ds(0, 4), :] = x_ref[pl.ds(0, 4), :]
    o_ref[pl.ds(4, 4), :] = o_ref[pl.ds(0, 4), :]


def write_by_rows(x_ref, o_ref):
    o_ref[pl.ds(0, 4), :] = x_ref[pl.ds(0, 4), :]
    o_ref[pl.ds(4, 4), :] = x_ref[pl.ds(4, 4), :]


def read_in_a_loop(x_ref, o_ref):
    def step(i, carry):
        return carry + o_ref[...]

    o_ref[...] = jax.lax.fori_loop(0, 2, step, x_ref[...])


def read_in_scoped_scratch(x_ref, o_ref):
    def scoped(tmp_ref):
        tmp_ref[...] = o_ref[...]
        o_ref[...] = tmp_ref[...] + x_ref[...]

    pl.run_scoped(scoped, pltpu.VMEM((8, 128), jnp.float32))


def copy_into_the_output(x_ref, o_ref, semaphore):
    pltpu.async_copy(x_ref, o_ref, semaphore).wait()


def masked_store(x_ref, o_ref):
    rows = jax.lax.broadcasted_iota(jnp.int32, (8, 128), 0)
    pltpu.store(o_ref, x_ref[...], mask=rows < 4)
    o_ref[...] += 1


@pytest.mark.parametrize("body, scratch, reads", [
    (accumulate, (), True),
    (write_then_accumulate, (), False),
    (write_when_first_then_accumulate, (), True),  # the write is conditional
    (write_on_the_last_step, (), False),
    (write_half_then_read, (), True),
    (write_by_rows, (), False),
    (read_in_a_loop, (), True),
    (read_in_scoped_scratch, (), True),
    (copy_into_the_output, (pltpu.SemaphoreType.DMA,), True),  # not followed: counted a read
    (masked_store, (), True),  # a masked store is no whole write
], ids=lambda value: getattr(value, "__name__", None) if callable(value) else None)
def test_reads_before_writing(body, scratch, reads):
    assert output_read_first(body, scratch) is reads
