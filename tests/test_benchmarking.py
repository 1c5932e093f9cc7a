"""Benchmarks on pytest-benchmark: the pallas_benchmark fixture's extra_info and table, the
XLA versions it compares with, the ratio gate (synthetic files and real short runs) and the
roofline plot command."""

import functools
import json
import os
import subprocess
import sys
import textwrap
import types

import jax
import numpy as np
import pytest

from pytest_pallas.bench import gate as benchmark_gate
from pytest_pallas.bench.fixture import random_array, xla_version
from pytest_pallas.bench.plot import MISSING_MATPLOTLIB
from pytest_pallas.bench.roofline import Roofline, performance_facts, roofline_of
from pytest_pallas.bench.table import summary_lines
from pytest_pallas.checks import compile_check
from pytest_pallas.compare import assert_allclose
from pytest_pallas.ops.registry import get_operation

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_SOFTMAX = os.path.join(ROOT, "benchmarks", "bench_softmax.py") + "::bench_softmax"
NO_CACHE = ("-p", "no:cacheprovider")

try:
    import matplotlib  # noqa: F401
    HAVE_MATPLOTLIB = True
except ImportError:
    HAVE_MATPLOTLIB = False


def environment_without_xdist():
    # Under pytest-xdist, a benchmark run started by a worker would take itself for a worker
    # too, and pytest-benchmark disables benchmarks in xdist workers.
    return {name: value for name, value in os.environ.items()
            if not name.startswith("PYTEST_XDIST")}


def run_python(*args, timeout=120):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, check=False,
                          env=environment_without_xdist())


# --- the numbers of extra_info ------------------------------------------------------------------


def test_performance_facts_place_a_kernel_under_the_roofline():
    roofline = Roofline(peak_flops_per_second=1e12, peak_bytes_per_second=1e11)
    cost = types.SimpleNamespace(flops=4e9, bytes_accessed=1e8, transcendentals=7)
    facts = performance_facts(cost, 0.008, roofline, xla_median_seconds=0.004, paired_ratio=1.9)
    assert facts["arithmetic_intensity"] == 40.0
    assert facts["roofline_bound"] == "compute"  # 4 ms of FLOPs against 1 ms of bytes
    assert facts["roofline_seconds"] == pytest.approx(0.004)
    assert facts["fraction_of_roofline"] == pytest.approx(0.5)
    assert facts["achieved_flops_per_second"] == pytest.approx(5e11)
    assert facts["achieved_bytes_per_second"] == pytest.approx(1.25e10)
    assert facts["speedup_vs_xla"] == pytest.approx(0.5)
    assert facts["kernel_over_xla"] == 1.9  # the paired ratio, when there is one
    copy = performance_facts(types.SimpleNamespace(flops=0, bytes_accessed=2e9), 0.04, roofline,
                             None)
    assert copy["roofline_bound"] == "memory" and copy["arithmetic_intensity"] == 0
    assert copy["fraction_of_roofline"] == pytest.approx(0.5)
    assert "xla_median" not in copy


def test_the_roofline_counts_every_tensorcore_of_every_device():
    from pytest_pallas.backend import chip_info

    v5e, v4 = chip_info("v5e"), chip_info("v4")  # v4: a megacore of two TensorCores
    assert roofline_of(v5e).peak_flops_per_second == v5e.bf16_ops_per_second
    assert roofline_of(v4).peak_bytes_per_second == 2 * v4.mem_bw_bytes_per_second
    assert roofline_of(v5e, devices=8).peak_flops_per_second == 8 * v5e.bf16_ops_per_second


def test_random_inputs_are_random_and_never_zero_filled():
    key = jax.random.key(1)
    for dtype in ("float32", "bfloat16", "int32"):
        values = np.asarray(random_array(key, (64, 128), dtype)).astype(np.float64)
        assert str(random_array(key, (2,), dtype).dtype) == dtype
        assert np.count_nonzero(values) > 0.99 * values.size
        assert len(np.unique(values)) > 100


