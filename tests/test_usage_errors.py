"""Every user mistake on the command line or in the ini file: one line naming it and the fix,
exit status 4, before any test is collected. One table, one test."""

import textwrap

import pytest

# Modules the --pallas-impl rows point at, written beside the test file of every case.
MODULES = {
    "my_kernels": """
        def add(x, y):
            return x + y

        not_callable = 42
    """,
    "broken_module": "x = 1 / 0\n",
    # @supports checks its keys when it decorates, so each mistake has its own module.
    "unknown_key": """
        from pytest_pallas import supports

        @supports(block=128)
        def add(x, y):
            return x
    """,
    "unknown_dimension": """
        from pytest_pallas import supports

        @supports(multiple_of={"q": 128})
        def matmul(x, y):
            return x
    """,
}

# (command line, ini file or None, the start of the one ERROR line)
CASES = [
    # Options and their values.
    (["--pallas-interpret=fast"], None,
     "--pallas-interpret='fast' is not an interpreter; use one of tpu, tpu-always, plain."),
    (["--pallas-chip=v9"], None,
     "--pallas-chip='v9': 'v9' is not a TPU generation JAX knows; use v2, v3"),
    (["--pallas-chip=v5e,v9"], None,
     "--pallas-chip='v5e,v9': 'v9' is not a TPU generation JAX knows; use"),
    (["--pallas-chip=,"], None, "--pallas-chip=',' names no chip; give e.g."),
    (["--pallas-examples=0"], None, "--pallas-examples=0 must be at least 1."),
    (["--pallas-examples=-3"], None, "--pallas-examples=-3 must be at least 1."),
    (["--pallas-examples=many"], None, "--pallas-examples='many' is not a whole number"),
    (["--pallas-sweep-first=0"], None, "--pallas-sweep-first=0 must be at least 1."),
    (["--pallas-seed=-1"], None, "--pallas-seed=-1 must be at least 0."),
    (["--pallas-devices=0"], None, "--pallas-devices=0 must be at least 1."),
    (["--pallas-timeout=soon"], None, "--pallas-timeout='soon' is not a number of seconds"),
    (["--pallas-profile=fast"], None, "--pallas-profile='fast' is not a profile"),
    (["--pallas-interpret=plain", "--pallas-detect-races"], None,
     "--pallas-detect-races needs the TPU interpreter; drop --pallas-interpret=plain."),
    (["--pallas-ops=add,conv"], None, "--pallas-ops=add,conv: unknown op 'conv'"),
    (["--pallas-ops=,"], None, "--pallas-ops is empty"),
    (["--pallas-tpu"], None, "--pallas-tpu: JAX sees no TPU; run on a TPU VM"),
    (["--pallas-gpu"], None, "--pallas-gpu: JAX sees no GPU; install jax with CUDA"),
    (["--pallas-gpu", "--pallas-tpu"], None, "--pallas-gpu cannot go with --pallas-tpu"),
    (["--pallas-gpu", "--pallas-detect-races"], None,
     "--pallas-gpu cannot go with --pallas-detect-races"),
    # --pallas-impl: its syntax, the op, the module, the attribute, @supports.
    (["--pallas-impl", "matmul"], None,
     "--pallas-impl 'matmul' is malformed; write OP=MODULE:ATTR"),
    (["--pallas-impl", "matmul=mod_only"], None, "--pallas-impl 'matmul=mod_only' is malformed"),
    (["--pallas-impl", "conv=m:f"], None,
     "--pallas-impl 'conv=m:f': unknown op 'conv'; the conformance ops are add, sum"),
    (["--pallas-impl", "add=m:f", "--pallas-impl", "add=m:g"], None,
     "--pallas-impl gives 'add' twice (m:f and m:g)"),
    (["--pallas-impl", "add=no_such_module:add"], None,
     "--pallas-impl add=no_such_module:add: cannot import module 'no_such_module': "
     "ModuleNotFoundError: No module named 'no_such_module'"),
    (["--pallas-impl", "add=broken_module:add"], None,
     "--pallas-impl add=broken_module:add: cannot import module 'broken_module': "
     "ZeroDivisionError: division by zero"),
    (["--pallas-impl", "add=my_kernels:missing"], None,
     "--pallas-impl add=my_kernels:missing: module 'my_kernels' has no attribute 'missing'."),
    (["--pallas-impl", "add=my_kernels:not_callable"], None,
     "--pallas-impl add=my_kernels:not_callable: my_kernels:not_callable is a int, not a "
     "callable; point it at the function that computes the op."),
    (["--pallas-impl", "add=unknown_key:add"], None,
     "--pallas-impl add=unknown_key:add: @supports got unknown key(s) block; it takes "
     "dtypes, multiple_of, max_size, blocks, ragged_blocks."),
    (["--pallas-impl", "matmul=unknown_dimension:matmul"], None,
     "--pallas-impl matmul=unknown_dimension:matmul: @supports(multiple_of={'q': ...}): "
     "op 'matmul' has no dimension 'q'; its dimensions are m, k, n."),
    # --pallas-ops beside --pallas-impl: only the --pallas-impl ops run.
    (["--pallas-impl", "matmul=my_kernels:add", "--pallas-ops=softmax"], None,
     "--pallas-ops=softmax conflicts with --pallas-impl matmul=my_kernels:add: with "
     "--pallas-impl only its ops run (matmul), so softmax would not; drop softmax from "
     "--pallas-ops, or give --pallas-impl softmax=MODULE:ATTR."),
    (["--pallas-impl", "add=my_kernels:add", "--pallas-ops=add,softmax"], None,
     "--pallas-ops=add,softmax conflicts with --pallas-impl add=my_kernels:add"),
    # --pallas-report: a path the report can be written to.
    (["--pallas-report=."], None,
     "--pallas-report='.' is a directory; give a file in it, e.g. "
     "--pallas-report=./conformance.json."),
    (["--pallas-report=my_kernels.py/report.json"], None,
     "--pallas-report='my_kernels.py/report.json': "),
    # The ini file.
    ([], "[pytest]\npallas_scope = everything\n",
     "ini option pallas_scope='everything' must be 'marked' or 'all'."),
    ([], "[pytest]\npallas_interpret = tpu-sometimes\n",
     "--pallas-interpret='tpu-sometimes' is not an interpreter; use one of tpu, tpu-always, "
     "plain."),
]


