"""Several TPU generations in one run (contract §12): ``--pallas-chip=v5e,v6e,7x`` runs each
test once per chip, its id suffixed as pytest parametrizes it, each copy standing in for its
own chip, with the header, the summary and the report per chip."""

import json
import textwrap

import pytest

SUITE = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from absl.testing import absltest
    from jax._src import test_util as jtu
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def double(x):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2.0
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    def test_plain():
        x = jnp.ones((8, 128), jnp.float32)
        np.testing.assert_array_equal(double(x), 2 * x)
        print("PLAIN", jax.devices()[0].device_kind, pltpu.get_tpu_info().generation)

    @pytest.mark.parametrize("rows", [8, 16])
    def test_rows(rows):
        x = jnp.ones((rows, 128), jnp.float32)
        np.testing.assert_array_equal(double(x), 2 * x)

    class GatedTest(jtu.JaxTestCase):
        def setUp(self):
            super().setUp()
            if not jtu.is_device_tpu_at_least(6):
                self.skipTest("Expect TPUv6+")

        def test_newer(self):
            print("NEWER", jtu.get_tpu_version())
''')


def test_each_test_runs_once_per_chip(pytester, run_pytest):
    pytester.makepyfile(test_suite=SUITE)
    result = run_pytest("--pallas-chip=v5e,v6e,7x", "-p", "no:xdist", "-v", "-s", "-rs")
    result.assert_outcomes(passed=11, skipped=1)
    result.stdout.fnmatch_lines([
        "pallas: CPU, tpu interpreter, standing in for TPU v5e (1 TensorCore), TPU v6e "
        "(1 TensorCore), TPU 7x (1 TensorCore), each test once per chip*",
    ])
    out = result.stdout.str()
    for line in ("test_suite.py::test_plain[v5e] PLAIN TPU v5 lite 5",
                 "test_suite.py::test_plain[7x] PLAIN TPU7x 7",
                 "test_suite.py::test_rows[16-v6e] PASSED",
                 "test_suite.py::GatedTest::test_newer[v6e] NEWER 6",
                 "test_suite.py::GatedTest::test_newer[v5e] SKIPPED (Expect TPUv6+)"):
        assert line in out, line
    result.stdout.fnmatch_lines(["*pallas: per chip*", "v5e: 3 passed, 1 skipped",
                                 "v6e: 4 passed", "7x: 4 passed"])


def test_a_chip_s_copies_are_selected_by_its_name(pytester, run_pytest):
    pytester.makepyfile(test_suite=SUITE)
    result = run_pytest("--pallas-chip=v5e,v6e", "-p", "no:xdist", "-k", "v6e and rows")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["collected 8 items / 6 deselected / 2 selected"])
    result = run_pytest("--pallas-chip=v5e,v6e", "-p", "no:xdist",
                        "test_suite.py::test_rows[16-v6e]",
                        "test_suite.py::GatedTest::test_newer[v6e]")
    result.assert_outcomes(passed=2)


def test_workers_run_the_same_copies(pytester, run_pytest):
    pytester.makepyfile(test_suite=SUITE)
    result = run_pytest("--pallas-chip=v5e,v6e", "-n", "2")
    result.assert_outcomes(passed=7, skipped=1)
    result.stdout.fnmatch_lines(["v5e: 3 passed, 1 skipped", "v6e: 4 passed"])


def test_a_failing_copy_reruns_alone_as_its_chip(pytester, run_pytest):
    pytester.makepyfile(test_suite=SUITE.replace("2 * x)\n    print(\"PLAIN\"",
                                                 "3 * x)\n    print(\"PLAIN\""))
    result = run_pytest("--pallas-chip=v5e,v6e", "--pallas-seed=3", "-p", "no:xdist",
                        "-k", "plain")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*pytest test_suite.py::test_plain --pallas-seed=3 "
                                 "--pallas-chip=v6e*"])


def test_all_is_every_generation_the_compiler_knows():
    from pytest_pallas.plugin import options

    assert options.parse_chip_flag("all") == options.COMPILER_CHIPS
    assert options.parse_chip_flag("v6e, tpu7x,v6e") == ("v6e", "7x")
    with pytest.raises(pytest.UsageError, match="--pallas-tpu runs on the one TPU"):
        options.parse_chip_flag("v5e,v6e", tpu=True)


def test_the_conformance_report_has_a_row_per_chip(pytester, run_pytest):
    result = run_pytest("--pallas-conformance", "--pallas-ops=add", "--pallas-chip=v5e,v6e",
                        "--pallas-report=report.json", "-p", "no:xdist", "--pallas-seed=0")
    assert result.ret == 0, result.stdout.str()
    report = json.loads((pytester.path / "report.json").read_text())
    assert set(report["ops"]) == {"add [v5e]", "add [v6e]"}
    assert report["environment"]["chips"] == ["v5e", "v6e"]
    assert all(record["properties"]["value"]["verdict"] == "pass"
               for record in report["ops"].values())
