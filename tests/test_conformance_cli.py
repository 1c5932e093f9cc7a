"""The conformance suite from a user's seat: flags, mistakes, broken kernels, reports, xdist."""

import json
import re
import shlex
import textwrap

import pytest

USER_KERNELS = textwrap.dedent(
    """
    import jax.numpy as jnp
    import numpy as np
    from pytest_pallas import supports

    def add(x, y):
        return x + y

    def add_raises(x, y):
        raise ValueError("my kernel is not finished")

    def add_numpy(x, y):
        return np.asarray(x) + np.asarray(y)

    def add_tuple(x, y):
        return (x + y,)

    def add_wrong_dtype(x, y):
        return (x + y).astype(jnp.float16)

    def add_wrong_shape(x, y):
        return jnp.concatenate([(x + y).ravel(), jnp.zeros(1, x.dtype)])

    def _fails_when_run(x):
        raise ValueError("my kernel failed at run time")

    def add_raises_at_run_time(x, y):
        # Traces fine; raises only when the compiled computation runs.
        return jax.pure_callback(_fails_when_run, jax.ShapeDtypeStruct(x.shape, x.dtype), x + y)

    def add_scalar(x, y):
        return 1.0

    @supports(dtypes=("float32",), max_size={"shape": 128})
    def add_restricted(x, y):
        assert x.dtype == jnp.float32 and max(x.shape) <= 128, (x.dtype, x.shape)
        return x + y

    def softmax(x):
        return jax.nn.softmax(x, axis=-1)

    """
).replace("import jax.numpy as jnp", "import jax\nimport jax.numpy as jnp")


@pytest.fixture
def user_module(pytester):
    pytester.makepyfile(my_kernels=USER_KERNELS)
    pytester.syspathinsert()
    return "my_kernels"


def run(pytester, *args):
    return pytester.runpytest("-p", "no:cacheprovider", "--pallas-seed=0", "--pallas-examples=4",
                              *args)


def test_user_implementation_passes_and_only_its_op_runs(pytester, user_module):
    result = run(pytester, "--pallas-impl", "add=my_kernels:add")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*pallas conformance*", "add  my_kernels:add  *"])
    outcomes = result.parseoutcomes()
    assert outcomes["passed"] == 3 and "failed" not in outcomes


def test_supports_narrows_the_domain_and_is_reported(pytester, user_module):
    report = pytester.path / "report.json"
    result = run(pytester, "--pallas-impl", "add=my_kernels:add_restricted",
                 f"--pallas-report={report}")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["add  my_kernels:add_restricted  * dtypes=float32; shape<=128"])
    document = json.loads(report.read_text())
    assert document["complete"] is True
    assert document["ops"]["add"]["restrictions"] == {
        "dtypes": ["float32"], "multiple_of": {}, "max_size": {"shape": 128}}
    value = document["ops"]["add"]["properties"]["value"]
    assert value["verdict"] == "pass" and value["examples"] >= 4
    assert 0 <= value["worst_error_in_tolerances"] <= 1
    assert document["environment"]["jax"] and document["environment"]["backend"]


@pytest.mark.parametrize("target, expected", [
    ("add_raises", "ValueError: my kernel is not finished"),
    ("add_numpy", "my_kernels:add_numpy turned a traced input into a NumPy array; the suite "
                  "calls implementations under jax.jit"),
    ("add_tuple", "add returned a tuple (Array("),
    ("add_raises_at_run_time", "ValueError: my kernel failed at run time"),
    ("add_wrong_dtype", "and dtype float16; the contract expects a jax.Array of shape"),
    ("add_wrong_shape", "add returned a jax.Array of shape ("),
    # Under jax.jit a Python scalar comes back as a 0-d array.
    ("add_scalar", "add returned a jax.Array of shape () and dtype float32; the contract "
                   "expects a jax.Array of shape"),
])
def test_broken_kernel_fails_its_property_with_a_clear_message(pytester, user_module, target,
                                                               expected):
    result = run(pytester, "--pallas-impl", f"add=my_kernels:{target}",
                 "--pallas-impl", "softmax=my_kernels:softmax")
    assert result.ret == 1
    assert expected in result.stdout.str()
    # The input that triggered it is shown, and the other op still ran and passed.
    result.stdout.fnmatch_lines(["*Draw 1 (input): Case(add: shape=*, dtype=*, values=*, seed=*"])
    result.stdout.fnmatch_lines(["softmax  my_kernels:softmax * 6 * 0 *"])
    assert "compare.py" not in result.stdout.str()


