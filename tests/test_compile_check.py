"""The TPU compiler's verdict on the CPU (--pallas-compile, compile_check, check_kernel).

Each kernel rejected here computes the right values in both interpreters (the
same inner run passes with --pallas-compile=none): only the TPU compiler, run
ahead of time for a TPU topology by libtpu, knows it would not compile.
"""

import json
import textwrap

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import flash_attention as jax_flash_attention
from jax.experimental.pallas.ops.tpu.matmul import matmul as jax_matmul

from pytest_pallas.checks import compile_check
from pytest_pallas.checks.kernel_check import check_kernel
from pytest_pallas.checks.violations import TpuRuleViolation
from pytest_pallas.plugin import options

pytestmark = pytest.mark.skipif(
    compile_check.libtpu_version() is None,
    reason="needs libtpu (pip install 'pytest-pallas[tpu]'); the tests without it run in "
    "a subprocess that hides it",
)

# Kernels whose values both interpreters get right, and that the TPU compiler rejects.
REJECTED_KERNELS = textwrap.dedent('''
    import jax
    import jax.numpy as jnp
    import numpy as np
    import pytest
    from jax.experimental import pallas as pl

    pytestmark = pytest.mark.pallas


    def whole(kernel, x, out_shape=None):
        out = out_shape or jax.ShapeDtypeStruct(x.shape, x.dtype)
        return pl.pallas_call(kernel, out_shape=out)(x)


    def cumsum_kernel(x_ref, o_ref):
        o_ref[...] = jnp.cumsum(x_ref[...], axis=1)


    def sort_kernel(x_ref, o_ref):
        o_ref[...] = jnp.sort(x_ref[...], axis=1)


    def reverse_kernel(x_ref, o_ref):
        o_ref[...] = jnp.flip(x_ref[...], axis=1)


    def unaligned_kernel(x_ref, o_ref):
        # Lane offset 3 * i: the compiler cannot prove it a multiple of 128.
        o_ref[...] = x_ref[:, pl.ds(pl.program_id(0) * 3, 128)]


    def reshape_kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...].reshape(o_ref.shape)


    def mlp_kernel(x_ref, w_ref, o_ref):
        # Blocks fit the limit (10 MiB); with the float32 intermediate (8 MiB) they do not.
        h = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)
        o_ref[...] = jnp.dot(h, w_ref[...].T, preferred_element_type=jnp.float32)


    X = np.arange(8 * 128, dtype=np.float32).reshape(8, 128) % 7


    def test_unimplemented_cumsum():
        np.testing.assert_allclose(whole(cumsum_kernel, X), np.cumsum(X, axis=1))


    def test_unimplemented_sort():
        np.testing.assert_allclose(whole(sort_kernel, X), np.sort(X, axis=1))


    def test_unimplemented_lane_reversal():
        np.testing.assert_allclose(whole(reverse_kernel, X), X[:, ::-1])


    def test_tiling_unaligned_lane_slice():
        x = np.arange(8 * 512, dtype=np.float32).reshape(8, 512)
        out = pl.pallas_call(
            unaligned_kernel, grid=(2,),
            in_specs=[pl.BlockSpec((8, 512), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (0, i)),
            out_shape=jax.ShapeDtypeStruct((8, 256), jnp.float32))(x)
        np.testing.assert_allclose(out, np.concatenate([x[:, 0:128], x[:, 3:131]], axis=1))


    def test_layout_reshape_across_tiles():
        x = np.arange(8 * 120, dtype=np.float32).reshape(8, 120)
        out = whole(reshape_kernel, x, jax.ShapeDtypeStruct((24, 40), jnp.float32))
        np.testing.assert_allclose(out, x.reshape(24, 40))


    def test_vmem_intermediates():
        rows, n, m = 512, 256, 4096
        x = np.full((2 * rows, n), 0.01, np.float32)
        w = np.full((n, m), 0.01, np.float32)
        out = pl.pallas_call(
            mlp_kernel, grid=(2,),
            in_specs=[pl.BlockSpec((rows, n), lambda i: (i, 0)),
                      pl.BlockSpec((n, m), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((rows, n), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, w)
        h = x.astype(np.float64) @ w
        np.testing.assert_allclose(out, h @ w.T, rtol=1e-4)
''')