def case_id(case):
    args, ini, _ = case
    return " ".join(args) if args else ini.splitlines()[-1]


@pytest.mark.parametrize("args, ini, message", CASES, ids=[case_id(c) for c in CASES])
def test_a_usage_error_is_one_line_and_exit_status_4(pytester, args, ini, message):
    pytester.makepyfile(**{name: textwrap.dedent(text) for name, text in MODULES.items()})
    pytester.makepyfile(test_never_collected="def test_never_collected(): pass")
    pytester.syspathinsert()
    if ini is not None:
        pytester.makeini(ini)
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1, result.stderr.str()
    assert errors[0].startswith("ERROR: " + message), errors[0]
    assert "Traceback" not in result.stderr.str()
    assert "test_never_collected" not in result.stdout.str()


def test_a_bad_implementation_module_is_reported_before_jax_is_imported(pytester):
    """As fast as the other usage errors: no JAX, no backend, no suite (they take seconds)."""
    import subprocess
    import sys

    pytester.makepyfile(broken_module=MODULES["broken_module"],
                        test_never_collected="def test_never_collected(): pass")
    for impl in ("add=broken_module:add", "add=no_such_module:add"):
        completed = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "pytest", "-p", "no:cacheprovider",
             "--pallas-impl", impl],
            cwd=pytester.path, capture_output=True, text=True, timeout=120)
        assert completed.returncode == pytest.ExitCode.USAGE_ERROR, completed.stderr[-2000:]
        assert f"ERROR: --pallas-impl {impl}: cannot import module" in completed.stderr
        imported = [line.rsplit("|", 1)[-1].strip() for line in completed.stderr.splitlines()
                    if line.startswith("import time:")]
        heavy = [name for name in imported if name.split(".")[0] in ("jax", "jaxlib", "hypothesis")]
        assert not heavy, heavy[:5]
