"""``--pallas-judge`` (contract §8): implementations that game a checker fail with their
reason, honest kernels pass, and the findings reach the summary and the report without it."""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import judge_battery as battery
import numpy as np
import pytest
from jax.experimental import pallas as pl

from pytest_pallas.checks import honesty
from pytest_pallas.ops.domains import Domain
from pytest_pallas.ops.inputs import make_case, sweep_case
from pytest_pallas.ops.registry import OPERATIONS
from pytest_pallas.suite import judge

BATTERY_SOURCE = (pathlib.Path(__file__).parent / "judge_battery.py").read_text()


def _case(op: str, index: int = 1):
    return sweep_case(OPERATIONS[op], Domain(), index)


def _verdict(function, *shapes, work=None):
    avals = [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in shapes]
    closed = jax.make_jaxpr(function)(*avals)
    elements = sum(int(np.prod(shape)) for shape in shapes)
    return honesty.judge_program(closed, work=work if work is not None else 0.0,
                                 elements=elements)


def _checks(verdict) -> list[str]:
    return [finding.check for finding in verdict.findings]


# --- where the arithmetic runs (checks/honesty.py) -----------------------------------------

@pytest.mark.parametrize("name", ["no_kernel_matmul", "copies_xla_matmul", "host_matmul",
                                  "no_kernel_softmax", "copies_xla_softmax"])
def test_program_checks_name_each_cheat(name):
    op, reason = battery.CHEATS[name]
    verdict = judge.program_verdict(getattr(battery, name), _case(op))
    lines = [finding.line() for finding in verdict.findings]
    assert any(line.startswith(reason) for line in lines), lines
    assert all("\n" not in line for line in lines)


@pytest.mark.parametrize("name", sorted(battery.HONEST))
def test_honest_kernels_with_layout_work_have_no_program_finding(name):
    verdict = judge.program_verdict(getattr(battery, name), _case(battery.HONEST[name]))
    assert verdict.findings == () and verdict.share_in_kernels == 1.0


@pytest.mark.parametrize("op", sorted(OPERATIONS))
def test_the_reference_kernels_raise_no_program_finding_on_any_sweep_case(op):
    operation = OPERATIONS[op]
    cases = [sweep_case(operation, Domain(), index) for index in range(12)]
    if operation.collective:  # the smallest blocks: the device ids' arithmetic is all there is
        cases.append(make_case(operation, {"devices": 2, "rows": 1, "cols": 8}, "int32"
                               if "int32" in operation.dtypes else "float32", "normal", 0,
                               {name: values[0] for name, values in operation.params.items()}))
    for case in filter(None, cases):
        verdict = judge.program_verdict(operation.load_reference(), case, compare_traces=False)
        assert verdict.findings == (), (case, [finding.line() for finding in verdict.findings])


def _pallas_scale(x):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def test_outside_products_are_counted_through_nested_transformations():
    def matmul_outside(x, y):
        return _pallas_scale(x @ y)

    @jax.custom_vjp
    def custom(x, y):
        return matmul_outside(x, y)

    custom.defvjp(lambda x, y: (custom(x, y), None), lambda _, g: (g, g))
    work = 2.0 * 64 * 128 * 256
    wrappers = {
        "jit": jax.jit(matmul_outside),
        "custom_vjp": custom,
        "vmap": lambda x, y: jax.vmap(matmul_outside, in_axes=(None, None), axis_size=1)(x, y)[0],
        "nested jit": jax.jit(lambda x, y: jax.jit(matmul_outside)(x, y)),
        "cond": lambda x, y: jax.lax.cond(True, matmul_outside, matmul_outside, x, y),
    }
    for name, wrapped in wrappers.items():
        verdict = _verdict(wrapped, (64, 128), (128, 256), work=work)
        assert _checks(verdict) == ["outside-kernels"], name
        assert verdict.share_in_kernels == 0.0, name