# kernel -> the rule the compiler's rejection is filed under
EXPECTED_RULES = {
    "cumsum_kernel": compile_check.UNIMPLEMENTED,
    "sort_kernel": compile_check.UNIMPLEMENTED,
    "reverse_kernel": compile_check.UNIMPLEMENTED,
    "unaligned_kernel": compile_check.TILING,
    "reshape_kernel": compile_check.LAYOUT,
    "mlp_kernel": compile_check.VMEM,
}
# The compiler is the judge, and newer ones accept more: libtpu 0.0.50 (jax 0.12) lays the
# reshape across tiles out and keeps the MLP's intermediates within 16 MiB, which 0.0.42
# (jax 0.10) rejects. On a newer libtpu those two compile, and the check passes them.
ACCEPTED_SINCE_LIBTPU_0_0_50 = ("reshape_kernel", "mlp_kernel")


def _libtpu_release() -> tuple[int, ...]:
    version = compile_check.libtpu_version() or "0"
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def rejected_rules() -> dict[str, str]:
    """The kernels this libtpu rejects, with the rule of each."""
    newer = _libtpu_release() >= (0, 0, 50)
    return {kernel: rule for kernel, rule in EXPECTED_RULES.items()
            if not (newer and kernel in ACCEPTED_SINCE_LIBTPU_0_0_50)}


@pytest.mark.parametrize("interpreter", ["tpu", "plain"])
def test_the_rejected_kernels_are_right_in_both_interpreters(run_pytest, pytester, interpreter):
    pytester.makepyfile(test_rejected=REJECTED_KERNELS)
    # Right with float32 products, as written (their float32 dots round on the chip).
    result = run_pytest(f"--pallas-interpret={interpreter}", "--pallas-compile=none",
                        "--pallas-numerics=exact")
    result.assert_outcomes(passed=len(EXPECTED_RULES))


def test_the_compile_check_fails_each_with_the_compilers_reason(run_pytest, pytester):
    pytester.makepyfile(test_rejected=REJECTED_KERNELS)
    # The accepted kernels are right with float32 products, as written.
    result = run_pytest("--pallas-compile=v5e", "-rf", "--pallas-numerics=exact")
    rejected = rejected_rules()
    result.assert_outcomes(failed=len(rejected), passed=len(EXPECTED_RULES) - len(rejected))
    text = result.stdout.str()
    for kernel, rule in rejected.items():
        # The rule, the kernel with its source line, the chip.
        assert (f"TPU rule [{rule}] broken by kernel '{kernel} at test_rejected.py:" in text
                and "rejects it for v5e" in text), (kernel, rule)
    assert "Unimplemented primitive in Pallas TPU lowering for tc: cumsum" in text
    assert "cannot statically prove that index in dimension 1 is a multiple of 128" in text
    if "mlp_kernel" in rejected:
        assert "the limit is 16.00 MiB" in text  # the compiler's own VMEM numbers
    assert "; TPU compiler check for v5e (libtpu" in text  # the header


def test_a_rejection_names_every_chip_that_rejects(run_pytest, pytester):
    pytester.makepyfile(test_rejected=REJECTED_KERNELS)
    result = run_pytest("--pallas-compile=v5e,v6e", "-k", "cumsum")
    result.assert_outcomes(failed=1)
    assert "rejects it for v5e" in result.stdout.str()
    assert "rejects it for v6e" in result.stdout.str()


CORRECT_KERNELS = textwrap.dedent('''
    import jax
    import jax.numpy as jnp
    import numpy as np
    import pytest
    from jax.experimental.pallas.ops.tpu import flash_attention as fa
    from jax.experimental.pallas.ops.tpu.matmul import matmul

    pytestmark = pytest.mark.pallas


    def test_jax_matmul():
        x = np.ones((256, 256), np.float32)
        np.testing.assert_allclose(matmul(x, x, block_shape=(128, 128)), x @ x)


    def test_jax_flash_attention():
        q = jnp.ones((1, 2, 128, 128), jnp.float32) * 0.1
        out = fa.flash_attention(q, q, q)
        assert out.shape == q.shape
''')


def test_correct_kernels_pass_the_compile_check(run_pytest, pytester):
    pytester.makepyfile(test_correct=CORRECT_KERNELS)
    result = run_pytest("--pallas-compile=v5e,v6e")
    result.assert_outcomes(passed=2)