# Mistakes on the command line (--pallas-impl's among them) are in tests/test_usage_errors.py.


def test_conformance_runs_from_any_directory_without_collecting_it(pytester):
    pytester.makepyfile(test_unrelated="def test_unrelated():\n    raise AssertionError\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pallas-seed=0",
                                           "--pallas-examples=3", "--pallas-conformance",
                                           "--pallas-ops=copy", "-k", "value", timeout=300)
    assert result.ret == 0, result.stdout.str()
    assert "test_unrelated" not in result.stdout.str()


def test_interrupted_run_leaves_a_valid_incomplete_report(pytester, user_module):
    pytester.makepyfile(my_interrupting=textwrap.dedent(
        """
        def add(x, y):
            raise KeyboardInterrupt
        """
    ))
    report = pytester.path / "report.json"
    # In a subprocess: the KeyboardInterrupt must not reach this test's own runner.
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--pallas-seed=0", "--pallas-examples=4", "--pallas-impl",
        "add=my_interrupting:add", f"--pallas-report={report}", timeout=300)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    document = json.loads(report.read_text())
    assert document["complete"] is False
    assert document["incomplete_reasons"] == ["the run was interrupted"]


def test_xdist_reaches_the_serial_verdicts_and_merges_one_report(pytester, user_module):
    pytest.importorskip("xdist")
    serial_report = pytester.path / "serial.json"
    parallel_report = pytester.path / "parallel.json"
    args = ["--pallas-impl", "add=my_kernels:add", "--pallas-impl", "softmax=my_kernels:softmax"]
    serial = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pallas-seed=3",
                                           "--pallas-examples=3", *args,
                                           f"--pallas-report={serial_report}", timeout=300)
    parallel = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pallas-seed=3",
                                             "--pallas-examples=3", "-n", "2", *args,
                                             f"--pallas-report={parallel_report}", timeout=300)
    assert serial.ret == parallel.ret == 0
    one, two = (json.loads(p.read_text()) for p in (serial_report, parallel_report))
    assert two["complete"] is True
    verdicts = lambda doc: {(op, name): prop["verdict"] for op, data in doc["ops"].items()  # noqa: E731
                            for name, prop in data["properties"].items()}
    assert verdicts(one) == verdicts(two) and len(verdicts(one)) >= 8
    examples = lambda doc: {op: data["properties"]["value"]["examples"]  # noqa: E731
                            for op, data in doc["ops"].items()}
    assert examples(one) == examples(two)


def test_the_suite_runs_where_pytest_xdist_is_not_installed(pytester):
    # -p no:xdist stands in for a plain `pip install pytest-pallas`, which brings no xdist.
    result = pytester.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider",
                                           "--pallas-conformance", "--pallas-ops=add",
                                           "--pallas-examples=2", "-k", "value")
    assert result.ret == 0, result.stdout.str()[-2000:] + result.stderr.str()[-2000:]


def test_a_crashed_worker_leaves_a_report_that_says_it_is_incomplete(pytester, user_module):
    pytest.importorskip("xdist")
    pytester.makepyfile(my_crashing=textwrap.dedent(
        """
        import os

        def add(x, y):
            os._exit(3)  # the worker process dies, as on a segfault in a kernel
        """
    ))
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--pallas-seed=0", "--pallas-examples=2", "-n", "2",
        "--pallas-impl", "add=my_crashing:add", "--pallas-impl", "softmax=my_kernels:softmax",
        f"--pallas-report={report}", timeout=300)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    document = json.loads(report.read_text())
    assert document["complete"] is False
    reasons = " ".join(document["incomplete_reasons"])
    assert "crashed" in reasons and "test_elementwise.py::" in reasons, reasons
    # The other op's verdicts still reached the merged report.
    softmax = document["ops"]["softmax"]["properties"]
    assert softmax and all(prop["verdict"] == "pass" for prop in softmax.values())
    result.stdout.fnmatch_lines(["incomplete: *crashed*"])


