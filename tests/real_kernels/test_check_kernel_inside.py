"""Class 2: ``check_kernel`` gives the same verdict inside a Pallas test as outside one.

jax 0.10 reads a forced interpreter when ``pl.pallas_call(...)`` is *built*: a
pallas_call object made inside a Pallas test (in its body, in a fixture, by a
``functools.partial`` of ``pl.pallas_call``, or by a builder cached on first
use) keeps the TPU interpreter in its params. ``check_kernel`` lowered that for
the TPU as interpreter callbacks, and failed a correct kernel with
``mosaic-lowering`` ("the platform for the specified backend cpu is different
from the lowering platform tpu"); with ``--pallas-interpret=plain`` it lowered
the kernel as plain XLA and passed a kernel Mosaic rejects. A cached builder
made the verdict outside depend on whether a Pallas test ran first.
"""

import re
import textwrap

import pytest

KERNELS = textwrap.dedent(
    """
    import functools

    import jax
    import jax.numpy as jnp
    import pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from pytest_pallas import check_kernel
    from pytest_pallas.checks.violations import TpuRuleViolation

    X = jax.ShapeDtypeStruct((256, 256), jnp.float32)
    Q = jax.ShapeDtypeStruct((1, 2, 256, 128), jnp.float32)
    INDICES = jax.ShapeDtypeStruct((2,), jnp.int32)


    def add_kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]


    def cumsum_kernel(x_ref, o_ref):
        o_ref[...] = jnp.cumsum(x_ref[...], axis=1)  # Mosaic has no cumsum


    def blocks():
        return pl.BlockSpec((128, 128), lambda i, j: (i, j))


    def build_add():
        return pl.pallas_call(add_kernel, out_shape=jax.ShapeDtypeStruct((256, 256), jnp.float32),
                              grid=(2, 2), in_specs=[blocks(), blocks()], out_specs=blocks())


    def build_cumsum():
        return pl.pallas_call(cumsum_kernel,
                              out_shape=jax.ShapeDtypeStruct((256, 256), jnp.float32),
                              grid=(2, 2), in_specs=[blocks()], out_specs=blocks())


    ADD_PARTIAL = functools.partial(
        pl.pallas_call, add_kernel, out_shape=jax.ShapeDtypeStruct((256, 256), jnp.float32),
        grid=(2, 2), in_specs=[blocks(), blocks()], out_specs=blocks())


    @functools.cache
    def cached_add():
        return build_add()


    @jax.jit
    def jitted_add(x, y):
        return build_add()(x, y) * 2


    def used_in_a_jit(call):
        return jax.jit(lambda x, y: call(x, y) + 1)


    def prefetch_kernel(indices_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2


    def scalar_prefetch(indices, x):
        return pl.pallas_call(
            prefetch_kernel, out_shape=jax.ShapeDtypeStruct((256, 256), jnp.float32),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(2,),
                in_specs=[pl.BlockSpec((128, 256), lambda i, idx: (idx[i], 0))],
                out_specs=pl.BlockSpec((128, 256), lambda i, idx: (i, 0))))(indices, x)


    def pipeline_kernel(x_hbm, o_hbm):
        def inner(x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1
        pltpu.emit_pipeline(inner, grid=(2,),
                            in_specs=[pl.BlockSpec((128, 256), lambda i: (i, 0))],
                            out_specs=pl.BlockSpec((128, 256), lambda i: (i, 0)))(x_hbm, o_hbm)


    def emit_pipeline(x):
        return pl.pallas_call(
            pipeline_kernel, out_shape=jax.ShapeDtypeStruct((256, 256), jnp.float32),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY))(x)


    def jax_flash_attention(q, k, v):
        from jax.experimental.pallas.ops.tpu import flash_attention as fa
        sizes = fa.BlockSizes(block_q=128, block_k_major=128, block_k=128, block_b=1)
        return fa.flash_attention(q, k, v, block_sizes=sizes)


    # Each kernel as a test gets it: the pallas_call object is made when the test asks.
    KERNELS = {
        "built_in_the_test": (build_add, (X, X)),
        "partial_of_pallas_call": (lambda: ADD_PARTIAL(), (X, X)),
        "cached_builder": (cached_add, (X, X)),
        "inside_jit": (lambda: jitted_add, (X, X)),
        "built_then_used_in_a_jit": (lambda: used_in_a_jit(build_add()), (X, X)),
        "scalar_prefetch": (lambda: scalar_prefetch, (INDICES, X)),
        "emit_pipeline": (lambda: emit_pipeline, (X,)),
        "jax_flash_attention": (lambda: jax_flash_attention, (Q, Q, Q)),
        "cumsum_mosaic_rejects": (build_cumsum, (X,)),
    }


    def verdict(name, use_compiler):
        make, args = KERNELS[name]
        try:
            check_kernel(make(), *args, use_compiler=use_compiler)
        except TpuRuleViolation as error:
            return ",".join(sorted({v.rule for v in error.violations}))
        return "pass"


    @pytest.fixture
    def kernel_from_a_fixture(pallas_backend):
        return build_add()
    """
)