def test_scan_bodies_count_their_length_and_shard_map_its_devices():
    def step(carry, _):
        return carry + jnp.sum(carry), None

    def scanned(x):
        return _pallas_scale(jax.lax.scan(step, x, None, length=10)[0])

    once = _verdict(lambda x: _pallas_scale(step(x, None)[0]), (128, 128), work=1e9)
    ten = _verdict(scanned, (128, 128), work=1e9)
    assert ten.outside_flops == pytest.approx(10 * once.outside_flops)

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("d",))
    spec = jax.sharding.PartitionSpec("d")
    sharded = jax.shard_map(lambda x: _pallas_scale(jnp.exp(x)), mesh=mesh, in_specs=spec,
                            out_specs=spec, check_vma=False)
    verdict = _verdict(sharded, (256, 128), work=0.0)
    assert verdict.outside_flops == 256 * 128  # 2 devices of (128, 128) exps


def test_layout_work_and_index_arithmetic_are_free():
    def layout(x):
        y = jnp.pad(x, ((0, 8), (0, 0)))[:-8].reshape(64, 256).T.astype(jnp.bfloat16)
        y = jnp.concatenate([y, y]).astype(jnp.float32)[:256]
        order = jnp.arange(128) * 2 % 128  # integer index arithmetic
        return _pallas_scale(jnp.take(y, order, axis=1))

    verdict = _verdict(layout, (128, 128), work=128 * 128)
    assert verdict.findings == () and verdict.outside_flops == 0


def test_host_callbacks_are_found_and_a_debug_print_is_not_one():
    def with_io_callback(x):
        jax.experimental.io_callback(lambda v: None, None, x)
        return _pallas_scale(x)

    def with_print(x):
        jax.debug.print("x {}", x[0, 0])
        return _pallas_scale(x)

    def with_debug_callback(x):
        jax.debug.callback(lambda v: None, x)
        return _pallas_scale(x)

    assert _checks(_verdict(with_io_callback, (8, 128))) == ["host-callback"]
    assert _checks(_verdict(with_debug_callback, (8, 128))) == ["host-callback"]
    assert _verdict(with_print, (8, 128)).findings == ()


def test_a_callback_inside_a_kernel_is_found():
    def kernel(x_ref, o_ref):
        value = jax.pure_callback(lambda v: np.asarray(v) * 2,
                                  jax.ShapeDtypeStruct(x_ref.shape, x_ref.dtype), x_ref[...])
        o_ref[...] = value

    def implementation(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    verdict = _verdict(implementation, (8, 128))
    assert _checks(verdict) == ["host-callback"]
    assert "inside a kernel" in verdict.findings[0].message


# --- no state can fake a verdict (suite/judge.py) --------------------------------------------

def test_the_state_probe_shows_a_call_counter_and_a_shape_cache():
    battery._calls[0] = 0
    battery._by_shape.clear()
    case = _case("matmul")
    for name in ("first_calls_matmul", "shape_cached_matmul"):
        function = getattr(battery, name)
        judge.program_verdict(function, case)  # the first trace, as the suite makes it
        assert [f.check for f in judge.state_findings(function, case)] == ["state"], name
    assert judge.state_findings(battery.reference_matmul, case) == []
    assert judge.state_findings(battery.padded_matmul, case) == []


@pytest.mark.pallas
def test_input_impact_needs_the_result_to_follow_an_input_that_matters():
    case = _case("matmul")
    honest = np.asarray(battery.reference_matmul(*case.args))
    ignores_y = lambda changed: battery.reference_matmul(changed.args[0], case.args[1])  # noqa: E731
    findings = judge.input_impact_findings(ignores_y, case, honest, matmul_precision="float32")
    assert [f.check for f in findings] == ["input-impact"]
    assert "argument 1" in findings[0].message
    follows = lambda changed: battery.reference_matmul(*changed.args)  # noqa: E731
    assert judge.input_impact_findings(follows, case, honest, matmul_precision="float32") == []


# --- the battery through the plugin ------------------------------------------------------------

def _battery_tests(names) -> str:
    lines = ["import judge_battery as b",
             "from pytest_pallas import conformance_tests, operations", ""]
    for name in names:
        op = battery.CHEATS[name][0] if name in battery.CHEATS else battery.HONEST[name]
        lines.append(f"Test_{name} = conformance_tests(operations.{op}, b.{name}, "
                     f"label={name!r}, examples=2)")
    return "\n".join(lines) + "\n"


def _run_battery(pytester, names, *flags):
    pytester.makepyfile(judge_battery=BATTERY_SOURCE, test_battery=_battery_tests(names))
    pytester.syspathinsert()
    report = pytester.path / "verdict.json"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:xdist", "--pallas-seed=0", "-k", "test_value",
        "--pallas-compile=none", f"--pallas-report={report}", *flags)
    return result, json.loads(report.read_text())