# A kernel vmapped over an axis of a mesh with explicit axes: traced under jax.set_mesh, its
# outputs carry the mesh's sharding, which a compile on one device refused (a false alarm).
UNDER_AN_EXPLICIT_MESH = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.sharding import AxisType
    from jax.experimental import pallas as pl

    def add_one(x):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    @pytest.mark.pallas
    @pytest.mark.devices(4)
    def test_vmapped_over_an_explicit_axis():
        mesh = jax.make_mesh((4,), ("dp",), axis_types=(AxisType.Explicit,))
        x = jax.device_put(jnp.ones((4, 8, 128)), jax.NamedSharding(mesh, jax.P("dp")))
        with jax.set_mesh(mesh):
            out = jax.jit(jax.vmap(add_one))(x)
        np.testing.assert_array_equal(out, 2 * np.ones((4, 8, 128)))
''')


def test_a_kernel_under_an_explicit_mesh_is_compiled_for_its_shapes(run_pytest, pytester):
    pytester.makepyfile(test_explicit=UNDER_AN_EXPLICIT_MESH)
    result = run_pytest("--pallas-interpret=tpu", "-p", "no:xdist")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*TPU compiler check: 1 kernel compiles*"])


def test_the_reference_kernels_compile_in_the_suite(run_pytest, tmp_path):
    report = tmp_path / "report.json"
    result = run_pytest("--pallas-conformance", "--pallas-ops=add,matmul,attention,copy,ppermute",
                        "--pallas-examples=3", "--pallas-compile=v5e", f"--pallas-report={report}",
                        timeout=600)
    assert result.ret == 0, result.stdout.str()
    ops = json.loads(report.read_text())["ops"]
    for op in ("add", "matmul", "attention", "copy", "ppermute"):
        verdict = ops[op]["compile"]["v5e"]
        assert verdict["compiled"] and verdict["kernels_rejected"] == 0, (op, verdict)


@pytest.mark.parametrize("chip", ["v5e", "v6e"])
def test_check_kernel_passes_jax_kernels_and_says_the_compiler_judged(chip):
    q = jax.ShapeDtypeStruct((1, 2, 256, 128), jnp.float32)
    reports = check_kernel(jax_flash_attention.flash_attention, q, q, q, chip=chip)
    assert reports and all(r.judged_by.startswith("TPU compiler") for r in reports)
    assert all(r.compile_verdict.compiled for r in reports)
    x = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)
    reports = check_kernel(jax_matmul, x, x, block_shape=(512, 512), chip=chip)
    libtpu = compile_check.libtpu_version()
    assert reports[0].judged_by == f"TPU compiler (libtpu {libtpu}) for {chip}"


def test_check_kernel_without_the_compiler_uses_the_static_rules(monkeypatch):
    def cumsum(x):
        from jax.experimental import pallas as pl

        def kernel(x_ref, o_ref):
            o_ref[...] = jnp.cumsum(x_ref[...], axis=1)

        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    with pytest.raises(TpuRuleViolation) as error:
        check_kernel(cumsum, x, chip="v5e")
    assert error.value.rule == compile_check.UNIMPLEMENTED
    monkeypatch.setattr(compile_check, "libtpu_version", lambda: None)
    # Without libtpu the static rules judge, and Mosaic's lowering still runs.
    with pytest.raises(TpuRuleViolation) as error:
        check_kernel(cumsum, x, chip="v5e")
    assert error.value.rule == "mosaic-lowering"
    reports = check_kernel(jax_matmul, jax.ShapeDtypeStruct((256, 256), jnp.float32),
                           jax.ShapeDtypeStruct((256, 256), jnp.float32),
                           block_shape=(128, 128), chip="v5e")
    assert reports[0].judged_by == "static rules"


PROPERTY_TEST = textwrap.dedent('''
    import json
    import os

    import jax
    import jax.numpy as jnp
    import numpy as np
    import pytest
    from hypothesis import given, settings, strategies as st
    from jax.experimental import pallas as pl

    from pytest_pallas.checks import compile_check


    def double(x):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2

        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


    @pytest.mark.pallas
    @settings(max_examples=10, database=None, deadline=None)
    @given(st.integers(0, 100), st.sampled_from([128, 256]))
    def test_property(seed, lanes):
        x = np.random.default_rng(seed).normal(size=(8, lanes)).astype(np.float32)
        # A new jit each example: JAX's own trace cache does not spare a compile.
        np.testing.assert_allclose(jax.jit(lambda v: double(v))(x), 2 * x)


    def test_zz_stats():
        stats = compile_check.STATS
        with open(os.environ["STATS_PATH"], "w") as handle:
            json.dump({"compiles": stats.compiles, "cached": stats.cached}, handle)
