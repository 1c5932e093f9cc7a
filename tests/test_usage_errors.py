"""Every user mistake on the command line: one line naming it, exit status 4, before collection."""

import pytest

CASES = [
    (["--pallas-interpret=fast"], "--pallas-interpret='fast' is not an interpreter; use one of tpu, plain."),
    (["--pallas-chip=v9"], "--pallas-chip='v9' is not a TPU generation JAX knows; use one of"),
    (["--pallas-examples=0"], "--pallas-examples=0 must be at least 1."),
    (["--pallas-examples=-3"], "--pallas-examples=-3 must be at least 1."),
    (["--pallas-examples=many"], "--pallas-examples='many' is not a whole number"),
    (["--pallas-seed=-1"], "--pallas-seed=-1 must be at least 0."),
    (["--pallas-devices=0"], "--pallas-devices=0 must be at least 1."),
    (["--pallas-timeout=soon"], "--pallas-timeout='soon' is not a number of seconds"),
    (["--pallas-profile=fast"], "--pallas-profile='fast' is not a profile"),
    (["--pallas-interpret=plain", "--pallas-detect-races"],
     "--pallas-detect-races needs the TPU interpreter; drop --pallas-interpret=plain."),
    (["--pallas-impl", "matmul"], "--pallas-impl 'matmul' is malformed; write OP=MODULE:ATTR"),
    (["--pallas-impl", "matmul=mod_only"], "--pallas-impl 'matmul=mod_only' is malformed"),
    (["--pallas-impl", "conv=m:f"], "--pallas-impl 'conv=m:f': unknown op 'conv'; the conformance ops are add, sum"),
    (["--pallas-impl", "add=m:f", "--pallas-impl", "add=m:g"], "--pallas-impl gives 'add' twice (m:f and m:g)"),
    (["--pallas-ops=add,conv"], "--pallas-ops=add,conv: unknown op 'conv'"),
    (["--pallas-ops=,"], "--pallas-ops is empty"),
    (["--pallas-tpu"], "--pallas-tpu: JAX sees no TPU; run on a TPU VM"),
]


@pytest.mark.parametrize("args, message", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_usage_error_is_one_line_with_exit_4(pytester, args, message):
    pytester.makepyfile("def test_never_collected(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == 4
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1, result.stderr.str()
    assert errors[0].startswith("ERROR: " + message), errors[0]
    assert "Traceback" not in result.stderr.str()
    assert "test_never_collected" not in result.stdout.str()


def test_bad_ini_scope_is_a_usage_error(pytester):
    pytester.makeini("[pytest]\npallas_scope = everything\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == 4
    assert "pallas_scope='everything' must be 'marked' or 'all'" in result.stderr.str()
