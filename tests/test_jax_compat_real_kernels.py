"""The private JAX internals the real-kernel fixes use (_compat.jax_internals), each guarded."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas._compat import jax_internals, pallas_call_hooks, tpu_interpreter
from pytest_pallas.checks import jaxpr_analysis


def _two_outputs(x):
    def kernel(x_ref, o_ref, scratch_ref):
        scratch_ref[...] = x_ref[...]
        o_ref[...] = x_ref[...] + 1.0
    return pl.pallas_call(kernel, out_shape=(jax.ShapeDtypeStruct((8, 128), jnp.float32),) * 2,
                          interpret=True)(x)


def test_pallas_call_uses_in_sees_which_outputs_the_program_uses():
    closed = jax.make_jaxpr(lambda x: _two_outputs(x)[0])(jnp.ones((8, 128)))
    assert [used for _, used in jaxpr_analysis.pallas_call_uses_in(closed)] == [(True, False)]


def test_observe_pallas_call_uses_hears_dead_code_elimination_and_restores_the_rule():
    from jax._src.interpreters import partial_eval as pe

    rule = pe.dce_rules[jax_internals.pallas_call_primitive()]
    heard = []
    with pallas_call_hooks.observe_pallas_call_uses(lambda params, used: heard.append(used)) as on:
        assert on
        jax.jit(lambda x: _two_outputs(x)[0])(jnp.full((8, 128), 2.0)).block_until_ready()
    assert (True, False) in heard
    assert pe.dce_rules[jax_internals.pallas_call_primitive()] is rule


def test_observe_pallas_call_uses_is_off_when_the_rule_table_moved(monkeypatch):
    monkeypatch.setattr(pallas_call_hooks, "_PARTIAL_EVAL", "jax._src.no_such_module")
    with pallas_call_hooks.observe_pallas_call_uses(lambda *_: None) as on:
        assert not on


def test_interpreter_crash_names_a_crash_inside_the_tpu_interpreter_only():
    def kernel(x_ref, o_ref, buf):
        buf[...] = x_ref[...]
        o_ref[...] = buf.reshape(2, 8, 128)[1]

    def f(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                              scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32)])(x)

    tpu_interpreter.reset_interpreter_state()
    with pytest.raises(Exception) as crash, pltpu.force_tpu_interpret_mode(pltpu.InterpretParams()):
        jax.block_until_ready(f(jnp.ones((16, 128))))
    tpu_interpreter.reset_interpreter_state()
    assert "ReshapeTransform" in jax_internals.interpreter_crash(crash.value)
    assert jax_internals.interpreter_crash(ValueError("a kernel's own error")) is None


def _raised_from(filename: str, message: str, *, called_from: str | None = None,
                 kind: type[Exception] = ValueError) -> Exception:
    """An exception of ``kind`` whose raising frame is in ``filename`` (as if that file raised
    it), called from a frame in ``called_from`` if given."""
    namespace: dict = {kind.__name__: kind}
    exec(compile(f"def fail():\n    raise {kind.__name__}({message!r})\n", filename, "exec"),
         namespace)
    exec(compile("def call():\n    fail()\n", called_from or filename, "exec"), namespace)
    try:
        namespace["call"]()
    except kind as error:
        return error
    raise AssertionError("unreachable")


def test_interpreter_crash_counts_a_value_error_only_when_the_interpreter_raised_it():
    # The plain interpreter's discharge of tpu-inference's all-gather matmul (jax 0.12).
    inside = _raised_from("/venv/site-packages/jax/_src/state/discharge.py",
                          "safe_zip() argument 2 has length 8 but argument 0 has length 10.")
    crash = jax_internals.interpreter_crash(inside)
    assert crash.startswith("ValueError: safe_zip()") and "jax/_src/state/discharge.py" in crash
    # The kernel's own ValueError stays the kernel's, wherever it passed on its way out.
    own = _raised_from("/home/user/my_kernels.py", "block_q must divide the sequence")
    assert jax_internals.interpreter_crash(own) is None


def test_jax_refusing_what_its_interpreter_built_is_the_interpreter_s_limit():
    # The emit_pipeline primitive interpreted by jax 0.10.2: JAX's tracing refuses the state
    # effects of the jaxpr its interpreter built, checked after pallas_call's lowering traced it.
    effects = ("`JaxprInputEffect` Write<Var(id=1):int16[]> does not have a corresponding "
               "jaxpr input.")
    tracing = "/venv/site-packages/jax/_src/interpreters/partial_eval.py"
    refused = _raised_from(tracing, effects,
                           called_from="/venv/site-packages/jax/_src/pallas/pallas_call.py")
    crash = jax_internals.interpreter_crash(refused)
    assert crash.startswith("ValueError: `JaxprInputEffect`") and "pallas_call.py" in crash
    # The same words raised below the kernel's own code are not the interpreter's.
    own = _raised_from(tracing, effects, called_from="/home/user/my_kernels.py")
    assert jax_internals.interpreter_crash(own) is None


def test_a_callback_jax_cannot_lower_under_a_partly_automatic_mesh_is_the_interpreter_s_limit():
    # jax 0.12: a TPU-interpreted kernel vmapped over an explicit mesh axis (JAX's sharded
    # splash attention test); the interpreter's host callbacks cannot be lowered there.
    words = ("callbacks are only supported in spmd computations when all mesh axes are "
             "partitioned manually (no partial automatic sharding).")
    refused = _raised_from("/venv/site-packages/jax/_src/callback.py", words,
                           called_from="/venv/site-packages/jax/_src/pallas/pallas_call.py",
                           kind=NotImplementedError)
    assert jax_internals.interpreter_crash(refused).startswith("NotImplementedError: callbacks")
    # A callback of the test's own program, not inside an interpreted kernel's lowering.
    own = _raised_from("/venv/site-packages/jax/_src/callback.py", words,
                       called_from="/home/user/test_model.py", kind=NotImplementedError)
    assert jax_internals.interpreter_crash(own) is None


def test_with_tile_padded_bounds_sets_padded_and_leaves_other_values():
    params = jax_internals.with_tile_padded_bounds(pltpu.InterpretParams(detect_races=True))
    assert params.buffer_bounds == "padded" and params.detect_races
    assert jax_internals.with_tile_padded_bounds(True) is True


def test_own_interpret_params_kept_merges_and_restores():
    from jax._src.pallas import pallas_call as module

    original = module._pallas_call
    heard = []

    def merge(own, forced):
        return own, ["nothing"]

    def kernel(x_hbm, o_ref, buf, sem):
        copy = pltpu.make_async_copy(x_hbm.at[pl.ds(pl.program_id(0) * 0 + 8, 8)], buf, sem)
        copy.start()
        copy.wait()
        o_ref[...] = buf[...]

    def f(x):
        return pl.pallas_call(
            kernel, grid=(1,), out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
            scratch_shapes=[pltpu.VMEM((8, 128), x.dtype), pltpu.SemaphoreType.DMA],
            interpret=pltpu.InterpretParams(out_of_bounds_reads="uninitialized"))(x)

    tpu_interpreter.reset_interpreter_state()
    with pltpu.force_tpu_interpret_mode(pltpu.InterpretParams()), \
            pallas_call_hooks.own_interpret_params_kept(merge, lambda k, c: heard.append(c)) as on:
        assert on
        out = np.asarray(f(jnp.ones((8, 128), jnp.float32)))
    assert np.isnan(out).all()          # the kernel's out_of_bounds_reads="uninitialized" held
    assert heard == [["nothing"]]
    assert module._pallas_call is original


def test_a_limit_the_plugin_names_is_a_crash_even_quoted_through_xla():
    limit = jax_internals.InterpreterLimit("JAX's TPU interpreter cannot run this kernel here")
    assert jax_internals.interpreter_crash(limit) == (
        "InterpreterLimit: JAX's TPU interpreter cannot run this kernel here")
    # Raised in XLA's SPMD partitioner, it comes back as the text of a runtime error.
    quoted = RuntimeError(
        "INTERNAL: custom_partitioner: Traceback (most recent call last):\n"
        '  File "/venv/site-packages/pytest_pallas/_compat/partitioned_kernels.py", line 1\n'
        "pytest_pallas._compat.jax_internals.InterpreterLimit: JAX's TPU interpreter cannot "
        "run this kernel here\n")
    assert jax_internals.interpreter_crash(quoted) == (
        "InterpreterLimit: JAX's TPU interpreter cannot run this kernel here")
    # A kernel's own NotImplementedError is the kernel's.
    assert jax_internals.interpreter_crash(NotImplementedError("block_k > 512")) is None


def test_jax_refusing_a_pinned_buffer_is_named():
    refused = TypeError("No xla_shape_handler for type: "
                        "<class 'jax._src.state.types.AbstractLinVal'>")
    try:
        raise ValueError("a failure while lowering") from refused
    except ValueError as error:
        assert jax_internals.pinned_buffer_refused(error)
    assert not jax_internals.pinned_buffer_refused(TypeError("No xla_shape_handler for type"))