''')


def test_a_property_compiles_each_distinct_kernel_once(run_pytest, pytester, tmp_path,
                                                       monkeypatch):
    stats = tmp_path / "stats.json"
    monkeypatch.setenv("STATS_PATH", str(stats))
    pytester.makepyfile(test_property=PROPERTY_TEST)
    result = run_pytest("--pallas-compile=v5e", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    counts = json.loads(stats.read_text())
    # Two distinct shapes, ten examples (each traced anew): two compiles.
    assert counts["compiles"] == 2, counts
    assert counts["cached"] >= 8, counts


def _hide_libtpu(pytester, monkeypatch):
    shadow = pytester.mkdir("no_libtpu")
    (shadow / "libtpu").mkdir()
    (shadow / "libtpu" / "__init__.py").write_text(
        "raise ImportError('libtpu hidden by the test')\n")
    monkeypatch.setenv("PYTHONPATH", str(shadow))


def test_without_libtpu_the_header_says_off_and_the_static_rules_judge(
        run_pytest, pytester, monkeypatch):
    _hide_libtpu(pytester, monkeypatch)
    pytester.makepyfile(test_rejected=REJECTED_KERNELS)
    result = run_pytest("--pallas-chip=v5e", "-k", "cumsum or sort")
    result.assert_outcomes(passed=2)  # only the compiler knows these are not TPU kernels
    assert ("; TPU compiler check off: libtpu is not installed; "
            "pip install 'pytest-pallas[tpu]'") in result.stdout.str()


def test_without_libtpu_asking_for_the_compiler_is_a_usage_error(run_pytest, pytester,
                                                                  monkeypatch):
    _hide_libtpu(pytester, monkeypatch)
    pytester.makepyfile(test_rejected=REJECTED_KERNELS)
    result = run_pytest("--pallas-compile=v5e")
    assert result.ret == 4
    assert "--pallas-compile=v5e needs the TPU compiler, libtpu, which is not installed" in (
        result.stderr.str())


@pytest.mark.parametrize("value, message", [
    ("v9", "'v9' is not a chip the compile check supports"),
    ("v5e,8i", "'8i' is not a chip the compile check supports"),
    ("v2", "'v2' is not a chip the compile check supports"),
    (",", "names no chip"),
])
def test_a_bad_chip_is_a_one_line_usage_error(run_pytest, pytester, value, message):
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = run_pytest(f"--pallas-compile={value}")
    assert result.ret == 4
    errors = [line for line in result.stderr.lines if "ERROR" in line]
    assert len(errors) == 1 and message in errors[0], result.stderr.str()


def test_the_default_is_the_runs_chip_and_none_turns_it_off(run_pytest, pytester):
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = run_pytest("--pallas-chip=v6e")
    assert "; TPU compiler check for v6e (libtpu" in result.stdout.str()
    result = run_pytest("--pallas-chip=v6e", "--pallas-compile=none")
    assert "TPU compiler check off (--pallas-compile=none)" in result.stdout.str()


def test_all_means_every_chip_the_compiler_knows():
    assert options.parse_compile_flag("all", chips=("v5e",), tpu=False, libtpu="x") == (
        options.COMPILER_CHIPS)
    assert options.parse_compile_flag("tpu7x,v5e", chips=("v5e",), tpu=False, libtpu="x") == (
        "7x", "v5e")
    assert set(options.COMPILER_CHIPS) == set(compile_check.COMPILER_CHIPS)


@pytest.mark.parametrize("chip", options.COMPILER_CHIPS)
def test_every_chip_the_compiler_knows_has_a_topology(chip):
    devices = compile_check.topology_devices(chip, 8)
    assert len(devices) >= 8


def test_classification_reads_the_compilers_vmem_numbers():
    rule, size, limit = compile_check.classify_rejection(
        "RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom: ... Scoped allocation with size "
        "28.00M and limit 16.00M exceeded scoped vmem limit by 12.00M.")
    assert (rule, size, limit) == (compile_check.VMEM, 28 * 2**20, 16 * 2**20)


def _whole_copy(x):
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


@pytest.mark.parametrize("rows, fits", [(1024, True), (1536, False)])
def test_a_whole_array_call_without_a_grid_is_single_buffered_as_the_compiler_says(rows, fits):
    # In and out of (1024, 2048) float32: 8 MiB each, 16 MiB in all, at v5e's default
    # limit; double-buffered (the static rule's old count) it would be 32 MiB.
    x = jax.ShapeDtypeStruct((rows, 2048), jnp.float32)
    verdicts = {}
    for use_compiler in (False, True):
        try:
            check_kernel(_whole_copy, x, chip="v5e", use_compiler=use_compiler)
            verdicts[use_compiler] = True
        except TpuRuleViolation:
            verdicts[use_compiler] = False
    assert verdicts == {False: fits, True: fits}


def test_the_report_records_per_op_and_chip_whether_it_compiled():
    from pytest_pallas.suite.report import ConformanceRecorder

    worker = ConformanceRecorder()
    worker.register("matmul", "mine", {}, "none")
    worker.compiled("matmul", compile_check.CompileVerdict("v5e", "'k'", True))
    worker.compiled("matmul", compile_check.CompileVerdict(
        "v6e", "'k'", False, compile_check.VMEM, "Scoped allocation ...", 1.0,
        40 * 2**20, 32 * 2**20))
    controller = ConformanceRecorder()
    controller.merge(worker.take())  # as a pytest-xdist worker's records arrive
    document = controller.document(complete=True, environment={})
    compiled = document["ops"]["matmul"]["compile"]
    assert compiled["v5e"]["compiled"] is True
    assert compiled["v6e"]["compiled"] is False
    assert compiled["v6e"]["vmem_bytes"] == 40 * 2**20
    assert compiled["v6e"]["first_rejection"].startswith("[compiler-vmem]")
    assert "v5e,v6e:NO" in "\n".join(controller.summary_lines())


# --- the JAX internals the check relies on (pytest_pallas._compat.jax_internals) ----------------


def _kernel_params(function, *args):
    from pytest_pallas.checks import jaxpr_analysis

    closed = jax.make_jaxpr(function)(*args)
    return list(jaxpr_analysis.pallas_call_equations_in(closed))


def test_a_kernel_traced_again_has_the_same_fingerprint_and_another_shape_another():
    from pytest_pallas.checks import jaxpr_analysis

    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    first = _kernel_params(lambda v: _whole_copy(v), x)[0][0]
    again = _kernel_params(lambda v: _whole_copy(v), x)[0][0]
    other = _kernel_params(lambda v: _whole_copy(v), jax.ShapeDtypeStruct((16, 128), jnp.float32))
    assert first is not again
    assert jaxpr_analysis.pallas_call_fingerprint(first) == jaxpr_analysis.pallas_call_fingerprint(
        again
    )
    assert jaxpr_analysis.pallas_call_fingerprint(first) != jaxpr_analysis.pallas_call_fingerprint(
        other[0][0])


def test_equations_carry_avals_and_the_shard_map_mesh_of_a_communicating_kernel():
    import functools

    import numpy as np
    from jax.sharding import Mesh, PartitionSpec

    from pytest_pallas.checks import jaxpr_analysis
    from pytest_pallas.reference_kernels.collectives import ppermute

    if len(jax.devices()) < 2:
        pytest.skip("needs 2 CPU devices")
    mesh = Mesh(np.array(jax.devices()[:2]), ("ring",))
    sharded = jax.shard_map(functools.partial(ppermute, axis_name="ring", shift=1), mesh=mesh,
                            in_specs=PartitionSpec("ring"), out_specs=PartitionSpec("ring"),
                            check_vma=False)
    ((params, avals, axes),) = _kernel_params(sharded, jax.ShapeDtypeStruct((16, 128),
                                                                              jnp.float32))
    assert axes == (("ring", 2),)
    assert any(tuple(a.shape) == (8, 128) for a in avals)  # per device
    assert jaxpr_analysis.pallas_call_communicates(params)
    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    assert not jaxpr_analysis.pallas_call_communicates(_kernel_params(_whole_copy, x)[0][0])
    verdict = compile_check.verdict_for(params, avals, "v5e", axes)
    assert verdict.compiled, verdict.message


def test_observers_with_avals_see_each_call_and_compiles_step_out_of_the_trace():
    from pytest_pallas._compat import jax_internals, pallas_call_hooks

    seen = []
    with pallas_call_hooks.observe_pallas_calls(lambda params, avals: seen.append(avals),
                                          with_avals=True):
        jax.make_jaxpr(lambda v: _whole_copy(v))(jax.ShapeDtypeStruct((40, 128), jnp.float32))
    assert [tuple(a.shape) for a in seen[0]] == [(40, 128)]

    def traced(x):
        with jax_internals.outside_current_trace():
            # A computation of its own, inside another function's trace.
            assert int(jax.jit(lambda: jnp.int32(3))()) == 3
        return x

    jax.make_jaxpr(traced)(1.0)


def test_a_kernel_without_operands_is_compiled_for_the_chip():
    # Nothing to take a device from: its outputs are placed on the chip's device too.
    from jax.experimental import pallas as pl

    def fill(o_ref):
        o_ref[...] = jnp.full(o_ref.shape, 3.0, o_ref.dtype)

    def call():
        return pl.pallas_call(fill, out_shape=jax.ShapeDtypeStruct((4096,), jnp.float32),
                              out_specs=pl.BlockSpec((2048,), lambda i: i), grid=2)()

    reports = check_kernel(call, chip="v5e")
    assert reports[0].compile_verdict.compiled, reports[0].compile_verdict.message


def test_a_rejection_is_the_error_jax_raises_on_the_chip():
    # A test written for the chip expects MosaicError or JaxRuntimeError for a kernel the
    # compiler rejects; the plugin's own type and its one-line reason stay.
    from jax._src.pallas.mosaic.error_handling import MosaicError
    from jax.experimental import pallas as pl

    def scalar_divide(x_ref, o_ref):
        o_ref[0] = x_ref[1] // x_ref[2]

    def call(x):
        return pl.pallas_call(scalar_divide, in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
                              out_specs=pl.BlockSpec(memory_space=pltpu.SMEM),
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    with pytest.raises(TpuRuleViolation) as raised:
        check_kernel(call, jax.ShapeDtypeStruct((3,), jnp.int8), chip="v5e")
    assert isinstance(raised.value, MosaicError)
    assert isinstance(raised.value, jax.errors.JaxRuntimeError)
    assert "Only i1 and i32 scalars are supported" in str(raised.value) or (
        "Only i32" in str(raised.value))
    assert str(raised.value).startswith("TPU rule [compiler-")


def test_a_kernel_over_its_vmem_is_rejected_as_on_the_chip_whatever_else_it_breaks():
    # JAX's test_vmem_oom_error_message_basics: blocks over the chip's VMEM and an index map
    # returning element offsets. The chip's compiler stops it first (JaxRuntimeError); the
    # out-of-bounds blocks it would have read are named too.
    from pytest_pallas.checks.static_rules import OUT_OF_BOUNDS
    from pytest_pallas.checks.violations import Violation, rule_violation
    from pytest_pallas.checks.vmem_footprint import VMEM

    over = Violation(VMEM, "kernel", "input 0", "needs 256 MiB of VMEM", "shrink the blocks")
    outside = Violation(OUT_OF_BOUNDS, "kernel", "input 0", "block (0, 8192) is outside",
                        "return block indices")
    both = rule_violation([over, outside])
    assert isinstance(both, jax.errors.JaxRuntimeError)
    assert "256 MiB" in str(both) and "(0, 8192)" in str(both)
    assert not isinstance(rule_violation([outside]), jax.errors.JaxRuntimeError)


def test_a_kernel_mosaic_s_lowering_refuses_raises_what_the_lowering_raises():
    # JAX's test_unsigned_dtype_dot_raises expects NotImplementedError from Mosaic's lowering
    # for an unsigned matmul: the compile check's rejection is one too.
    from jax.experimental import pallas as pl

    def unsigned_matmul(lhs, rhs):
        def kernel(lhs_ref, rhs_ref, o_ref):
            o_ref[...] = lhs_ref[...] @ rhs_ref[...]
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((32, 128), jnp.uint8))(
            lhs, rhs)

    with pytest.raises(NotImplementedError, match="Unsigned integer dtype.*dot_general.*matmul"
                       ) as raised:
        check_kernel(unsigned_matmul, jax.ShapeDtypeStruct((32, 256), jnp.uint8),
                     jax.ShapeDtypeStruct((256, 128), jnp.uint8), chip="v5e")
    assert isinstance(raised.value, TpuRuleViolation)
    assert isinstance(raised.value, jax.errors.JaxRuntimeError)


def _window_of(index_map, grid):
    from jax.experimental import pallas as pl

    def body(*_):
        pass

    mib = 10  # one window fits v5e's 16 MiB default, two do not
    return pl.pallas_call(
        body, grid=grid, out_shape=jax.ShapeDtypeStruct((100 * 2 ** 20,), jnp.int8),
        out_specs=pl.BlockSpec((mib * 2 ** 20,), index_map))


@pytest.mark.parametrize("grid, index_map, fits", [
    ((4, 1), lambda i, j: (j,), True),      # the block index only moves on a 1-sized axis
    ((1, 4), lambda i, j: (i,), True),
    ((4, 1), lambda i, j: (j + i,), False),  # four windows: double-buffered, over the limit
])
def test_a_block_the_grid_never_moves_is_single_buffered_as_the_compiler_says(
        grid, index_map, fits):
    # JAX's test_automatic_single_buffering: the static rule counted two 10 MiB buffers and
    # rejected what the compiler compiles.
    verdicts = {}
    for use_compiler in (False, True):
        try:
            check_kernel(_window_of(index_map, grid), chip="v5e", use_compiler=use_compiler)
            verdicts[use_compiler] = True
        except TpuRuleViolation:
            verdicts[use_compiler] = False
    assert verdicts == {False: fits, True: fits}


# A test that sets a mesh of its own CPU devices (jax.set_mesh) around a shard_map'd kernel:
# the compile for the chip's devices ran under it and failed ("Received incompatible
# devices for jitted computation"), a rejection the kernel did not earn.
SET_MESH = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.sharding import PartitionSpec as P

    @pytest.mark.pallas
    @pytest.mark.devices(2)
    def test_kernel_under_the_tests_own_mesh():
        mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1
        with jax.set_mesh(mesh):
            x = jnp.zeros((16, 128), jnp.float32, out_sharding=P("x"))
            @jax.jit
            @jax.shard_map(mesh=mesh, in_specs=P("x"), out_specs=P("x"))
            def inner(x):
                return pl.pallas_call(kernel, out_shape=jax.typeof(x))(x)
            np.testing.assert_array_equal(inner(x), np.ones((16, 128), np.float32))
''')