SMALL = {
    "add": [(3, 130), (3, 130)], "sum": [(5, 8, 130)], "matmul": [(8, 300), (300, 130)],
    "matmul_activation": [(8, 300), (300, 130)], "batched_matmul": [(2, 8, 300), (2, 300, 16)],
    "softmax": [(8, 130)], "attention": [(8, 32), (24, 32), (24, 32)],
    "mha": [(2, 3, 8, 32), (2, 3, 24, 32), (2, 3, 24, 32)],
    "mqa": [(2, 3, 8, 32), (2, 24, 32), (2, 24, 32)], "copy": [(9, 130)],
}


@pytest.mark.parametrize("op", [*SMALL, "ppermute"])
def test_each_xla_version_computes_its_op(op):
    """The baseline must be the op itself, or "vs XLA" compares with something else."""
    oracle = get_operation(op).load_oracle()
    if op == "ppermute":
        from jax.sharding import Mesh, PartitionSpec

        mesh = Mesh(np.array(jax.devices()[:2]), ("ring",))
        body = functools.partial(xla_version(op), axis_name="ring", shift=1)
        x = random_array(jax.random.key(0), (2 * 8, 128))
        result = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=PartitionSpec("ring"),
                                       out_specs=PartitionSpec("ring")))(x)
        expected = oracle(np.asarray(x), shift=1, devices=2)
        np.testing.assert_array_equal(np.asarray(result), expected)
        return
    args = [random_array(jax.random.key(i), shape) for i, shape in enumerate(SMALL[op])]
    kwargs = {"activation": jax.nn.gelu} if op == "matmul_activation" else {}
    result = jax.jit(functools.partial(xla_version(op), **kwargs))(*args)
    expected = oracle(*[np.asarray(a) for a in args], **kwargs)
    assert_allclose(result, expected, reduction_length=300 if "matmul" in op else 130)


def test_the_table_says_what_vs_xla_and_roofline_mean():
    records = [
        {"name": "bench_a[reference]", "median": 0.0123, "speedup_vs_xla": 0.05,
         "fraction_of_roofline": 2e-5, "roofline_bound": "memory", "chip": "v5e",
         "roofline_meaningful": False},
        {"name": "bench_b", "median": 4.2e-4, "speedup_vs_xla": 1.5,
         "fraction_of_roofline": 0.62, "roofline_bound": "compute", "chip": "v5e",
         "roofline_meaningful": False},
    ]
    lines = summary_lines(records)
    assert lines[0].split() == ["kernel", "median", "vs", "XLA", "fraction", "of", "roofline"]
    assert "12.3 ms" in lines[2] and "20x slower" in lines[2] and "2.0e-05 (memory)" in lines[2]
    assert "420 us" in lines[3] and "1.50x faster" in lines[3] and "######...." in lines[3]
    assert "62.0% (compute)" in lines[3]
    assert "interpreted on the CPU" in lines[-1]


def test_the_table_shows_the_tpu_estimate_per_chip_where_one_was_made():
    records = [
        {"name": "bench_a", "median": 0.0123, "speedup_vs_xla": 0.05, "chip": "v5e",
         "tpu_estimate": {"v5e": {"seconds": 2.5e-5}, "v6e": {"error": "rejected"}}},
        {"name": "bench_b", "median": 4.2e-4, "speedup_vs_xla": 1.5, "chip": "v5e"},
    ]
    lines = summary_lines(records)
    assert lines[0].split()[:6] == ["kernel", "median", "v5e", "est.", "v6e", "est."]
    assert lines[2].split()[:6] == ["bench_a", "12.3", "ms", "25", "us", "-"]
    assert lines[3].split()[:5] == ["bench_b", "420", "us", "-", "-"]
    assert any(line.startswith("'<chip> est.': the TPU compiler's schedule") for line in lines)


# --- the ratio gate on synthetic files ------------------------------------------------------------


