"""XLA's fast-compile options for the suite's interpreted kernels (pytest_pallas._compat.
xla_cpu_options), at whichever end of the supported JAX range is installed: the installed
jaxlib accepts what is kept, an option it does not know is dropped, and the options change
no verdict (LLVM at -O0 rounds a few results differently: ulps, as accurate)."""

import jax
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from pytest_pallas import assert_allclose
from pytest_pallas._compat import xla_cpu_options
from pytest_pallas.reference_kernels import flash_attention, matmul
from pytest_pallas.suite.properties import suite_jit


@pytest.fixture
def fresh_probe():
    xla_cpu_options._accepted_options.cache_clear()
    yield
    xla_cpu_options._accepted_options.cache_clear()


def test_the_installed_jaxlib_accepts_the_options_kept(fresh_probe):
    kept = xla_cpu_options.fast_compile_options()
    # LLVM's -O0 is an option of every jaxlib in the supported range.
    assert kept.get("xla_backend_optimization_level") == 0
    compiled = jax.jit(lambda x: x * 2, compiler_options=kept).lower(np.float32(1)).compile()
    assert float(compiled(np.float32(1))) == 2.0


def test_a_long_run_keeps_llvms_optimiser(fresh_probe):
    options = xla_cpu_options.fast_compile_options(long_run=True)
    assert xla_cpu_options.OPTIMIZATION_LEVEL not in options
    assert options.get("xla_llvm_disable_expensive_passes") is True


def test_an_option_the_jaxlib_does_not_know_is_dropped(fresh_probe, monkeypatch):
    monkeypatch.setattr(xla_cpu_options, "CANDIDATES", (
        ("xla_no_such_option_in_any_jaxlib", True),
        ("xla_backend_optimization_level", 0),
    ))
    assert xla_cpu_options.fast_compile_options() == {"xla_backend_optimization_level": 0}


def _both(function, *args):
    with pltpu.force_tpu_interpret_mode(True):
        fast = suite_jit(function)(*args)
        default = jax.jit(function)(*args)
    return np.asarray(fast), np.asarray(default)


@pytest.mark.parametrize("kernel", ["matmul", "flash_attention"])
def test_interpreted_kernels_compute_the_same_values_with_the_options(kernel):
    rng = np.random.default_rng(0)
    if kernel == "matmul":
        x = rng.standard_normal((200, 300), dtype=np.float32)
        y = rng.standard_normal((300, 384), dtype=np.float32)
        fast, default = _both(lambda a, b: matmul.matmul(a, b, block_m=64, block_n=128,
                                                         block_k=128), x, y)
        reduction = 300
    else:
        q, k, v = (rng.standard_normal((1, 2, 160, 128), dtype=np.float32) for _ in range(3))
        fast, default = _both(lambda a, b, c: flash_attention.flash_attention(
            a, b, c, causal=True, sm_scale=0.1, block_q=32, block_kv=128), q, k, v)
        reduction = 160
    assert np.isfinite(fast).all()
    assert_allclose(fast, default, reduction_length=reduction)


def test_a_pallas_test_s_own_jits_compile_fast_on_the_cpu_and_nothing_else_does():
    # A test's kernels are interpreted inside its own jax.jit: XLA's fast options reach
    # those compiles, not one that chose options of its own, and only inside the block.
    from jax._src import compiler, xla_bridge

    from pytest_pallas._compat.xla_cpu_options import fast_compile_options, fast_cpu_compiles

    def overrides(**kwargs):
        return dict(compiler.get_compile_options(
            num_replicas=1, num_partitions=1, backend=xla_bridge.get_backend(),
            **kwargs).env_option_overrides)

    with fast_cpu_compiles() as applied:
        assert applied
        assert overrides() == fast_compile_options()
        assert overrides(env_options_overrides={"xla_backend_optimization_level": 2}) == {
            "xla_backend_optimization_level": 2}
    assert overrides() == {}