def test_a_kernel_under_the_tests_own_mesh_is_compiled_for_the_chip(run_pytest, pytester):
    pytester.makepyfile(test_set_mesh=SET_MESH)
    result = run_pytest("--pallas-interpret=tpu", "-p", "no:xdist")
    result.assert_outcomes(passed=1)
    assert "1 kernel compiles" in result.stdout.str()


# JAX's test_vmem_oom_error_message_basics, cut down: blocks over v5e's 16 MiB of scoped VMEM,
# and an index map returning element offsets, which the kernel would read out of bounds.
OVER_ITS_VMEM = textwrap.dedent('''
    import jax, jax.numpy as jnp, pytest
    from jax.experimental import pallas as pl

    def test_over_its_vmem():
        block = (2048, 8192)
        shape = (2 * block[0], 2 * block[1])
        spec = pl.BlockSpec(block, lambda i, j: (i * block[0], j * block[1]))
        x = jnp.zeros(shape, jnp.float32)
        with pytest.raises(jax.errors.JaxRuntimeError) as raised:
            pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                           out_shape=jax.typeof(x), grid=(2, 2), in_specs=[spec],
                           out_specs=spec)(x)
        print("RAISED", str(raised.value))
''')


def test_at_run_time_the_compiler_judges_vmem_in_its_own_words(run_pytest, pytester):
    # Where the compile check compiles for the stand-in chip, a kernel over its VMEM meets the
    # compiler's rejection first, whole, as on the chip (where it never runs); the rule it
    # would break at run time is named after it.
    pytester.makepyfile(test_vmem=OVER_ITS_VMEM)
    result = run_pytest("--pallas-interpret=tpu", "-p", "no:xdist", "-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*RAISED TPU rule ?compiler-vmem? broken by kernel * rejects it for v5e*",
        "The compiler's whole message:",
        "*window allocation for operator input 0*",
    ])
    assert "TPU rule [block-out-of-bounds]" in result.stdout.str()
    # Without the compiler, the static rule judges, in its words and the same exception type.
    result = run_pytest("--pallas-interpret=tpu", "--pallas-compile=none", "-p", "no:xdist",
                        "-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*RAISED TPU rule ?vmem*"])
    assert "The compiler's whole message" not in result.stdout.str()