def bench_entry(name, median, xla_median, *, shapes=((256, 1024),), backend="cpu-interpret-tpu"):
    info = {"shapes": [list(s) for s in shapes], "dtypes": ["float32"], "backend": backend,
            "chip": "v5e"}
    if xla_median is not None:
        info.update(xla_median=xla_median, kernel_over_xla=median / xla_median,
                    kernel_over_xla_min=median / xla_median)
    return {"name": name.split("::")[-1], "fullname": name, "stats": {"median": median},
            "extra_info": info}


def write_run(path, *entries):
    path.write_text(json.dumps({"benchmarks": list(entries), "machine_info": {}}))
    return str(path)


def gate(*args):
    completed = run_python("-m", "pytest_pallas.bench.gate", *args)
    return completed.returncode, completed.stdout, completed.stderr


def test_a_slower_machine_raises_no_alarm_a_slower_kernel_does(tmp_path):
    baseline = write_run(
        tmp_path / "base.json",
        bench_entry("b.py::steady", 0.010, 0.001), bench_entry("b.py::slowed", 0.020, 0.001),
        bench_entry("b.py::faster", 0.030, 0.001), bench_entry("b.py::gone", 0.01, 0.001),
        bench_entry("b.py::resized", 0.01, 0.001), bench_entry("b.py::no_xla", 0.01, None))
    # Everything 3x slower (a slower runner), except: "slowed" 2x more, "faster" 2x less.
    current = write_run(
        tmp_path / "current.json",
        bench_entry("b.py::steady", 0.030, 0.003), bench_entry("b.py::slowed", 0.120, 0.003),
        bench_entry("b.py::faster", 0.045, 0.003), bench_entry("b.py::new", 0.01, 0.001),
        bench_entry("b.py::resized", 0.04, 0.001, shapes=((512, 1024),)),
        bench_entry("b.py::no_xla", 0.03, None))
    verdicts = {v.name: v for v in benchmark_gate.judge(benchmark_gate.load_results(baseline),
                                                        benchmark_gate.load_results(current))}
    assert {name: v.status for name, v in verdicts.items()} == {
        "b.py::steady": "ok", "b.py::slowed": "regressed", "b.py::faster": "improved",
        "b.py::new": "new", "b.py::resized": "incomparable", "b.py::no_xla": "no XLA time",
        "b.py::gone": "missing"}
    assert verdicts["b.py::slowed"].change == pytest.approx(2.0)
    assert verdicts["b.py::resized"].note == "shapes changed"

    status, out, _ = gate("--baseline", baseline, "--current", current, "--max-slowdown", "1.5")
    assert status == 1
    assert "b.py::slowed" in out and "REGRESSED" in out and "2.00x" in out
    assert "benchmark gate: 1 regressed, 1 improved, 1 ok of 3 compared" in out


def test_the_gate_exit_statuses(tmp_path):
    base = write_run(tmp_path / "a.json", bench_entry("b::k", 0.01, 0.001),
                     bench_entry("b::gone", 0.01, 0.001))
    same = write_run(tmp_path / "b.json", bench_entry("b::k", 0.014, 0.001))
    assert gate("--baseline", base, "--current", same)[0] == 0  # 1.4x < 1.5x
    assert gate("--baseline", base, "--current", same, "--max-slowdown", "1.3")[0] == 1
    assert gate("--baseline", base, "--current", same, "--fail-on-missing")[0] == 1
    status, _, err = gate("--baseline", str(tmp_path / "absent.json"), "--current", same)
    assert status == 2 and "cannot read" in err and err.count("\n") == 1
    other = write_run(tmp_path / "c.json", bench_entry("b::k", 0.01, 0.001, backend="tpu"))
    status, _, err = gate("--baseline", base, "--current", other)
    assert status == 2 and "nothing was judged" in err