def test_every_cheat_fails_under_judge_with_its_reason_and_honest_kernels_pass(pytester):
    names = [*battery.CHEATS, *battery.HONEST]
    result, verdict = _run_battery(pytester, names, "--pallas-judge")
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == len(battery.CHEATS), result.stdout.str()
    assert outcomes["passed"] == len(battery.HONEST)
    output = result.stdout.str()
    rows = {row["implementation"]: row for row in verdict["ops"].values()}
    for name, (_, reason) in battery.CHEATS.items():
        assert f"FAILED test_battery.py::Test_{name}::test_value" in output
        failures = [result["first_failure"] for result in rows[name]["properties"].values()
                    if result["verdict"] == "fail"]
        assert any(reason in failure and "\n" not in failure for failure in failures), (
            name, failures)
    for name in battery.HONEST:
        assert rows[name]["judge"]["findings"] == []
        assert rows[name]["judge"]["share_of_flops_in_kernels"] == 1.0
    assert rows["no_kernel_matmul"]["judge"]["pallas_calls"] == 0
    assert rows["host_matmul"]["judge"]["host_callbacks"]


def test_under_judge_every_test_of_a_cheat_fails(pytester):
    pytester.makepyfile(judge_battery=BATTERY_SOURCE,
                        test_battery=_battery_tests(["no_kernel_softmax"]))
    pytester.syspathinsert()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist",
                                           "--pallas-seed=0", "--pallas-compile=none",
                                           "--pallas-judge")
    result.assert_outcomes(failed=3)  # value, written and deterministic, vmap
    assert result.stdout.str().count("[softmax: judge] [judge: no-kernel]") >= 3


def test_without_judge_findings_are_reported_not_failed(pytester):
    result, verdict = _run_battery(pytester, ["no_kernel_matmul", "copies_xla_softmax",
                                              "reference_matmul"])
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*judge*", "matmul *no_kernel_matmul *in kernels: 0%, 2 findings*",
                                 "*copies_xla_softmax *in kernels: 0%, 1 finding *",
                                 "*reference_matmul *in kernels: 100% *"])
    rows = {row["implementation"]: row["judge"] for row in verdict["ops"].values()}
    assert rows["no_kernel_matmul"]["share_of_flops_in_kernels"] == 0.0
    assert [line.partition("]")[0] for line in rows["no_kernel_matmul"]["findings"]] == [
        "[judge: no-kernel", "[judge: outside-kernels"]
    assert rows["reference_matmul"]["findings"] == []


# --- no speed claim can be faked (bench/fixture.py) -------------------------------------------

def test_a_time_below_the_roofline_is_a_finding_not_a_record():
    finding = honesty.faster_than_roofline(1e-6, 1e-9)
    assert finding.check == "faster-than-roofline" and "\n" not in finding.line()
    assert honesty.faster_than_roofline(1e-6, 2e-6) is None
    assert honesty.faster_than_roofline(None, 0.0) is None  # no cost model: no roofline


CLOCK_BENCHMARKS = '''
import itertools

import jax.numpy as jnp
import pytest

from pytest_pallas.reference_kernels.matmul import matmul

_ticks = itertools.count()


def frozen_clock():
    """A patched timer: a nanosecond per reading, whatever ran in between."""
    return next(_ticks) * 1e-9


def test_honest_clock(pallas_benchmark):
    x = pallas_benchmark.random((512, 512))
    pallas_benchmark("matmul", matmul, x, x, xla_fn=None)


@pytest.mark.benchmark(timer=frozen_clock, max_time=1e-8)
def test_patched_clock(pallas_benchmark):
    x = pallas_benchmark.random((512, 512))
    pallas_benchmark("matmul", matmul, x, x, xla_fn=None)
'''


