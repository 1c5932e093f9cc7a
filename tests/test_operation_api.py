"""Your own op through the public API only: ``Operation`` and ``conformance_tests``.

The RMSNorm example of docs/your-own-op.md runs as written and gets every property; its
seeded bugs (an uninitialised accumulator, a wrong epsilon, a dropped weight)
fail the property that should catch them, with the suite's messages,
reproduce lines and report rows; an op with ``params`` and an ``inputs``
builder; an op registered from a conftest is accepted by ``--pallas-impl``;
and a malformed declaration is a one-line usage error.
"""

import json
import pathlib
import re
import textwrap

import numpy as np
import pytest

from pytest_pallas import Operation, operations
from pytest_pallas.ops.operation import OperationError

GUIDE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "your-own-op.md"
PROPERTIES = {"shape_dtype", "finite", "value", "written", "deterministic", "vmap"}


def guide_example() -> str:
    """The first Python block of the page "Testing your own op"."""
    return re.search(r"```python\n(.*?)```", GUIDE.read_text(), re.S).group(1)


def _report(pytester) -> dict:
    return json.loads((pytester.path / "report.json").read_text())


def _run(pytester, *args):
    return pytester.runpytest("-p", "no:cacheprovider", "--pallas-report=report.json",
                              "--pallas-seed=0", *args)


def test_the_guides_example_gets_every_property(pytester):
    pytester.makepyfile(test_rms_norm=guide_example())
    result = _run(pytester)
    output = result.stdout.str()
    assert result.ret == 0, output[-3000:]
    result.assert_outcomes(passed=3)  # value, written and deterministic, vmap
    row = _report(pytester)["ops"]["my_rms_norm"]
    assert row["implementation"] == "test_rms_norm:rms_norm"
    assert {name: prop["verdict"] for name, prop in row["properties"].items()} == dict.fromkeys(
        PROPERTIES, "pass")
    # 4 sweep cases (3 profiles in float32, "large" in bfloat16), then the drawn ones.
    assert row["properties"]["value"]["examples"] >= 4 + 10
    result.stdout.fnmatch_lines(["*pallas conformance*", "pallas: CPU, * seed 0*",
                                 "my_rms_norm  test_rms_norm:rms_norm  6 *0 *none"])


def test_the_guides_example_reports_without_any_pallas_flag(pytester):
    # A run without a Pallas flag makes the conformance recorder only when a conformance test
    # needs it: the end-of-run table still has the op's row.
    pytester.makepyfile(test_rms_norm=guide_example())
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*pallas conformance*",
                                 "my_rms_norm  test_rms_norm:rms_norm  6 *0 *none"])


# Bugs of the guide's kernel, each a module of its own that imports the guide's op.
_UNINITIALISED = '''
def buggy(x, w, *, eps):
    """The mean square accumulated in a VMEM scratch that is never zeroed."""
    rows, cols = x.shape

    def kernel(x_ref, w_ref, o_ref, acc_ref):
        xf = x_ref[...].astype(jnp.float32)
        acc_ref[...] += jnp.sum(xf * xf, axis=-1, keepdims=True)  # BUG: no acc_ref[...] = 0
        scale = jax.lax.rsqrt(acc_ref[...] / cols + eps)
        o_ref[...] = (xf * scale * w_ref[...].astype(jnp.float32)).astype(o_ref.dtype)

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((rows, 1), jnp.float32)],
    )(x, w.reshape(1, cols))
'''
_WRONG_EPSILON = '''
def buggy(x, w, *, eps):
    """eps added to the root mean square instead of the mean square."""
    xf = x.astype(jnp.float32)
    rms = jnp.sqrt(jnp.mean(xf * xf, axis=-1, keepdims=True))
    return (xf / (rms + eps) * w.astype(jnp.float32)).astype(x.dtype)
'''
_DROPPED_WEIGHT = '''
def buggy(x, w, *, eps):
    """Normalised, but the weight never applied."""
    return rms_norm(x, jnp.ones_like(w), eps=eps)
'''


def _bug_module(body: str) -> str:
    return textwrap.dedent('''
        import jax
        import jax.numpy as jnp
        from jax.experimental import pallas as pl
        from jax.experimental.pallas import tpu as pltpu

        from pytest_pallas import conformance_tests
        from rms_norm_example import RMS_NORM, rms_norm
        ''') + body + "\n\nTestBuggy = conformance_tests(RMS_NORM, buggy, label='buggy')\n"