def test_by_default_a_regression_must_show_in_the_fastest_and_the_median_rounds(tmp_path):
    def entry(ratio_min, ratio_median):
        result = bench_entry("b::k", 0.01, 0.001)
        result["extra_info"].update(kernel_over_xla_min=ratio_min, kernel_over_xla=ratio_median)
        return result

    base = write_run(tmp_path / "base.json", entry(10.0, 10.0))
    one_lucky_round = write_run(tmp_path / "lucky.json", entry(20.0, 11.0))
    slower = write_run(tmp_path / "slower.json", entry(19.0, 21.0))
    assert gate("--baseline", base, "--current", one_lucky_round)[0] == 0
    assert gate("--baseline", base, "--current", one_lucky_round, "--statistic", "min")[0] == 1
    status, out, _ = gate("--baseline", base, "--current", slower)
    assert status == 1 and "1.90x" in out  # the smaller of the two changes


def test_several_baselines_give_the_median_ratio(tmp_path):
    runs = [write_run(tmp_path / f"{i}.json", bench_entry("b::k", median, 0.001))
            for i, median in enumerate((0.010, 0.030, 0.011))]  # one outlier
    combined = benchmark_gate.combine_baselines([benchmark_gate.load_results(r) for r in runs])
    assert combined["b::k"].ratio("min") == pytest.approx(11.0)
    assert combined["b::k"].ratio("median") == pytest.approx(11.0)
    current = write_run(tmp_path / "now.json", bench_entry("b::k", 0.012, 0.001))
    assert gate("--baseline", *runs, "--current", current)[0] == 0


# --- real runs ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def softmax_runs(tmp_path_factory):
    """Short real runs of the reference softmax benchmark: two baselines (the first also
    autosaved to pytest-benchmark's storage), one run with the kernel run eight times per call
    (--bench-slowdown softmax=8) and an unchanged rerun, the last two also compared with the
    saved baseline by pytest-benchmark. The slowed run sits between the baselines: on a
    machine whose load drifts, their median is the fairest reference for it."""
    directory = tmp_path_factory.mktemp("softmax_runs")
    storage = f"--benchmark-storage=file://{directory / 'storage'}"
    runs = {}
    for label, extra in (
        ("baseline", ["--benchmark-autosave"]),
        # Thresholds far from the noise of a shared machine: these tests check that real
        # files are judged, not how small a slowdown is caught (benchmarks/regression_study.py
        # measures that).
        ("slowed", ["--bench-slowdown=softmax=8", "--benchmark-compare=0001",
                    "--benchmark-compare-fail=min:5%"]),
        ("baseline2", []),
        ("unchanged", ["--benchmark-compare=0001", "--benchmark-compare-fail=min:300%"]),
    ):
        path = directory / f"{label}.json"
        completed = run_python(
            "-m", "pytest", f"{BENCH_SOFTMAX}[reference]", "--benchmark-only", *NO_CACHE,
            # The TPU interpreter for every kernel: in the plain path, one softmax costs
            # less than a call's own overhead, and eight of them hardly more than one.
            "--pallas-seed=0", "--pallas-interpret=tpu-always",
            f"--benchmark-json={path}", "--benchmark-max-time=1.0",
            "--benchmark-min-rounds=20", storage, *extra, timeout=240)
        assert path.exists(), completed.stdout[-3000:] + completed.stderr[-2000:]
        runs[label] = (str(path), completed)
    return runs


