"""benchmarks/peer_suites.py's pure parts: the work folder's plugin (sampling, the per-test
limit) and the classing and tables of benchmarks/peer_suite_results.py, on a small suite run
twice by an inner pytest, as the measurement runs JAX's: gated off, then "opted in"."""

import dataclasses
import pathlib
import re
import sys
import textwrap

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import peer_suite_results as results  # noqa: E402
import peer_suites  # noqa: E402

# A TPU suite in miniature: its tests skip unless the device under test is a TPU (here an
# environment variable), one interpret-mode test runs only on the CPU.
SUITE = textwrap.dedent("""
    import os, time
    import pytest

    ON_TPU = os.environ.get("FAKE_DEVICE_UNDER_TEST") == "tpu"

    @pytest.mark.parametrize("case", range(6))
    def test_kernel(case):
        if not ON_TPU:
            pytest.skip("Test requires TPUs")
        if case == 2:
            raise NotImplementedError(
                "Unimplemented primitive in Pallas TPU lowering for tc: pack_elementwise")
        if case == 4:  # an autotuner's loop: its except must not take the time limit
            try:
                time.sleep(30)
            except Exception:
                pass
        if case == 5:
            pytest.skip("Megacore is only available on TPU v4 or TPU v5p")

    def test_interpret_only():
        if ON_TPU:
            pytest.skip("Only run interpret tests on CPU.")
""")


def _run(pytester, label, *args):
    xml = pytester.path / f"{label}.xml"
    pytester.runpytest("-p", "peer_suite_shim", "-p", "no:pallas", "-p", "no:cacheprovider",
                       "-o", "junit_family=xunit1", f"--junitxml={xml}", *args)
    return xml


@pytest.fixture
def suite(pytester, monkeypatch):
    pytester.syspathinsert(BENCHMARKS)
    pytester.makepyfile(tpu_fake_test=SUITE)
    monkeypatch.setenv("PEER_SUITE_TIMEOUT", "0.5")
    return pytester


def test_off_and_on_runs_are_counted_and_every_outcome_classed(suite, monkeypatch):
    off = _run(suite, "off")
    monkeypatch.setenv("FAKE_DEVICE_UNDER_TEST", "tpu")
    on = _run(suite, "on")

    rows, classes = results.compare(results.read_junit(off), results.read_junit(on))

    [row] = rows
    assert (row.file, row.ids, row.skipped_off, row.passed_off) == ("tpu_fake_test.py", 7, 6, 1)
    assert (row.run_on, row.passed_on, row.failed_on, row.skipped_on, row.lost) == (5, 3, 2, 1, 1)
    assert classes == {
        ("failed", "timeout: the test ran past the per-test limit",
         "PeerSuiteTimeout: ran past N s"): 1,
        ("failed",
         "JAX interpreter limit: pack_elementwise/unpack_elementwise have no CPU rule",
         "NotImplementedError: Unimplemented primitive in Pallas TPU lowering for tc: "
         "pack_elementwise"): 1,
        ("skipped", "Megacore only: the stand-in chip has one TensorCore",
         "Megacore is only available on TPU v4 or TPU v5p"): 1,
        ("lost: skipped",
         "interpret-mode test: runs only where the device under test is the CPU",
         "Only run interpret tests on CPU."): 1,
    }
    text = results.report(off, on)
    # Every count; the two seconds columns are timings of a loaded machine, not asserted.
    counts = r"\| tpu_fake_test\.py \| 7 \| 6 \| 1 \| 5 \| 3 \| 2 \| 1 \| 1 \| "
    assert re.search(counts + r"\d+ \| \d+ \|", text)
    assert "TPU-only tests passing opted in: 3 of 6 (50.0%)" in text


def test_sampling_keeps_every_kth_id_of_each_file(suite, monkeypatch):
    monkeypatch.setenv("PEER_SUITE_SAMPLE", "3")
    kept = [result.test_id.rsplit("::", 1)[-1]
            for result in results.read_junit(_run(suite, "sampled"))]
    assert kept == ["test_kernel[0]", "test_kernel[3]", "test_interpret_only"]


def test_the_slices_of_a_sample_are_the_whole_suite_each_id_once(suite, monkeypatch):
    monkeypatch.setenv("PEER_SUITE_SAMPLE", "3")
    kept = []
    for offset in range(3):
        monkeypatch.setenv("PEER_SUITE_SLICE", str(offset))
        kept += [result.test_id for result in results.read_junit(_run(suite, f"s{offset}"))]
    monkeypatch.setenv("PEER_SUITE_SAMPLE", "1")
    whole = [result.test_id for result in results.read_junit(_run(suite, "whole"))]
    assert sorted(kept) == sorted(whole) and len(set(kept)) == len(kept) == 7


