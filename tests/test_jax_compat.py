"""pytest_pallas._compat.jax_internals against the installed JAX: every private internal the
plugin's
foundation relies on is where it expects, and a moved one is a clear JaxInternalsChanged."""

import importlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas._compat import device_kinds, jax_internals, pallas_call_hooks, tpu_interpreter
from pytest_pallas._compat.jax_internals import JaxInternalsChanged
from pytest_pallas.checks import jaxpr_analysis
from pytest_pallas.plugin import options
from pytest_pallas.plugin import versions as pallas_versions

TPU_INFO = importlib.import_module("jax._src.pallas.mosaic.tpu_info")
INTERPRETER = importlib.import_module("jax._src.pallas.mosaic.interpret.interpret_pallas_call")


def copy_kernel(*, wait_before_reading):
    def kernel(x_hbm, o_ref, buffer, semaphore):
        copy = pltpu.make_async_copy(x_hbm, buffer, semaphore)
        copy.start()
        if wait_before_reading:
            copy.wait()
        o_ref[...] = buffer[...]
        if not wait_before_reading:
            copy.wait()

    return kernel


def run_interpreted(kernel, params):
    return jax.block_until_ready(pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA(())],
        interpret=params,
    )(jnp.ones((8, 128), jnp.float32)))


@pytest.fixture
def clean_interpreter():
    tpu_interpreter.reset_interpreter_state()
    yield
    tpu_interpreter.reset_interpreter_state()


# --- the TPU interpreter's state --------------------------------------------------------


def test_races_found_sees_a_race_and_reset_clears_it(clean_interpreter, capsys, caplog):
    detecting = jax_internals.interpret_params(detect_races=True)
    assert tpu_interpreter.races_found() is False

    run_interpreted(copy_kernel(wait_before_reading=True), detecting)
    assert tpu_interpreter.races_found() is False

    run_interpreted(copy_kernel(wait_before_reading=False), detecting)
    assert tpu_interpreter.races_found() is True
    # Printed up to jax 0.10, logged from 0.11.
    assert "RACE DETECTED" in capsys.readouterr().out + caplog.text

    tpu_interpreter.reset_interpreter_state()
    assert tpu_interpreter.races_found() is False


def test_reset_interpreter_state_drops_what_a_failed_kernel_left_behind(clean_interpreter):
    def add_one(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    def call():
        return jax.block_until_ready(pl.pallas_call(
            add_one, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            interpret=pltpu.InterpretParams())(jnp.ones((8, 128), jnp.float32)))

    # What a kernel that raised mid-interpretation leaves: the next kernel reuses it and fails.
    INTERPRETER._shared_memory = object()
    with pytest.raises(Exception, match="object"):
        call()
    tpu_interpreter.reset_interpreter_state()
    assert INTERPRETER._shared_memory is None and INTERPRETER.races is None
    np.testing.assert_array_equal(call(), 2.0)


# --- chips ----------------------------------------------------------------------------------


def test_chip_versions_are_the_chips_the_options_accept():
    versions = device_kinds.chip_versions()
    # Every chip this JAX knows is accepted; a chip it lacks is one that only
    # newer JAX releases know, and the option says so when asked for it.
    assert set(versions) <= set(options.KNOWN_CHIPS)
    lacking = set(options.KNOWN_CHIPS) - set(versions)
    assert lacking <= set(pallas_versions.CHIPS_SINCE_JAX)
    assert all(pallas_versions.chip_needs_newer_jax(chip) for chip in lacking)
    assert not any(pallas_versions.chip_needs_newer_jax(chip) for chip in versions)
    assert all(isinstance(version, pltpu.ChipVersion) and version.value == name
               for name, version in versions.items())
    assert options.DEFAULT_CHIP in versions


@pytest.mark.parametrize("device_kind, chip", [
    ("TPU v5 lite", "v5e"), ("TPU v5e", "v5e"), ("TPU v4", "v4"), ("TPU v5p", "v5p"),
    ("TPU v6 lite", "v6e"), ("TPU7x", "7x"), ("cpu", None), ("TPU v99", None),
])
def test_chip_version_of_device_kind(device_kind, chip):
    version = device_kinds.chip_version_of_device_kind(device_kind)
    assert (version.value if version is not None else None) == chip
    if chip == "v5e":
        assert version == pltpu.ChipVersion("v5e")


def test_device_kind_answers_as_then_restores_the_registry():
    kind = jax.devices()[0].device_kind
    v4 = pltpu.get_tpu_info_for_chip(pltpu.ChipVersion("v4"), 2)
    assert kind not in TPU_INFO.registry
    with device_kinds.device_kind_answers_as(kind, lambda: v4):
        assert pltpu.get_tpu_info() is v4
        assert str(pltpu.get_tpu_info().chip_version) == "v4"
    assert kind not in TPU_INFO.registry
    with pytest.raises(ValueError, match="Unsupported TPU device kind"):
        pltpu.get_tpu_info()


def test_device_kind_answers_as_restores_a_previous_entry_even_after_an_error(monkeypatch):
    kind = jax.devices()[0].device_kind
    v5e = pltpu.get_tpu_info_for_chip(pltpu.ChipVersion("v5e"), 1)
    v6e = pltpu.get_tpu_info_for_chip(pltpu.ChipVersion("v6e"), 1)

    def previous():
        return v5e

    monkeypatch.setitem(TPU_INFO.registry, kind, previous)
    with (pytest.raises(KeyError, match="inside"),
          device_kinds.device_kind_answers_as(kind, lambda: v6e)):
        assert pltpu.get_tpu_info() is v6e
        raise KeyError("inside")
    assert TPU_INFO.registry[kind] is previous
    assert pltpu.get_tpu_info() is v5e


# --- backends and the pallas_call primitive -------------------------------------------------


def test_backends_are_initialized():
    jax.devices()
    assert jax_internals.backends_are_initialized() is True


def test_backends_are_not_initialized_by_importing_jax():
    script = textwrap.dedent("""
        import jax
        from pytest_pallas._compat import jax_internals
        assert jax_internals.backends_are_initialized() is False
        jax.devices()
        assert jax_internals.backends_are_initialized() is True
        """)
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                               timeout=120, check=False)
    assert completed.returncode == 0, completed.stderr