def test_a_benchmark_records_what_the_issue_asks_for(softmax_runs):
    path, completed = softmax_runs["baseline"]
    assert completed.returncode == 0, completed.stdout[-3000:]
    stdout = completed.stdout
    with open(path, encoding="utf-8") as handle:
        [entry] = json.load(handle)["benchmarks"]
    info = entry["extra_info"]
    assert info["operation"] == "softmax" and info["implementation"] == "reference"
    assert info["xla_version"] == "softmax" and info["kwargs"] == {}
    assert info["shapes"] == [[256, 1024]] and info["dtypes"] == ["float32"]
    assert info["blocks"] is None
    assert info["flops"] == 4 * 256 * 1024 and info["bytes_accessed"] == 2 * 4 * 256 * 1024
    assert info["arithmetic_intensity"] == pytest.approx(0.5)
    for key in ("achieved_flops_per_second", "achieved_bytes_per_second",
                "peak_flops_per_second", "peak_bytes_per_second", "fraction_of_roofline",
                "xla_median", "xla_min", "speedup_vs_xla", "kernel_over_xla",
                "kernel_over_xla_min", "first_call_seconds", "xla_calls_per_round"):
        assert info[key] > 0, key
    assert info["roofline_bound"] == "memory" and info["roofline_meaningful"] is False
    assert info["achieved_flops_per_second"] == pytest.approx(
        info["flops"] / entry["stats"]["median"]
    )
    assert info["backend"] == "cpu-interpret-tpu" and info["interpreter"] == "tpu"
    assert info["jax"] == jax.__version__ and info["jaxlib"]
    assert info["timer"] == "process_time"  # the CPU default (no --benchmark-timer given)
    # Compilation and the first call are outside the statistics.
    assert entry["stats"]["rounds"] >= 20 and info["first_call_seconds"] > entry["stats"]["min"]
    assert entry["group"] == "softmax"
    # The table at the end of the run.
    assert "pallas benchmarks" in stdout
    assert any(line.startswith("bench_softmax[reference]") and "slower" in line
               for line in stdout.splitlines())
    # With libtpu, the TPU compiler's estimate for the run's chip, beside the CPU time.
    if compile_check.libtpu_version() is None:
        assert "tpu_estimate" not in info
        return
    estimate = info["tpu_estimate"]["v5e"]
    assert estimate["libtpu"] == compile_check.libtpu_version() and estimate["chip"] == "v5e"
    [kernel] = estimate["kernels"]
    assert kernel["grid_steps"] >= 1 and kernel["bound"] in ("compute", "memory", "overhead")
    assert estimate["seconds"] == kernel["seconds"] > 0
    header = next(line for line in stdout.splitlines() if line.startswith("kernel "))
    assert "v5e est." in header


def test_unchanged_code_passes_the_gate_and_an_8x_slower_kernel_fails_it(softmax_runs):
    baselines = [softmax_runs["baseline"][0], softmax_runs["baseline2"][0]]
    status, out, err = gate("--baseline", *baselines, "--current", softmax_runs["unchanged"][0],
                            "--max-slowdown", "4")
    assert status == 0, out + err
    status, out, err = gate("--baseline", *baselines, "--current", softmax_runs["slowed"][0],
                            "--max-slowdown", "3")
    assert status == 1, out + err
    assert "REGRESSED" in out


def test_pytest_benchmark_autosave_compare_and_compare_fail_work_with_it(softmax_runs):
    saved = softmax_runs["baseline"][1]
    assert "Saved benchmark data in" in saved.stdout + saved.stderr
    unchanged = softmax_runs["unchanged"][1]
    assert unchanged.returncode == 0, unchanged.stdout[-3000:]
    assert "Comparing against benchmarks from: " in unchanged.stdout + unchanged.stderr
    assert "/0001_" in unchanged.stdout + unchanged.stderr
    slowed = softmax_runs["slowed"][1]
    assert slowed.returncode == 1
    assert "Performance has regressed" in slowed.stdout + slowed.stderr
    assert "Field 'min' has failed PercentageRegressionCheck" in slowed.stdout + slowed.stderr


def test_benchmark_disable_runs_each_kernel_once_untimed(run_pytest, outside_xdist):
    result = run_pytest(f"{BENCH_SOFTMAX}[reference]", "--benchmark-disable", "-q")
    result.assert_outcomes(passed=1)
    assert "pallas benchmarks" not in result.stdout.str()
    assert "fixture was not used" not in result.stdout.str()


# A user's kernel, for the tests that benchmark one.
DOUBLE_KERNEL = textwrap.dedent("""
    import os
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def double(x):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2
        return pl.pallas_call(kernel, out_shape=x)(x)
    """)