def test_a_chunked_run_stopped_midway_resumes_after_the_chunks_it_finished(tmp_path,
                                                                          monkeypatch, capsys):
    for name in ("a", "b", "c"):
        (tmp_path / f"tpu_{name}_test.py").write_text("def test_one():\n    pass\n")
    peer_suites.prepare_workdir(tmp_path)
    args = peer_suites.argparse.Namespace(
        mode="off", chunks=2, sample=1, slice=0, timeout=0, workers=0, durations=0,
        pytest_args=[], opt_in="", also_opt_in=[])
    paths = sorted(path.name for path in tmp_path.glob("tpu_*_test.py"))
    monkeypatch.setenv("PYTHONPATH", str(BENCHMARKS))
    peer_suites.measure(tmp_path, paths, args)
    first = [results.read_junit(tmp_path / f"off-{number}.xml") for number in (0, 1)]
    assert [len(chunk) for chunk in first] == [2, 1]
    # As if the second chunk had been stopped: its XML never became final.
    (tmp_path / "off-1.xml").unlink()
    (tmp_path / "off-0.log").write_text("the first run's log\n")
    capsys.readouterr()
    peer_suites.measure(tmp_path, paths, args)
    out = capsys.readouterr().out
    assert "off-0.xml: kept from an earlier run" in out
    assert (tmp_path / "off-0.log").read_text() == "the first run's log\n"
    assert results.read_junit(tmp_path / "off-1.xml")[0].outcome == results.PASSED


def test_sampling_a_run_over_several_chips_keeps_the_same_tests_on_every_chip(suite,
                                                                             monkeypatch):
    monkeypatch.setenv("PEER_SUITE_SAMPLE", "3")
    xml = suite.path / "chips.xml"
    suite.runpytest("-p", "peer_suite_shim", "-p", "no:cacheprovider", "-p", "no:xdist",
                    "--pallas-interpret=tpu", "--pallas-chip=v5e,v6e", "-o",
                    "junit_family=xunit1", f"--junitxml={xml}")
    kept = sorted(result.test_id.rsplit("::", 1)[-1] for result in results.read_junit(xml))
    assert kept == sorted(f"{name}[{params}{chip}]"
                          for name, params in [("test_kernel", "0-"), ("test_kernel", "3-"),
                                               ("test_interpret_only", "")]
                          for chip in ("v5e", "v6e"))


def test_a_run_of_the_plugin_off_alone_classes_its_skips(suite):
    rows, classes = results.compare(results.read_junit(_run(suite, "off")), None)
    assert (rows[0].ids, rows[0].skipped_off, rows[0].passed_off) == (7, 6, 1)
    assert classes == {("skipped", results.TPU_GATE, "Test requires TPUs"): 6}


@pytest.mark.parametrize(("outcome", "reason", "expected"), [
    ("failed", "ValueError: Device kind cpu is not supported",
     "asks the device kind: the CPU is no TPU generation"),
    ("failed", "NotImplementedError: nan + dma_sem",
     "JAX interpreter limit: an uninitialised DMA semaphore (nan + dma_sem)"),
    ("failed", "jax._src.pallas.mosaic.lowering.LoweringException: MosaicError: Only i1 and i32",
     "expects the chip's rejection (Mosaic lowering or the TPU compiler)"),
    ("failed", "AssertionError: \nNot equal to tolerance rtol=0.02, atol=0.01",
     "value comparison: the result differs from the test's expectation"),
    ("skipped", "Only supports TPU generation 5 or above", results.TPU_GATE),
    ("skipped", "tests/pallas/tpu_ops_test.py:416: Scalar output not supported",
     "the test's own parameter skip (skips on the chip too)"),
    ("skipped", "pallas: ... 'stochastic_round' not found for platform cpu): neither of JAX's "
     "interpreters can run this kernel, so ...",
     "JAX interpreter limit: neither interpreter runs the kernel (a primitive with no CPU rule)"),
    ("skipped", "pallas: interpreting this test's kernel needs about 21.0 GiB of host memory "
     "(...), and this host has 10.8 GiB available: ...",
     "this host's memory: the interpreter's copies of the kernel's arrays would not fit"),
    ("failed", "pallas: t.py::test ran longer than --pallas-timeout=120s outside its kernels, "
     "in XLA, running a computation of its own", "timeout: the test ran past the per-test limit"),
    ("skipped", "Not supported on TPUs.", results.KEPT_OFF_TPUS),
    ("skipped", "Test disabled on TPU.", results.KEPT_OFF_TPUS),
    ("skipped", "Only tested on TPU7x and newer.", results.TPU_GATE),
    ("skipped", "Too slow for OSS regression tests.",
     "the test's own parameter skip (skips on the chip too)"),
    ("skipped", "Combination <class 'jax.numpy.float8_e4m3fn'> and <class 'jax.numpy.int8'> "
     "not supported by the kernel.", "the test's own parameter skip (skips on the chip too)"),
    ("failed", "KeyError: 'something nobody has seen'", results.UNCLASSED),
    ("passed", "", ""),
])
def test_a_reason_is_classed_by_its_cause(outcome, reason, expected):
    assert results.cause(outcome, reason) == expected