@pytest.mark.parametrize("body, test, prop, message", [
    (_UNINITIALISED, "test_written_and_deterministic", "written",
     "[my_rms_norm: written]*uninitialized-read*"),
    (_WRONG_EPSILON, "test_value", "value", "[my_rms_norm: value] Arrays are not close*"),
    (_DROPPED_WEIGHT, "test_value", "value", "[my_rms_norm: value] Arrays are not close*"),
], ids=["uninitialised-accumulator", "wrong-epsilon", "dropped-weight"])
def test_bugs_of_your_op_fail_the_right_property(pytester, body, test, prop, message):
    pytester.makepyfile(rms_norm_example=guide_example().replace(
        "TestRmsNorm = conformance_tests(RMS_NORM, rms_norm)", ""))
    pytester.makepyfile(test_bug=_bug_module(body))
    result = _run(pytester, "-k", test)
    output = result.stdout.str()
    assert result.ret == 1, output[-3000:]
    message = message.replace("[", "\x00").replace("]", "[]]").replace("\x00", "[[]")
    result.stdout.fnmatch_lines([f"*{message}", "*reproduce with:",
                                 f"  pytest test_bug.py::TestBuggy::{test} --pallas-seed=0*"])
    row = _report(pytester)["ops"]["my_rms_norm"]
    assert row["implementation"] == "buggy"
    failed = {name for name, p in row["properties"].items() if p["verdict"] == "fail"}
    assert prop in failed, row
    assert row["properties"][prop]["first_failure"]
    result.stdout.fnmatch_lines([f"my_rms_norm  buggy  *{prop}*"])


# An op with params and an inputs builder: rows gathered by an index table, then scaled.
_GATHER = '''
import jax.numpy as jnp
import numpy as np

from pytest_pallas import Operation, conformance_tests, supports


def gather_reference(x, indices, *, scale):
    return x[indices] * scale


def gather_inputs(dims, dtype, rng):
    # The index table must point inside x; x itself is drawn by the value profile (None).
    return None, rng.integers(0, dims["rows"], size=dims["n"]).astype(np.int32)


GATHER = Operation(
    "scaled_gather", "(rows,cols),(n)->(n,cols)", oracle=gather_reference,
    params={"scale": (0.5, 2.0)}, arg_dtypes={1: "int32"}, inputs=gather_inputs, vmap=False,
)
SEEN = []


def gather(x, indices, *, scale):
    SEEN.append(scale)
    return (x[indices].astype(jnp.float32) * scale).astype(x.dtype)


def gather_without_scale(x, indices, *, scale):
    return x[indices]


@supports(dtypes=("float32",), max_size={"n": 8})
def gather_narrow(x, indices, *, scale):
    assert x.dtype == jnp.float32 and indices.shape[0] <= 8, "drawn outside the domain"
    return gather(x, indices, scale=scale)


TestGather = conformance_tests(GATHER, gather, examples=6)
TestGatherBug = conformance_tests(GATHER, gather_without_scale, examples=6)
TestGatherNarrow = conformance_tests(GATHER, gather_narrow, examples=4, label="narrow")


def test_both_scales_were_drawn():
    assert set(SEEN) == {0.5, 2.0}
'''


def test_an_op_with_params_and_an_inputs_builder(pytester):
    pytester.makepyfile(test_gather=_GATHER)
    result = _run(pytester)
    output = result.stdout.str()
    result.assert_outcomes(passed=6, failed=1)
    result.stdout.fnmatch_lines(["*[[]scaled_gather: value[]] Arrays are not close*",
                                 "*implementation: test_gather:gather_without_scale"])
    assert "TestGather::test_value" not in output.split("short test summary")[-1]
    # One row per implementation, each with its own verdicts.
    result.stdout.fnmatch_lines([
        "scaled_gather  *test_gather:gather  *5 *0 *",
        "scaled_gather (test_gather:gather_without_scale)  *test_gather:gather_without_scale  "
        "*4 *value *",
        # @supports narrows the draws and the report shows it.
        "scaled_gather (narrow)  *narrow  *5 *0 *dtypes=float32; n<=8"])


def test_registered_op_is_accepted_by_pallas_impl(pytester):
    pytester.makepyfile(rms_norm_example=guide_example().replace(
        "TestRmsNorm = conformance_tests(RMS_NORM, rms_norm)", ""))
    pytester.makeconftest("""
        def pytest_pallas_operations(config):
            from rms_norm_example import RMS_NORM
            return [RMS_NORM]
    """)
    pytester.syspathinsert()
    result = _run(pytester, "--pallas-conformance",
                  "--pallas-impl", "my_rms_norm=rms_norm_example:rms_norm",
                  "--pallas-examples=3")
    output = result.stdout.str()
    assert result.ret == 0, output[-3000:]
    result.stdout.fnmatch_lines(["*test_operations.py*", "*pallas conformance*",
                                 "my_rms_norm  rms_norm_example:rms_norm  6 *"])
    assert _report(pytester)["ops_selected"] == ["my_rms_norm"]
    # Unknown ops are still refused, and the message says how to add one.
    result = _run(pytester, "--pallas-conformance", "--pallas-impl", "rmsnorm=m:f")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*unknown op 'rmsnorm'*my_rms_norm*pytest_pallas_operations*"])