def test_a_users_benchmark_with_its_own_label(run_pytest, pytester, tmp_path, outside_xdist):
    pytester.makepyfile(test_mine=DOUBLE_KERNEL + textwrap.dedent("""
        def test_double(pallas_benchmark):
            x = pallas_benchmark.random((8, 128))
            out = pallas_benchmark("double", double, x, xla_fn=lambda x: x * 2,
                                   cost=pl.CostEstimate(flops=1024, transcendentals=0,
                                                        bytes_accessed=8192))
            assert (out == x * 2).all()
        """))
    path = tmp_path / "mine.json"
    result = run_pytest("--benchmark-max-time=0.05", f"--benchmark-json={path}")
    result.assert_outcomes(passed=1)
    [entry] = json.loads(path.read_text())["benchmarks"]
    assert entry["extra_info"]["operation"] == "double"
    assert entry["extra_info"]["flops"] == 1024 and entry["extra_info"]["kernel_over_xla"] > 0


def test_an_interrupted_run_leaves_the_benchmark_storage_as_it_was(run_pytest, pytester, tmp_path,
                                                                   monkeypatch, outside_xdist):
    pytester.makepyfile(test_mine=DOUBLE_KERNEL + textwrap.dedent("""
        def test_double(pallas_benchmark):
            x = pallas_benchmark.random((8, 128))
            pallas_benchmark("double", double, x, xla_fn=lambda x: x * 2)

        def test_ctrl_c():
            if os.environ.get("INTERRUPT"):
                raise KeyboardInterrupt
        """))
    storage = tmp_path / "storage"
    common = ("--benchmark-max-time=0.05", "--benchmark-autosave",
              f"--benchmark-storage=file://{storage}")
    complete = run_pytest(*common, f"--benchmark-json={tmp_path / 'complete.json'}")
    complete.assert_outcomes(passed=2)
    [saved] = storage.rglob("*.json")
    saved_text = saved.read_text()
    assert json.loads(saved_text)["pallas"] == {"complete": True}

    monkeypatch.setenv("INTERRUPT", "1")
    partial_json = tmp_path / "partial.json"
    interrupted = run_pytest(*common, f"--benchmark-json={partial_json}")
    assert interrupted.ret == pytest.ExitCode.INTERRUPTED
    interrupted.stdout.fnmatch_lines(["*pallas: the run was interrupted: its benchmarks were NOT "
                                      "saved to the benchmark storage*"])
    # Storage holds the complete run only, byte for byte; the partial run is not its newest.
    assert list(storage.rglob("*.json")) == [saved] and saved.read_text() == saved_text
    # The file asked for by name is written, valid, marked incomplete, and the gate refuses it.
    assert json.loads(partial_json.read_text())["pallas"] == {"complete": False}
    status, out, err = gate("--baseline", str(tmp_path / "complete.json"),
                            "--current", str(partial_json))
    assert status == 2 and "is from an interrupted run" in err, out + err


# --- the roofline plot ----------------------------------------------------------------------------


def plot_input(tmp_path):
    roof = {"peak_flops_per_second": 1.97e14, "peak_bytes_per_second": 8.2e11, "chip": "v5e",
            "roofline_meaningful": True}
    entries = [
        {"name": "bench_matmul", "stats": {"median": 1e-3}, "extra_info": {
            **roof, "flops": 1e11, "bytes_accessed": 1e8, "arithmetic_intensity": 1000.0,
            "achieved_flops_per_second": 1e14, "fraction_of_roofline": 0.51,
            "xla_median": 1.2e-3, "tpu_estimate": {"v5e": {"seconds": 6e-4}}}},
        {"name": "bench_copy", "stats": {"median": 1e-3}, "extra_info": {
            **roof, "flops": 0, "bytes_accessed": 5e8, "arithmetic_intensity": 0.0,
            "achieved_flops_per_second": 0.0, "achieved_bytes_per_second": 5e11,
            "fraction_of_roofline": 0.61}},
    ]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"benchmarks": entries}))
    return str(path)


