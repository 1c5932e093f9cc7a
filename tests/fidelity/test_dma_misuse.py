"""DMA and semaphore misuse fails on the CPU, in TPU interpret mode.

What catches what (measured on these kernels):

* reading a DMA's destination before ``.wait()``: the default "on_wait" DMA
  mode copies only at the wait, so the read sees NaN-poisoned memory (the
  values fail); ``detect_races=True`` reports the race in either DMA mode.
  With ``dma_execution_mode="eager"`` and no race detection it passes.
* a DMA started and never waited for (a remote copy whose send semaphore is
  never waited included), a semaphore signalled and never waited: the
  interpreter only prints (eager) or says nothing (on_wait);
  ``kernel_exits_checked`` turns the state at kernel exit into a failure.
* an out-of-bounds copy: the interpreter raises (``out_of_bounds_reads=
  "raise"``, the default); ``translate_interpreter_error`` names the rule.
  A copy out of bounds by constant indices already fails at trace time.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas.checks.kernel_check import kernel_exits_checked
from pytest_pallas.checks.runtime_rules import translate_interpreter_error
from pytest_pallas.checks.violations import (
    DATA_RACE,
    DMA_NOT_WAITED,
    DMA_OUT_OF_BOUNDS,
    SEMAPHORES,
    TpuRuleViolation,
)

pytestmark = pytest.mark.pallas


def _correct(x_hbm, o_ref, buffer, semaphore):
    copy = pltpu.make_async_copy(x_hbm, buffer, semaphore)
    copy.start()
    copy.wait()
    o_ref[...] = buffer[...] * 2


def _read_before_wait(x_hbm, o_ref, buffer, semaphore):
    copy = pltpu.make_async_copy(x_hbm, buffer, semaphore)
    copy.start()
    o_ref[...] = buffer[...] * 2
    copy.wait()


def _never_waited(x_hbm, o_ref, buffer, semaphore):
    pltpu.make_async_copy(x_hbm, buffer, semaphore).start()
    o_ref[...] = jnp.zeros_like(o_ref)


def _signal_without_wait(x_hbm, o_ref, buffer, semaphore):
    pl.semaphore_signal(semaphore, 1)
    o_ref[...] = jnp.zeros_like(o_ref)


def _out_of_bounds(x_hbm, o_ref, buffer, semaphore):
    start = 8 + pl.program_id(0)  # 8..23 of 16 rows: runs off the end
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(start, 16)], buffer, semaphore)
    copy.start()
    copy.wait()
    o_ref[...] = buffer[...]


def manual_copy(kernel, x, semaphore=pltpu.SemaphoreType.DMA):
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((16, 128), x.dtype),
        grid=(1,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((16, 128), lambda i: (0, 0)),
        scratch_shapes=[pltpu.VMEM((16, 128), x.dtype), semaphore],
        name=kernel.__name__.strip("_"),
    )(x)


X = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)


def test_correct_dma_is_clean(interpret):
    with interpret(detect_races=True), kernel_exits_checked() as exits:
        out = jax.block_until_ready(manual_copy(_correct, X))
    np.testing.assert_array_equal(out, 2 * X)
    assert exits and all(state.clean for state in exits)


def test_read_before_wait_reads_poison_in_on_wait_mode(interpret):
    with interpret():
        out = jax.block_until_ready(manual_copy(_read_before_wait, X))
    assert np.isnan(out).all()


@pytest.mark.parametrize("mode", ["on_wait", "eager"])
def test_read_before_wait_is_a_race(interpret, mode):
    with (
        interpret(detect_races=True, dma_execution_mode=mode),
        pytest.raises(TpuRuleViolation) as caught,
        kernel_exits_checked(),
    ):
        jax.block_until_ready(manual_copy(_read_before_wait, X))
    assert caught.value.rule == DATA_RACE
    assert "read_before_wait" in caught.value.kernel
    assert "before its .wait()" in str(caught.value)


def test_read_before_wait_is_an_uninitialized_read_without_race_detection():
    from pytest_pallas import check_uninitialized_reads
    from pytest_pallas.checks.violations import UNINITIALIZED_READ

    with pytest.raises(TpuRuleViolation) as caught:
        check_uninitialized_reads(functools.partial(manual_copy, _read_before_wait), X)
    assert caught.value.rule == UNINITIALIZED_READ
    assert "read_before_wait" in caught.value.kernel
    assert "read a DMA's destination only after its .wait()" in str(caught.value)
    out = check_uninitialized_reads(functools.partial(manual_copy, _correct), X)
    np.testing.assert_array_equal(out, 2 * X)


def test_read_before_wait_passes_in_eager_mode_without_race_detection(interpret):
    with interpret(dma_execution_mode="eager"), kernel_exits_checked():
        out = jax.block_until_ready(manual_copy(_read_before_wait, X))
    np.testing.assert_array_equal(out, 2 * X)  # why the default DMA mode is "on_wait"


@pytest.mark.parametrize("mode, rule", [("on_wait", DMA_NOT_WAITED), ("eager", SEMAPHORES)])
def test_dma_never_waited_for(interpret, mode, rule):
    with (
        interpret(dma_execution_mode=mode),
        pytest.raises(TpuRuleViolation) as caught,
        kernel_exits_checked(),
    ):
        jax.block_until_ready(manual_copy(_never_waited, X))
    assert caught.value.rule == rule
    assert "never_waited" in caught.value.kernel
    assert ".wait()" in caught.value.fix or "wait of the same amount" in caught.value.fix


def test_semaphore_signalled_and_never_waited(interpret):
    with interpret(), pytest.raises(TpuRuleViolation) as caught, kernel_exits_checked():
        jax.block_until_ready(manual_copy(_signal_without_wait, X, pltpu.SemaphoreType.REGULAR))
    assert caught.value.rule == SEMAPHORES
    assert "ends the kernel with count 1" in str(caught.value)


def test_without_the_exit_check_unbalanced_semaphores_pass(interpret, capsys):
    with interpret():
        jax.block_until_ready(manual_copy(_signal_without_wait, X, pltpu.SemaphoreType.REGULAR))
    assert "non-zero count" in capsys.readouterr().out  # printed, not raised


def test_out_of_bounds_copy_raises_and_names_the_rule(interpret):
    with interpret(), pytest.raises(Exception, match="Out-of-bounds read") as caught:
        jax.block_until_ready(manual_copy(_out_of_bounds, X))
    violation = translate_interpreter_error(caught.value, "out_of_bounds")
    assert violation is not None and violation.rule == DMA_OUT_OF_BOUNDS
    assert "reading [(slice(8, 24, 1), slice(0, 128, 1))] but buffer has shape (16, 128)" in str(
        violation
    )


def test_out_of_bounds_copy_by_constant_indices_fails_at_trace_time():
    def constant_out_of_bounds(x_hbm, o_ref, buffer, semaphore):
        pltpu.make_async_copy(x_hbm.at[pl.ds(8, 16)], buffer, semaphore).start()

    with pytest.raises(ValueError, match="Out of bound slice"):
        jax.make_jaxpr(lambda x: manual_copy(constant_out_of_bounds, x))(X)


def _ring_shift(wait_send):
    """Each device sends its block to the next one; ``wait_send=False`` drops the send wait."""

    def kernel(x_ref, o_ref, send_semaphore, receive_semaphore):
        me = jax.lax.axis_index("ring")
        right = (me + 1) % jax.lax.axis_size("ring")
        copy = pltpu.make_async_remote_copy(
            x_ref,
            o_ref,
            send_semaphore,
            receive_semaphore,
            device_id=(right,),
        )
        copy.start()
        if wait_send:
            copy.wait_send()
        copy.wait_recv()

    def shift(x):
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA],
            name="ring_shift",
        )(x)

    return shift


@pytest.mark.parametrize("wait_send", [True, False])
def test_remote_copy_must_wait_on_both_semaphores(interpret, wait_send):
    if len(jax.devices()) < 2:
        pytest.skip("needs 2 devices")
    mesh = jax.sharding.Mesh(jax.devices()[:2], ("ring",))
    x = jax.device_put(
        jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128),
        jax.NamedSharding(mesh, jax.P("ring")),
    )
    shift = jax.jit(
        jax.shard_map(
            _ring_shift(wait_send),
            mesh=mesh,
            in_specs=jax.P("ring"),
            out_specs=jax.P("ring"),
            check_vma=False,
        )
    )
    with interpret(detect_races=True):
        if wait_send:
            with kernel_exits_checked() as exits:
                out = jax.block_until_ready(shift(x))
            assert len(exits) == 2 and all(state.clean for state in exits)
            np.testing.assert_array_equal(out, np.roll(np.asarray(x), 8, axis=0))
        else:
            with pytest.raises(TpuRuleViolation) as caught, kernel_exits_checked():
                jax.block_until_ready(shift(x))
            # Which of the two a device sees depends on whether its neighbour
            # has run the copy by then; each device sees at least one.
            rules = {v.rule for v in caught.value.violations}
            assert rules and rules <= {DMA_NOT_WAITED, SEMAPHORES}
            assert "ring_shift" in caught.value.kernel