def _dma_from_a_nested_selection(x, y):
    # JAX's test_select_ref_nested: a DMA from pl.select_ref over refs that are selections
    # themselves, which JAX 0.10's jaxpr printer cannot print (a TypeError).
    from jax.experimental import pallas as pl

    def kernel(x_ref, y_ref, o_ref):
        def body(sem):
            @pl.loop(0, 2)
            def _(i):
                nested = (pl.select_ref(0, r.at[:, :128], r.at[:, 128:]) for r in (x_ref, y_ref))
                source = pl.select_ref(i, *nested).reshape(8, 128)
                pltpu.async_copy(source, o_ref.at[pl.ds(8 * i, 8)], sem.at[0]).wait()
        pl.run_scoped(body, pltpu.SemaphoreType.DMA(1))

    hbm = pl.BlockSpec(memory_space=pltpu.HBM)
    return pl.pallas_call(kernel, in_specs=[hbm, hbm], out_specs=hbm,
                          out_shape=jax.ShapeDtypeStruct((16, 128), jnp.int32))(x, y)


def test_a_kernel_jax_cannot_print_still_has_a_fingerprint():
    from pytest_pallas.checks import jaxpr_analysis

    x = jax.ShapeDtypeStruct((8, 256), jnp.int32)
    first = _kernel_params(lambda a, b: _dma_from_a_nested_selection(a, b), x, x)[0][0]
    again = _kernel_params(lambda a, b: _dma_from_a_nested_selection(a, b), x, x)[0][0]
    assert first is not again
    assert jaxpr_analysis.pallas_call_fingerprint(first) == jaxpr_analysis.pallas_call_fingerprint(
        again)
    other = _kernel_params(lambda a, b: _dma_from_a_nested_selection(a, b), *[jax.ShapeDtypeStruct(
        (8, 256), jnp.float32)] * 2)[0][0]
    assert jaxpr_analysis.pallas_call_fingerprint(first) != jaxpr_analysis.pallas_call_fingerprint(
        other)