def test_tests_a_suite_keeps_off_every_tpu_and_gpu_tests_are_set_aside_from_the_share():
    assert {results.KEPT_OFF_TPUS, results.GPU_TEST} <= results.RUN_NOWHERE
    assert results.TPU_GATE not in results.RUN_NOWHERE  # another chip may open it


def test_shapes_and_sizes_do_not_split_a_class():
    first = "ValueError: block (8, 128) of f32[16,256] at 0x7f00ab does not fit: 12.5 MiB"
    second = "ValueError: block (16, 128) of f32[32,512] at 0x7f11cd does not fit: 50 MiB"
    assert results.normalise(first) == results.normalise(second)


def test_no_jax_source_is_one_line_naming_how_to_get_one(monkeypatch, tmp_path):
    monkeypatch.delenv("PEER_SUITES_JAX_SOURCE", raising=False)
    with pytest.raises(SystemExit) as stopped:
        peer_suites.main(["jax", "--workdir", str(tmp_path)])
    assert str(stopped.value) == peer_suites.NO_SOURCE
    assert "git clone" in peer_suites.NO_SOURCE and "\n" not in peer_suites.NO_SOURCE


def test_runs_under_two_configurations_are_taken_together(suite, monkeypatch):
    monkeypatch.setenv("FAKE_DEVICE_UNDER_TEST", "tpu")
    on = results.read_junit(_run(suite, "on"))
    # The second configuration: the Megacore case runs and passes, case 3 fails.
    second = [dataclasses.replace(r, outcome=results.PASSED, reason="")
              if r.test_id.endswith("test_kernel[5]") else
              dataclasses.replace(r, outcome=results.FAILED, reason="AssertionError: differs")
              if r.test_id.endswith("test_kernel[3]") else r for r in on]

    merged = {r.test_id.rsplit("::", 1)[-1]: r.outcome
              for r in results.merge_configurations(on, second)}

    assert merged["test_kernel[5]"] == results.PASSED     # skipped in one, passed in the other
    assert merged["test_kernel[3]"] == results.FAILED     # passed in one, failed in the other
    assert merged["test_kernel[2]"] == results.FAILED
    assert merged["test_kernel[0]"] == results.PASSED
    assert len(merged) == len(on)


def test_a_skip_at_a_gate_another_configuration_opened_gives_that_run_s_reason():
    def skipped(reason):
        return results.Result("t.py::T::test_mxu", "t.py", results.SKIPPED, reason, 0.1)

    first = skipped("TPU v7 required for this test.")
    as_7x = skipped("pallas: ... neither of JAX's interpreters can run this kernel ...")
    merged = results.merge_configurations([first], [as_7x])
    assert [r.reason for r in merged] == [as_7x.reason]
    # A skip of the test's own keeps the first run's reason.
    own = skipped("Bitcasting with bool is not supported")
    assert results.merge_configurations([own], [as_7x])[0].reason == own.reason


def test_a_newer_libtpu_gate_is_counted_as_skipped_on_the_chip_too():
    reason = "Needs a newer libtpu"
    assert results.cause(results.SKIPPED, reason) == results.NEWER_LIBTPU
    assert results.NEWER_LIBTPU in results.SKIPPED_ON_THE_CHIP
    assert results.NEWER_LIBTPU not in results.RUN_NOWHERE


def test_a_run_of_several_chips_is_one_result_per_test():
    def result(test_id, outcome, reason=""):
        return results.Result(test_id, "t.py", outcome, reason, 1.0)

    run = [result("t.py::T::test_a[v5e]", results.SKIPPED, "Expect TPUv6+"),
           result("t.py::T::test_a[v6e]", results.PASSED),
           result("t.py::test_b[3-v5e]", results.PASSED),
           result("t.py::test_b[3-v6e]", results.FAILED, "AssertionError: differs"),
           result("t.py::test_c[7]", results.PASSED)]
    per_chip = results.split_by_chip(run)
    assert sorted(len(chip) for chip in per_chip) == [1, 2, 2]
    merged = {r.test_id: r.outcome for r in results.merge_configurations(*per_chip)}
    assert merged == {"t.py::T::test_a": results.PASSED, "t.py::test_b[3]": results.FAILED,
                      "t.py::test_c[7]": results.PASSED}