@pytest.mark.parametrize("declaration, message", [
    ('Operation("bad", "(m,k),(k,n)", oracle=lambda x, y: x @ y)',
     "*Operation 'bad': signature '(m,k),(k,n)' is not a NumPy gufunc signature*"),
    ('Operation("bad", "(m,k),(k,n)->(m,n)", oracle=lambda x, y: x @ y.T)',
     "*Operation 'bad': the oracle * failed on inputs of signature '(m,k),(k,n)->(m,n)'*"),
    ('Operation("bad", "(r,c)->(r,c)", oracle=lambda x: x.sum(axis=-1))',
     "*Operation 'bad': the oracle * returned shape (3,) for arguments (3, 4), but signature "
     "'(r,c)->(r,c)' says (3, 4)*"),
    ('Operation("bad", "(r,c)->(r,c)", oracle=lambda x, y: x)',
     "*Operation 'bad': the oracle * cannot be called with 1 argument(s)*"),
])
def test_a_malformed_op_is_a_one_line_usage_error(pytester, declaration, message):
    pytester.makepyfile(test_bad=f"""
        from pytest_pallas import Operation, conformance_tests

        TestBad = conformance_tests({declaration}, lambda *a: a[0])
    """)
    result = _run(pytester)
    assert result.ret == 4, result.stdout.str()[-2000:]
    result.stderr.fnmatch_lines([f"ERROR: test_bad.py: {message[1:]}"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    # The same mistake in a conftest's hook.
    pytester.makeconftest(f"""
        def pytest_pallas_operations(config):
            from pytest_pallas import Operation
            return [{declaration}]
    """)
    (pytester.path / "test_bad.py").unlink()
    result = _run(pytester)
    assert result.ret == 4
    result.stderr.fnmatch_lines([f"ERROR: pytest_pallas_operations: {message[1:]}"])


def test_every_built_in_op_is_an_operation_and_a_user_op_is_not_a_built_in():
    assert [op.name for op in operations.BUILT_IN] == [
        "add", "sum", "matmul", "matmul_activation", "batched_matmul", "softmax", "attention",
        "mha", "mqa", "copy", "ppermute", "flash_attention", "rms_norm", "grouped_matmul",
        "quantized_matmul", "paged_attention", "all_gather", "reduce_scatter"]
    assert operations.matmul.dimensions == ("m", "k", "n")
    assert [operations.matmul.dimension_kind(d) for d in "mkn"] == [
        "second_minor", "reduction", "minor"]
    assert operations.ppermute.dimensions == ("devices", "rows", "cols")
    with pytest.raises(OperationError, match="reduction names dimension 'x'"):
        Operation("op", "(r,c)->(r,c)", oracle=lambda x: x, reduction="x")


def test_a_cost_model_is_derived_from_the_xla_version():
    import jax
    import jax.numpy as jnp

    op = Operation("scaled", "(r,c)->(r,c)", oracle=lambda x: 2 * x, xla=lambda x: 2.0 * x)
    cost = op.estimate_cost(jax.ShapeDtypeStruct((8, 128), jnp.float32))
    assert cost.flops == 8 * 128 and cost.bytes_accessed == 2 * 8 * 128 * 4
    assert np.isclose(operations.matmul.estimate_cost(
        jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 4), jnp.float32)
    ).flops, 2 * 8 * 16 * 4)


_ALL_GATHER = """
import jax
import numpy as np

from pytest_pallas import Operation, conformance_tests


def all_gather_reference(x, *, devices):
    return np.concatenate([x] * devices)  # every device returns the whole global array


ALL_GATHER = Operation(
    "my_all_gather", "(rows,cols)->(rows,cols)", oracle=all_gather_reference,
    collective="axis_name", vmap=False, exact=True,
    shapes=lambda d: ([(d["devices"] * d["rows"], d["cols"])],
                      (d["devices"] ** 2 * d["rows"], d["cols"])),
)


def all_gather(x, *, axis_name):
    return jax.lax.all_gather(x, axis_name, tiled=True)


def all_gather_own_block(x, *, axis_name):
    return jax.numpy.concatenate([x] * jax.lax.axis_size(axis_name))


TestAllGather = conformance_tests(ALL_GATHER, all_gather, examples=3)
TestAllGatherBug = conformance_tests(ALL_GATHER, all_gather_own_block, examples=3)
"""


def test_a_collective_op_of_your_own(run_pytest, pytester):
    """Called inside shard_map over 2 to 8 devices; the oracle sees the global arrays."""
    pytester.makepyfile(test_all_gather=_ALL_GATHER)
    result = run_pytest("--pallas-seed=0", "--pallas-devices=8", "-k", "test_value")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*[[]my_all_gather: value[]] Arrays are not equal*",
                                 "*implementation: test_all_gather:all_gather_own_block"])