def test_an_exception_of_the_test_s_own_during_a_compile_is_no_verdict(monkeypatch):
    # A test's own time limit (an alarm's exception) fired while libtpu compiled: it was
    # taken for the compiler's rejection, and cached.
    class TestsOwnTimeLimit(Exception):
        pass

    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    params, avals, _ = _kernel_params(lambda v: _whole_copy(v), x)[0]

    def fires(*_):
        raise TestsOwnTimeLimit("ran past 60 s")

    monkeypatch.setattr(compile_check, "_compile", fires)
    with pytest.raises(TestsOwnTimeLimit):
        compile_check.compile_pallas_call(params, avals, "v5e")

    def rejects(*_):
        raise ValueError("Mosaic rejects it")

    monkeypatch.setattr(compile_check, "_compile", rejects)
    verdict = compile_check.compile_pallas_call(params, avals, "v5e")
    assert not verdict.compiled and "Mosaic rejects it" in verdict.message


def test_a_kernel_with_an_operand_of_a_hijax_type_is_not_compiled_alone():
    # Lowered to several arrays, it is not the kernel its program compiles (JAX's
    # test_emit_pipeline_hijax: "Cannot infer the memory space of main's argument 3").
    class PairOfArrays:
        is_high = True
        shape, dtype = (8, 128), jnp.float32

    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    params, _, _ = _kernel_params(lambda v: _whole_copy(v), x)[0]
    assert compile_check.verdict_if_judged(params, (PairOfArrays(),), "v5e") is None