@pytest.mark.parametrize("judged", [False, True])
def test_a_patched_clock_fails_under_judge_and_is_recorded_without(pytester, judged,
                                                                   outside_xdist):
    pytester.makepyfile(test_clock=CLOCK_BENCHMARKS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:xdist", "--benchmark-json=bench.json",
        "--benchmark-min-rounds=2", "--benchmark-max-time=0.01", "--pallas-compile=none",
        *(["--pallas-judge"] if judged else []), timeout=300)
    entries = {entry["name"]: entry["extra_info"]
               for entry in json.loads((pytester.path / "bench.json").read_text())["benchmarks"]}
    assert entries["test_honest_clock"]["judge_findings"] == []
    [line] = entries["test_patched_clock"]["judge_findings"]
    assert line.startswith("[judge: faster-than-roofline] measured ")
    if judged:
        result.assert_outcomes(passed=1, failed=1)
        result.stdout.fnmatch_lines(["matmul: ?judge: faster-than-roofline? measured * per call*"])
    else:
        result.assert_outcomes(passed=2)


# --- the docs page's harness loop, run as it is written ------------------------------------------

def test_the_grading_pages_harness_loop_accepts_the_kernel_and_refuses_xla(tmp_path):
    import re
    import subprocess
    import sys

    page = (pathlib.Path(__file__).parents[1] / "docs" / "grading.md").read_text()
    [block] = [body for body in re.findall(r"^```python\n(.*?)^```", page, re.S | re.M)
               if body.startswith("# grade.py")]
    (tmp_path / "grade.py").write_text(block)
    run = subprocess.run([sys.executable, "grade.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    verdicts = {line["candidate"]: line for line in map(json.loads, run.stdout.splitlines())}
    assert verdicts["pallas"]["accepted"] and verdicts["pallas"]["findings"] == []
    assert verdicts["pallas"]["in_kernels"] == 1.0
    xla = verdicts["xla"]
    assert not xla["accepted"] and xla["in_kernels"] == 0.0
    assert [line.partition("]")[0] for line in xla["findings"]] == [
        "[judge: no-kernel", "[judge: outside-kernels"]
    assert xla["first_failure"][0].startswith("[judge: no-kernel]")


def test_a_jax_whose_programs_the_judge_cannot_read_fails_under_judge_only(pytester):
    pytester.makeconftest('''
import pytest_pallas.checks.honesty as honesty

def _moved(*args, **kwargs):
    raise AttributeError("'JaxprEqn' object has no attribute 'eqns'")

honesty.judge_program = _moved
''')
    pytester.makepyfile(judge_battery=BATTERY_SOURCE,
                        test_battery=_battery_tests(["reference_matmul"]))
    pytester.syspathinsert()
    args = ("-p", "no:cacheprovider", "-p", "no:xdist", "--pallas-seed=0", "-k", "test_value",
            "--pallas-compile=none")
    lenient = pytester.runpytest_subprocess(*args)
    lenient.assert_outcomes(passed=1, warnings=1)
    lenient.stdout.fnmatch_lines(["*the judge's reading of traced programs (--pallas-judge) "
                                  "is off on this JAX*"])
    strict = pytester.runpytest_subprocess(*args, "--pallas-judge")
    strict.assert_outcomes(failed=1, warnings=1)
    strict.stdout.fnmatch_lines(["*matmul: judge? the judge's reading of traced programs "
                                 "(--pallas-judge) is off on this JAX: AttributeError*"])


def test_a_kernel_built_with_pl_kernel_or_core_map_counts_as_a_kernel():
    # pl.kernel binds a core_map equation (mpmd_map on jax 0.10), as pl.core_map does.
    from pytest_pallas.tpu import tensorcore_mesh

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + jnp.exp(x_ref[...])

    def with_pl_kernel(x):
        mesh = tensorcore_mesh("core", 1)
        return pl.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=mesh)(x)

    verdict = _verdict(with_pl_kernel, (8, 128), work=3 * 8 * 128)
    assert verdict.kernels == 1 and verdict.findings == ()