def test_pallas_ops_turns_the_suite_on(run_pytest):
    """As --pallas-impl does: without --pallas-conformance, the flag is not silently ignored."""
    result = run_pytest("--pallas-ops=add", "--collect-only", "-q")
    assert result.ret == 0, result.stdout.str()
    collected = [line for line in result.stdout.lines if "::test_value[" in line]
    assert collected and all("test_value[add]" in line for line in collected), collected


def test_the_report_creates_its_missing_directory_and_says_so(run_pytest, pytester):
    result = run_pytest("--pallas-ops=add", "--pallas-report=out/nightly/report.json",
                        "--pallas-examples=1", "-k", "value", "-p", "no:xdist")
    assert result.ret == 0, result.stdout.str()
    report = json.loads((pytester.path / "out" / "nightly" / "report.json").read_text())
    assert report["complete"] is True and report["ops_selected"] == ["add"]
    result.stdout.fnmatch_lines([
        "report written to out/nightly/report.json (directory out/nightly created)"])


WRONG_FOR_INT32 = textwrap.dedent(
    """
    import jax.numpy as jnp

    def add(x, y):
        print("TRACED", x.dtype, x.shape)  # once per input type: the order cases ran in
        return x + y + 1 if x.dtype == jnp.int32 else x + y
    """
)


def test_reproduce_line_reruns_only_the_failed_property_its_sweep_case_first(pytester):
    # The packaged suite lives outside the user's project, as in site-packages: the
    # reproduce line must name it so that pytest finds it from here, and select the one
    # failed test, not append the whole suite again (which reran every test of the op).
    pytester.makepyfile(my_kernels=WRONG_FOR_INT32)
    pytester.syspathinsert()
    first = run(pytester, "-s", "--pallas-impl", "add=my_kernels:add")
    first.assert_outcomes(failed=1, passed=2)
    commands = [line.strip() for line in first.stdout.lines
                if line.startswith("  pytest ") and "test_value" in line]
    assert len(commands) == 1, first.stdout.str()
    words = shlex.split(commands[0])
    assert words[-1] == "--pallas-sweep-first=6", commands[0]  # int32 is add's sixth case
    again = pytester.runpytest("-p", "no:cacheprovider", "-s", *words[1:])
    again.assert_outcomes(failed=1)
    traced = re.findall(r"TRACED (\w+)", again.stdout.str())
    assert traced[0] == "int32", traced
    assert "input (sweep case 6)" in again.stdout.str()
    assert "Failing explicit example" not in again.stdout.str()  # the input line says it


def test_table_says_what_it_counts_and_where_each_property_ran(pytester, user_module):
    # "passed" counted properties while pytest counts tests, and the header named the TPU
    # interpreter while value ran in the plain one: both are labelled.
    result = run(pytester, "--pallas-impl", "add=my_kernels:add", "--pallas-report=r.json")
    assert result.ret == 0
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([
        "pallas: CPU, tpu interpreter (the conformance suite runs its value, deterministic and "
        "vmap examples in the plain one, for speed), *",
        "*pallas conformance*",
        "op   implementation  properties passed  failed  examples  *  interpreters  judge  *"
        "restrictions",
        "add  my_kernels:add  6                  0       *  plain/tpu     in kernels: 0%*none",
        "properties passed/failed: of shape_dtype, finite, value, written, deterministic and "
        "vmap; pytest counts tests *",
        "interpreters: where value, deterministic and vmap ran / where written ran *",
    ])
    properties = json.loads((pytester.path / "r.json").read_text())["ops"]["add"]["properties"]
    assert properties["value"]["interpreter"] == "plain"
    assert properties["written"]["interpreter"] == "tpu"

    chosen = run(pytester, "--pallas-impl", "add=my_kernels:add", "--pallas-interpret=tpu")
    chosen.stdout.fnmatch_lines(["pallas: CPU, tpu interpreter, standing in for TPU *",
                                 "add  my_kernels:add  6 * tpu  *  in kernels: 0%*none"])


def test_collectives_skip_in_the_plain_interpreter_with_the_reason(pytester):
    # JAX's plain interpreter crashes inside JAX on remote copies ("unsupported operand
    # type(s) for ==: 'DynamicJaxprTracer' and 'tuple'"): not a verdict on the kernel.
    result = run(pytester, "--pallas-ops=ppermute", "--pallas-interpret=plain", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*ppermute: remote copies between devices run only in the TPU "
                                 "interpreter; drop --pallas-interpret=plain to check this op"])