# JAX's test_automatic_single_buffering, cut down: a 10 MiB output window that moves needs
# twice that, over v5e's 16 MiB of scoped VMEM; single-buffered (pl.Buffered(1)) it fits.
SINGLE_BUFFERED_AFTER_DOUBLE = textwrap.dedent('''
    import jax, jax.numpy as jnp, pytest
    from jax.experimental import pallas as pl

    def test_single_buffering_fits_where_double_did_not():
        window = 10 * 2**20
        def call(mode):
            return pl.pallas_call(
                lambda o_ref: None, grid=(4, 1),
                out_shape=jax.ShapeDtypeStruct((4 * window,), jnp.int8),
                out_specs=pl.BlockSpec((window,), lambda i, j: (j + i,), pipeline_mode=mode))
        with pytest.raises(jax.errors.JaxRuntimeError, match="compiler-vmem"):
            jax.jit(call(None)).lower().compile()
        jax.jit(call(pl.Buffered(1))).lower().compile()
''')


def test_a_kernel_differing_in_its_pipeline_mode_alone_is_compiled_again(run_pytest, pytester):
    # The compile check's cache took the single-buffered kernel for the double-buffered one
    # it had judged (a block mapping's repr names its shape only) and rejected it.
    pytester.makepyfile(test_single_buffering=SINGLE_BUFFERED_AFTER_DOUBLE)
    result = run_pytest("--pallas-interpret=tpu", "-p", "no:xdist")
    result.assert_outcomes(passed=1)
    assert "2 kernel compiles" in result.stdout.str()