def test_pallas_call_primitive_is_the_one_in_a_traced_kernel():
    def double(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    primitive = jax_internals.pallas_call_primitive()
    jaxpr = jax.make_jaxpr(pl.pallas_call(
        double, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32)))(jnp.ones((8, 128)))
    assert primitive.name == "pallas_call"
    assert [eqn.primitive for eqn in jaxpr.jaxpr.eqns] == [primitive]
    assert "grid_mapping" in jaxpr.jaxpr.eqns[0].params


def test_as_compiled_for_the_chip_drops_a_recorded_interpreter_in_nested_calls():
    def double(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    with pltpu.force_tpu_interpret_mode(jax_internals.interpret_params()):
        call = pl.pallas_call(double, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    x = jnp.ones((8, 128))
    closed = jax.make_jaxpr(jax.jit(lambda x: call(x) + 1))(x)
    recorded = [p["interpret"] for p in jaxpr_analysis.pallas_call_params_in(closed)]
    assert recorded and all(isinstance(i, pltpu.InterpretParams) for i in recorded)
    compiled = jax_internals.as_compiled_for_the_chip(closed)
    assert [p["interpret"] for p in jaxpr_analysis.pallas_call_params_in(
        jax.make_jaxpr(compiled)(x))] == [False]
    # the rewritten program lowers for the TPU with Mosaic (the interpreter would not)
    jax.jit(compiled).trace(x).lower(lowering_platforms=("tpu",))
    with pytest.raises(ValueError, match="different from the lowering platform tpu"):
        jax.jit(jax.extend.core.jaxpr_as_fun(closed)).trace(x).lower(lowering_platforms=("tpu",))


def test_forced_interpreter_when_called_reaches_a_call_built_before_and_restores_bind():
    def double(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    call = pl.pallas_call(double, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    primitive = jax_internals.pallas_call_primitive()
    x = jnp.ones((8, 128))
    params = jax_internals.interpret_params()
    with pallas_call_hooks.forced_interpreter_when_called() as hooked:
        assert hooked
        with pltpu.force_tpu_interpret_mode(params):
            interpreted = [p["interpret"] for p in jaxpr_analysis.pallas_call_params_in(
                jax.make_jaxpr(call)(x))]
        unforced = [p["interpret"] for p in jaxpr_analysis.pallas_call_params_in(
            jax.make_jaxpr(call)(x))]
    assert interpreted == [params] and unforced == [False]
    assert "bind" not in vars(primitive)


def test_forced_interpreter_when_called_is_off_when_the_primitive_moved(monkeypatch):
    monkeypatch.delattr(importlib.import_module("jax._src.pallas.pallas_call"), "pallas_call_p")
    with pallas_call_hooks.forced_interpreter_when_called() as hooked:
        assert hooked is False


def test_eager_evaluation_computes_concrete_values_inside_a_trace():
    # The static checks evaluate index maps while a kernel is being traced.
    seen = {}

    def traced(x):
        with jax_internals.eager_evaluation(), jax.ensure_compile_time_eval():
            seen["eager"] = jnp.arange(3) * 2
        seen["staged"] = jnp.arange(3) * 2
        return x

    jax.make_jaxpr(traced)(1.0)
    assert not isinstance(seen["eager"], jax.core.Tracer)
    assert np.asarray(seen["eager"]).tolist() == [0, 2, 4]
    assert isinstance(seen["staged"], jax.core.Tracer)


def test_eager_evaluation_on_a_jax_without_eval_context_is_a_null_context(monkeypatch):
    monkeypatch.delattr(importlib.import_module("jax._src.core"), "eval_context")
    with jax_internals.eager_evaluation():
        pass


# --- a JAX release that moved an internal ------------------------------------------------------


@pytest.mark.parametrize("module, attribute, call", [
    (TPU_INFO, "chip_version_from_device_kind",
     lambda: device_kinds.chip_version_of_device_kind("TPU v5 lite")),
    (TPU_INFO, "registry",
     lambda: device_kinds.device_kind_answers_as("cpu", lambda: None).__enter__()),
    (INTERPRETER, "races", tpu_interpreter.races_found),
    (importlib.import_module("jax._src.xla_bridge"), "backends_are_initialized",
     jax_internals.backends_are_initialized),
    (importlib.import_module("jax._src.pallas.pallas_call"), "pallas_call_p",
     jax_internals.pallas_call_primitive),
    (importlib.import_module("jax._src.core"), "jaxpr_as_fun",
     lambda: jax_internals.as_compiled_for_the_chip(jax.make_jaxpr(jnp.sin)(1.0))),
], ids=["chip_version_from_device_kind", "registry", "races", "backends_are_initialized",
        "pallas_call_p", "jaxpr_as_fun"])
def test_a_moved_internal_is_a_clear_error(monkeypatch, module, attribute, call):
    monkeypatch.delattr(module, attribute)
    with pytest.raises(JaxInternalsChanged) as raised:
        call()
    message = str(raised.value)
    assert f"pytest-pallas needs {module.__name__}.{attribute}, which this JAX does not have" \
        in message
    assert "install a supported jax" in message
    assert isinstance(raised.value, RuntimeError) and not isinstance(raised.value, AttributeError)


def test_a_registry_that_changed_type_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(TPU_INFO, "registry", [])
    with (pytest.raises(JaxInternalsChanged, match=r"tpu_info\.registry is no longer a dict"),
          device_kinds.device_kind_answers_as("cpu", lambda: None)):
        pass


def test_a_missing_module_is_a_clear_error():
    with pytest.raises(JaxInternalsChanged, match=r"pytest-pallas needs jax\._src\.no_such_module, "
                                                  r"which this JAX does not have"):
        jax_internals.private_attribute("jax._src.no_such_module", "anything")


def test_running_interpreted_kernels_names_a_kernel_only_while_it_runs(clean_interpreter):
    import threading

    tpu_interpreter.install_kernel_exit_hook()
    seen_inside = []
    ages_inside = []
    gate = threading.Event()

    def kernel(x_ref, o_ref):
        def look(x):
            seen_inside.extend(tpu_interpreter.running_interpreted_kernels())
            ages_inside.append(tpu_interpreter.running_interpreted_kernel_ages())
            gate.set()
            return x

        o_ref[...] = jax.pure_callback(look, jax.ShapeDtypeStruct(x_ref.shape, x_ref.dtype),
                                       x_ref[...])

    jax.block_until_ready(pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        interpret=pltpu.InterpretParams(), name="looks_at_itself",
    )(jnp.ones((8, 128), jnp.float32)))
    assert gate.is_set()
    assert seen_inside == ["looks_at_itself"]
    assert tpu_interpreter.running_interpreted_kernels() == []
    # --pallas-timeout's clock: from the kernel's start, not the test's.
    [ages] = ages_inside
    assert list(ages) == ["looks_at_itself"] and ages["looks_at_itself"] >= 0
    assert tpu_interpreter.running_interpreted_kernel_ages() == {}


def test_a_run_on_a_jax_that_moved_internals_turns_those_features_off_and_goes_on(pytester):
    # A newer JAX that moved what these features read: the kernel still runs and
    # passes, and the run says once per feature that it is off, and why. (The chip
    # stand-in is not among them: the TPU interpreter needs the chip's tiling.)
    pytester.makeconftest('''
        from pytest_pallas._compat import jax_internals

        real = jax_internals.private_attribute
        MOVED = {
            ("jax._src.interpreters.partial_eval", None),
            ("jax._src.pallas.mosaic.interpret.interpret_pallas_call", "_validate"),
        }

        def moved(module, attribute=None):
            if (module, attribute) in MOVED:
                raise jax_internals.JaxInternalsChanged(f"{module}.{attribute} moved")
            return real(module, attribute)

        jax_internals.private_attribute = moved
    ''')
    pytester.makepyfile('''
        import jax, jax.numpy as jnp, numpy as np, pytest
        from jax.experimental import pallas as pl

        def add_one(x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1

        @pytest.mark.pallas
        @pytest.mark.parametrize("n", [1, 2])
        def test_add_one(n):
            x = jnp.full((8, 128), n, jnp.float32)
            out = pl.pallas_call(add_one, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
            np.testing.assert_array_equal(out, x + 1)
    ''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "default")
    output = result.stdout.str()
    assert result.ret == 0, output
    result.assert_outcomes(passed=2)
    features = [
        ("the static TPU rules", "partial_eval.None"),
        ("the kernel-exit checks (semaphores, DMAs, races)", "interpret_pallas_call._validate"),
    ]
    for feature, internal in features:
        lines = [line for line in output.splitlines()
                 if f"pytest-pallas: {feature} is off on this JAX" in line]
        assert len(lines) == 1, output
        assert internal in lines[0]