@pytest.mark.skipif(not HAVE_MATPLOTLIB,
                    reason="matplotlib is not installed; pip install -e '.[dev,plot]'")
def test_the_roofline_plot_command_writes_the_image(tmp_path):
    output = tmp_path / "roofline.svg"
    completed = run_python("-m", "pytest_pallas.bench.plot", plot_input(tmp_path),
                           "-o", str(output))
    assert completed.returncode == 0, completed.stderr
    assert output.read_text().lstrip().startswith(("<?xml", "<svg"))
    assert "bench_matmul" in output.read_text()
    assert "the TPU compiler's estimate for the chip" in output.read_text()


def test_the_roofline_plot_without_matplotlib_says_so_in_one_line(tmp_path):
    script = ("import sys; sys.modules['matplotlib'] = None\n"
              "from pytest_pallas.bench.plot import main\n"
              f"sys.exit(main([{plot_input(tmp_path)!r}, '-o', {str(tmp_path / 'r.svg')!r}]))")
    completed = run_python("-c", script)
    assert completed.returncode == 1
    assert completed.stderr.strip().splitlines() == [MISSING_MATPLOTLIB]
    assert "pip install 'pytest-pallas[plot]'" in MISSING_MATPLOTLIB
    assert not (tmp_path / "r.svg").exists()



# --- XLA on one thread, in a user's project ----------------------------------------------------

USER_BENCHMARK = '''
import os

import jax


def test_softmax_speed(pallas_benchmark):
    x = pallas_benchmark.random((8, 128))
    pallas_benchmark("softmax", lambda x: jax.nn.softmax(x, axis=-1), x)
    print("XLA_FLAGS at the benchmark:", os.environ.get("XLA_FLAGS"))
'''


PLAIN_BENCHMARK = '''
import os


def test_plain_speed(benchmark):
    benchmark(sum, range(10))
    print("XLA_FLAGS at the benchmark:", os.environ.get("XLA_FLAGS"))
'''


@pytest.mark.parametrize("case", ["collected", "benchmark-only with a Pallas flag",
                                  "jax started at import", "no pallas_benchmark"])
def test_a_users_benchmarks_get_single_threaded_xla(pytester, outside_xdist, monkeypatch, case):
    """Without this repository's benchmarks/conftest.py: the plugin sets XLA_FLAGS itself."""
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    pytester.makepyfile(test_user_bench=USER_BENCHMARK if case != "no pallas_benchmark"
                        else PLAIN_BENCHMARK)
    args = ["-p", "no:xdist", *NO_CACHE, "-s", "--benchmark-json=bench.json",
            "--benchmark-min-rounds=2", "--benchmark-max-time=0.01"]
    if case == "no pallas_benchmark":
        # A pytest-benchmark suite that knows nothing of Pallas: XLA is left alone.
        result = pytester.runpytest_subprocess(*args, "--benchmark-only", timeout=240)
        assert result.ret == 0, result.stdout.str()
        result.stdout.fnmatch_lines(["*XLA_FLAGS at the benchmark: None*"])
        return
    if case == "benchmark-only with a Pallas flag":
        # The flag makes the plugin start JAX's CPU client at configure time.
        args += ["--benchmark-only", "--pallas-interpret=tpu"]
    if case == "jax started at import":
        pytester.makeconftest("import jax.numpy as jnp\nONES = jnp.ones(3)\n")
    result = pytester.runpytest_subprocess(*args, timeout=240)
    assert result.ret == 0, result.stdout.str()
    [entry] = json.loads((pytester.path / "bench.json").read_text())["benchmarks"]
    threads = entry["extra_info"]["xla_threads"]
    if case == "jax started at import":
        assert threads == "multi-threaded"
        result.stdout.fnmatch_lines(["XLA ran multi-threaded: JAX had started before the "
                                     "benchmarks were collected*"])
    else:
        assert threads == "single-threaded"
        result.stdout.fnmatch_lines(
            ["*XLA_FLAGS at the benchmark: *intra_op_parallelism_threads=1*"])