INSIDE_THEN_OUTSIDE = KERNELS + textwrap.dedent(
    """

    JUDGES = [False, None]  # the static rules and Mosaic's lowering; the compiler if installed


    @pytest.mark.pallas
    @pytest.mark.parametrize("use_compiler", JUDGES)
    @pytest.mark.parametrize("name", list(KERNELS))
    def test_inside(name, use_compiler):
        print(f"VERDICT inside {name} {use_compiler} {verdict(name, use_compiler)}")


    @pytest.mark.parametrize("use_compiler", JUDGES)
    def test_fixture_inside(kernel_from_a_fixture, use_compiler):
        try:
            check_kernel(kernel_from_a_fixture, X, X, use_compiler=use_compiler)
            result = "pass"
        except TpuRuleViolation as error:
            result = ",".join(sorted({v.rule for v in error.violations}))
        print(f"VERDICT fixture built_in_the_test {use_compiler} {result}")


    @pytest.mark.parametrize("use_compiler", JUDGES)
    @pytest.mark.parametrize("name", list(KERNELS))
    def test_outside(name, use_compiler):
        print(f"VERDICT outside {name} {use_compiler} {verdict(name, use_compiler)}")
    """
)

_VERDICT = re.compile(r"VERDICT (\w+) (\w+) (\w+) (\S+)$", re.MULTILINE)


@pytest.mark.parametrize("interpreter", ["tpu", "plain"])
def test_check_kernel_gives_the_same_verdict_inside_and_outside_a_pallas_test(
        run_pytest, pytester, interpreter):
    pytester.makepyfile(test_inside_outside=INSIDE_THEN_OUTSIDE)
    # The ini option, not the flag: a backend flag makes every test of the run a Pallas test.
    pytester.makeini(f"[pytest]\npallas_interpret = {interpreter}\n")
    result = run_pytest("-s", "-p", "no:randomly")
    result.assert_outcomes(passed=38)
    verdicts = {}
    for where, name, judge, verdict in _VERDICT.findall(result.stdout.str()):
        verdicts.setdefault((name, judge), {})[where] = verdict
    assert len(verdicts) == 18
    for (name, judge), seen in verdicts.items():
        # one verdict wherever check_kernel runs: inside, from a fixture, outside
        assert len(set(seen.values())) == 1, (name, judge, seen)
        expected = "pass" if name != "cumsum_mosaic_rejects" else (
            "mosaic-lowering" if judge == "False" else seen["outside"])
        assert seen["outside"] == expected, (name, judge, seen)
    # the one kernel Mosaic rejects is rejected by whichever judge (never passed)
    assert verdicts[("cumsum_mosaic_rejects", "None")]["inside"] != "pass"


IMPORT_TIME_KERNEL = textwrap.dedent(
    """
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np
    import pytest
    from jax.experimental import pallas as pl

    from pytest_pallas import check_kernel


    # Pallas's own idiom: the pallas_call is built when the module is imported.
    @functools.partial(pl.pallas_call, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    def add_vectors(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]


    @pytest.mark.pallas
    def test_runs_in_a_pallas_test():
        x = jnp.ones((8, 128))
        np.testing.assert_array_equal(add_vectors(x, x), 2 * np.ones((8, 128)))
        check_kernel(add_vectors, x, x, use_compiler=False)


    def test_outside_a_pallas_test_the_plugin_changes_nothing():
        check_kernel(add_vectors, jnp.ones((8, 128)), jnp.ones((8, 128)), use_compiler=False)
        with pytest.raises(Exception, match="Only interpret mode is supported on CPU"):
            add_vectors(jnp.ones((8, 128)), jnp.ones((8, 128)))
    """
)


@pytest.mark.parametrize("interpreter", ["tpu", "plain"])
def test_a_pallas_call_built_at_import_time_runs_in_the_forced_interpreter(
        run_pytest, pytester, interpreter):
    """Same root: a call built before the interpreter was forced kept ``interpret=False`` and
    failed a Pallas test with "Only interpret mode is supported on CPU backend"."""
    pytester.makepyfile(test_import_time=IMPORT_TIME_KERNEL)
    pytester.makeini(f"[pytest]\npallas_interpret = {interpreter}\n")
    run_pytest().assert_outcomes(passed=2)
