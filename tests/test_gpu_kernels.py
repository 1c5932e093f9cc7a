"""GPU kernels in a Pallas test: Mosaic GPU kernels run in JAX's GPU interpreter, Triton ones in
the plain interpreter, none meets the TPU interpreter or a TPU rule (contract section 7)."""

import pathlib
import textwrap
import types

import pytest

from pytest_pallas.hosts import installed_libtpu

pytest.importorskip("absl", reason="jax.experimental.pallas.mosaic_gpu imports absl-py")

DATA = pathlib.Path(__file__).parent / "data" / "gpu_kernels"

HEAD = textwrap.dedent(
    """
    import functools
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    pytestmark = pytest.mark.pallas
    """
)

# JAX's own planted race (tests/pallas/gpu_pallas_interpret_race_detection_test.py,
# test_finds_races_in_cross_thread_gmem_to_smem_copy, in its form that jax 0.10.2's
# interpreter already detects): thread 0 writes SMEM, thread 1 reads it, and only the
# barrier between them orders the two.
RACE = HEAD + textwrap.dedent(
    """
    def make(ordered):
        @functools.partial(
            plgpu.kernel,
            out_type=jax.ShapeDtypeStruct((), jnp.int32),
            scratch_types=dict(smem_ref=plgpu.SMEM((), jnp.int32),
                               barrier=plgpu.Barrier(num_arrivals=1)),
            num_threads=2, thread_name="t",
        )
        def handoff(in_ref, out_ref, smem_ref, barrier):
            t = jax.lax.axis_index("t")

            @pl.when(t == 0)
            def _():
                smem_ref[...] = in_ref[...]
                if ordered:
                    plgpu.barrier_arrive(barrier)

            @pl.when(t == 1)
            def _():
                if ordered:
                    plgpu.barrier_wait(barrier)
                out_ref[...] = smem_ref[...]

        return handoff

    def test_racy_handoff():
        make(ordered=False)(jnp.int32(42)).block_until_ready()

    def test_ordered_handoff():
        assert int(make(ordered=True)(jnp.int32(42))) == 42
    """
)


def test_a_gpu_authors_module_passes_on_the_cpu(pytester):
    """plgpu.kernel, pl.core_map over a plgpu.Mesh, pallas_call with plgpu.CompilerParams
    (built at import, under jit, blocked) and a Triton-parameter kernel, none with interpret=."""
    pytester.makepyfile(test_gpu_author=(DATA / "gpu_author_tests.py").read_text())
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(passed=6)
    assert "AssertionError" not in result.stdout.str()
    assert "TpuRuleViolation" not in result.stdout.str()


def test_the_same_module_fails_without_the_plugin(pytester):
    # Without a GPU and without the plugin, every kernel meets "Only interpret mode is
    # supported on CPU backend": the passes above are the plugin's doing.
    pytester.makepyfile(test_gpu_author=(DATA / "gpu_author_tests.py").read_text())
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:pallas",
                                "-W", "ignore::pytest.PytestUnknownMarkWarning")
    result.assert_outcomes(failed=6)


def test_a_race_fails_under_detect_races_naming_the_kernel(pytester):
    pytester.makepyfile(test_race=RACE)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist",
                                "--pallas-detect-races")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines([
        "E   AssertionError: pallas: JAX's GPU interpreter detected a data race in kernel "
        "'handoff'*",
        "FAILED test_race.py::test_racy_handoff*"])


def test_without_detect_races_the_racy_kernel_is_not_judged(pytester):
    pytester.makepyfile(test_race=RACE)
    pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist").assert_outcomes(passed=2)


def test_a_kernels_own_gpu_interpreter_params_are_kept(pytester):
    # JAX's own race tests pass InterpretGPUParams(detect_races=True) and read the verdict
    # themselves: under the plugin the kernel keeps them, and the test judges the race.
    import dataclasses

    from pytest_pallas._compat import gpu_interpreter

    # From jax 0.11 the detector raises by default; a test that reads the verdict itself
    # asks for it to be recorded, as JAX's own race tests do there.
    own = ("InterpretGPUParams(detect_races=True, on_race='warn')"
           if "on_race" in {f.name for f in dataclasses.fields(gpu_interpreter.gpu_params_class())}
           else "InterpretGPUParams(detect_races=True)")
    pytester.makepyfile(RACE.replace(
        'num_threads=2, thread_name="t",',
        f'num_threads=2, thread_name="t", interpret={own},'
    ).replace(
        "pytestmark = pytest.mark.pallas",
        "pytestmark = pytest.mark.pallas\n"
        "from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call as gpu_interpret\n"
        "from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams",
    ).replace(
        "make(ordered=False)(jnp.int32(42)).block_until_ready()",
        "make(ordered=False)(jnp.int32(42)).block_until_ready()\n"
        "    assert gpu_interpret.get_races().races_found",
    ))
    pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist").assert_outcomes(passed=2)


def test_uninitialised_smem_reads_as_nan(pytester):
    pytester.makepyfile(HEAD + textwrap.dedent(
        """
        @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                           scratch_types=dict(smem=plgpu.SMEM((8, 128), jnp.float32)))
        def reads_unwritten_smem(out_ref, smem):
            out_ref[...] = smem[...] + 1.0

        def test_nan():
            assert np.isnan(np.asarray(reads_unwritten_smem())).all()
        """))
    pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist").assert_outcomes(passed=1)


def test_a_nan_from_unwritten_smem_names_the_gpu_kernel_and_no_tpu_rule(pytester):
    pytester.makepyfile(HEAD + textwrap.dedent(
        """
        from pytest_pallas import assert_allclose

        @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                           scratch_types=dict(smem=plgpu.SMEM((8, 128), jnp.float32)))
        def forgets_to_load(x_gmem, out_gmem, smem):
            out_gmem[...] = smem[...] * 2.0  # smem never received x

        def test_double():
            x = jnp.ones((8, 128), jnp.float32)
            assert_allclose(forgets_to_load(x), 2.0 * np.ones((8, 128)))
        """))
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*pallas: 1024 NaN where the reference is finite. JAX's GPU interpreter fills SMEM and "
        "GMEM a kernel has not written with NaN, so the likely cause is in Mosaic GPU kernel "
        "forgets_to_load*"])
    assert "TPU rule" not in result.stdout.str()


def test_a_gpu_kernel_meets_no_tpu_rule(pytester):
    # A (4, 64) block breaks the TPU's (8, 128) tiling rule; on a GPU it is fine.
    pytester.makepyfile(HEAD + textwrap.dedent(
        """
        from jax.experimental.pallas import triton as pltriton

        def copy(x, params):
            def body(x_ref, o_ref):
                o_ref[...] = x_ref[...]
            spec = pl.BlockSpec((4, 64), lambda i, j: (i, j))
            return pl.pallas_call(body, grid=(2, 2), in_specs=[spec], out_specs=spec,
                                  out_shape=x, compiler_params=params)(x)

        @pytest.mark.parametrize("params", [plgpu.CompilerParams(),
                                            pltriton.CompilerParams(num_warps=4)])
        def test_copy(params):
            x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
            np.testing.assert_array_equal(copy(x, params), x)
        """))
    # The static rules judge it everywhere; the TPU compiler too where libtpu is installed
    # (without the tpu extra, --pallas-compile=all is a usage error).
    compile_all = ("--pallas-compile=all",) if installed_libtpu() is not None else ()
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist", *compile_all)
    result.assert_outcomes(passed=2)


def test_a_kernel_jaxs_interpreters_cannot_run_skips_with_one_line(pytester):
    # JAX's GPU interpreter takes whole-array blocks only, and the plain interpreter has no
    # rule for Mosaic GPU's own primitives: a blocked kernel that commits SMEM runs in neither.
    pytester.makepyfile(HEAD + textwrap.dedent(
        """
        def test_blocked_commit():
            def body(x_ref, o_ref):
                o_ref[...] = x_ref[...] + 1.0
                plgpu.commit_smem()
            x = jnp.ones((8, 128), jnp.float32)
            spec = pl.BlockSpec((4, 128), lambda i: (i, 0))
            pl.pallas_call(body, grid=(2,), in_specs=[spec], out_specs=spec, out_shape=x,
                           compiler_params=plgpu.CompilerParams())(x)
        """))
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([
        "SKIPPED ?1? test_*.py:[0-9]*: pallas: Mosaic GPU kernel 'body at test_*.py:[0-9]*' "
        "cannot run in JAX's plain interpreter "
        "(JAX's GPU interpreter runs only whole-array blocks*commit_smem*"
        "run it with --pallas-gpu on a GPU."])
    assert "TPU interpreter" not in result.stdout.str()


def test_kernel_target_reads_the_compiler_params_and_mesh():
    from jax.experimental.pallas import mosaic_gpu as plgpu
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas import triton as pltriton

    from pytest_pallas._compat.gpu_interpreter import kernel_target

    assert kernel_target(plgpu.CompilerParams()) == "mosaic_gpu"
    assert kernel_target(None, plgpu.Mesh(num_threads=1, thread_name="t")) == "mosaic_gpu"
    assert kernel_target(pltriton.CompilerParams(num_warps=4)) == "triton"
    assert kernel_target(pltpu.CompilerParams()) is None
    assert kernel_target(None, None) is None


def test_the_gpu_interpreter_params_are_found_on_this_jax():
    from pytest_pallas._compat import gpu_interpreter

    params = gpu_interpreter.make_gpu_params(detect_races=True)
    assert gpu_interpreter.is_gpu_params(params)
    assert (params.detect_races, params.uninitialized_memory) == (True, "nan")


def test_a_jax_without_the_gpu_interpreter_turns_it_off_with_a_line(monkeypatch):
    from pytest_pallas import backend
    from pytest_pallas._compat import gpu_interpreter, jax_internals
    from pytest_pallas.plugin.options import PallasOptions

    monkeypatch.setattr(gpu_interpreter, "_PARAMS_HOMES", ("jax._src.pallas.no_such_module",))
    monkeypatch.setattr(jax_internals, "_features_off", {})
    with pytest.warns(jax_internals.JaxFeatureOff, match="GPU interpreter.*is in none of"):
        assert backend.make_gpu_interpret_params(PallasOptions()) is None


# --- --pallas-gpu, with the facts a GPU host would give -------------------------------


def fake_gpu_devices(device_kind="NVIDIA H100 80GB HBM3", count=1):
    """What ``jax.devices("gpu")`` would return on a GPU host: only the facts the plugin reads."""
    devices = [types.SimpleNamespace(device_kind=device_kind) for _ in range(count)]
    return lambda: devices


def test_fake_gpu_device_facts_select_the_gpu_backend():
    from pytest_pallas.backend import select_backend
    from pytest_pallas.plugin.options import PallasOptions

    backend = select_backend(PallasOptions(gpu=True), gpu_devices=fake_gpu_devices(count=2))
    assert (backend.platform, backend.name, backend.device_count) == ("gpu", "gpu", 2)
    assert backend.is_compiled and not backend.is_tpu
    assert backend.interpret_params is None and backend.gpu_interpret_params is None
    assert backend.matmul_precision == "tensorfloat32"
    assert backend.describe() == "GPU NVIDIA H100 80GB HBM3 (2 devices, compiled)"
    with backend.activate():  # a real GPU needs no interpreter
        pass


def test_no_gpu_is_a_usage_error_in_one_line():
    from pytest_pallas.backend import select_backend
    from pytest_pallas.plugin.options import PallasOptions

    with pytest.raises(pytest.UsageError) as raised:
        select_backend(PallasOptions(gpu=True), gpu_devices=lambda: [])
    message = str(raised.value)
    assert message.startswith("--pallas-gpu: JAX sees no GPU;") and "\n" not in message


# --- The comparator follows the backend's matmul precision -----------------------------


def _round_mantissa(x, bits):
    """float32 ``x`` rounded to nearest with ``bits`` explicit mantissa bits (TF32: 10,
    bfloat16: 7), as a GPU's tensor cores or a TPU's MXU take a float32 operand."""
    import numpy as np

    drop = 23 - bits
    raw = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((raw + (1 << (drop - 1))) >> drop) << drop
    return rounded.astype(np.uint32).view(np.float32)


def _products(bits, k=1024):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, k)).astype(np.float32)
    y = rng.standard_normal((k, 64)).astype(np.float32)
    expected = x.astype(np.float64) @ y.astype(np.float64)
    actual = (_round_mantissa(x, bits).astype(np.float64)
              @ _round_mantissa(y, bits).astype(np.float64)).astype(np.float32)
    return actual, expected, k


def test_a_gpu_backend_allows_tf32_products_by_default():
    from pytest_pallas.backend import select_backend
    from pytest_pallas.compare import assert_allclose, backend_matmul_precision
    from pytest_pallas.plugin.options import PallasOptions

    gpu = select_backend(PallasOptions(gpu=True), gpu_devices=fake_gpu_devices())
    actual, expected, k = _products(bits=10)
    with backend_matmul_precision(gpu.matmul_precision):
        assert assert_allclose(actual, expected, reduction_length=k) <= 1.0
    # Interpreted on the CPU the product is float32: the same TF32 result is too far.
    with pytest.raises(AssertionError):
        assert_allclose(actual, expected, reduction_length=k)


def test_a_float32_contract_still_fails_tf32_products_on_a_gpu():
    from pytest_pallas.compare import assert_allclose, backend_matmul_precision

    actual, expected, k = _products(bits=10)
    with backend_matmul_precision("tensorfloat32"):
        # A kernel that promises float32 products (precision=HIGHEST) says so.
        with pytest.raises(AssertionError):
            assert_allclose(actual, expected, reduction_length=k, matmul_precision="float32")
        # And a kernel that accumulates in bfloat16 exceeds what TF32 allows.
        with pytest.raises(AssertionError):
            assert_allclose(_bfloat16_accumulated(k), expected, reduction_length=k)


def _bfloat16_accumulated(k):
    """The ``_products`` matmul summed term by term in a bfloat16 accumulator."""
    import ml_dtypes
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, k)).astype(np.float32)
    y = rng.standard_normal((k, 64)).astype(np.float32)
    total = np.zeros((64, 64), ml_dtypes.bfloat16)
    for i in range(k):
        term = np.outer(x[:, i], y[i, :]).astype(np.float32)
        total = (total.astype(np.float32) + term).astype(ml_dtypes.bfloat16)
    return total.astype(np.float32)


# --- The conformance suite validates GPU implementations --------------------------------


def test_the_reference_mosaic_gpu_kernels_pass_the_conformance_suite(pytester):
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "-p", "no:xdist", "--pallas-seed=0", "--pallas-examples=4",
        "--pallas-impl", "matmul=pytest_pallas.reference_kernels.gpu_matmul:matmul",
        "--pallas-impl", "softmax=pytest_pallas.reference_kernels.gpu_softmax:softmax",
        "--pallas-impl",
        "attention=pytest_pallas.reference_kernels.gpu_flash_attention:attention")
    assert result.ret == 0, result.stdout.str()
    # The interpreters column says where the GPU kernels ran: JAX's GPU interpreter for the
    # SMEM-staged softmax, the plain one for the blocked pallas_calls.
    result.stdout.fnmatch_lines(["matmul *gpu_matmul:matmul *6 *0 * plain *",
                                 "softmax *gpu_softmax:softmax *6 *0 * gpu *",
                                 "attention *gpu_flash_attention:attention *6 *0 * plain *"])


# --- pallas_benchmark under --pallas-gpu (fake device facts; the kernel runs on the CPU) ----


class _FakeBenchmark:
    """pytest-benchmark's fixture, as far as PallasBenchmark uses it; records the order of
    the untimed setups and the timed calls."""

    disabled = False
    group = None
    name = "test_fake"
    _max_time = 0.0
    _min_rounds = 3

    def __init__(self):
        import time

        self._timer = time.perf_counter
        self.extra_info = {}
        self.events = []

    def pedantic(self, target, args=(), setup=None, rounds=1, warmup_rounds=0):
        import statistics

        data = []
        for index in range(warmup_rounds + rounds):
            setup()
            self.events.append("setup")
            begin = self._timer()
            result = target(*args)
            self.events.append("call")
            if index >= warmup_rounds:
                data.append(self._timer() - begin)
        self.stats = types.SimpleNamespace(stats=types.SimpleNamespace(
            median=statistics.median(data), data=data, min=min(data)))
        return result


def _gpu_bench(monkeypatch, device_kind="NVIDIA H200"):
    from pytest_pallas.backend import select_backend
    from pytest_pallas.bench import fixture
    from pytest_pallas.plugin.options import PallasOptions

    monkeypatch.setattr(fixture, "CACHE_FLUSH_BYTES", 4096)  # the CPU stands in for the GPU
    flushes = []
    original = fixture.PallasBenchmark.cache_flush

    def counted(self):
        flush = original(self)
        if flush is None:
            return None

        def recorded():
            flush()
            flushes.append(len(self.benchmark.events))
        return recorded

    monkeypatch.setattr(fixture.PallasBenchmark, "cache_flush", counted)
    backend = select_backend(PallasOptions(gpu=True), gpu_devices=fake_gpu_devices(device_kind))
    benchmark = _FakeBenchmark()
    return fixture.PallasBenchmark(benchmark, backend, timer_chosen=False), benchmark, flushes


def test_a_gpu_benchmark_flushes_l2_before_every_round_and_keeps_the_wall_clock(monkeypatch):
    import time

    bench, benchmark, flushes = _gpu_bench(monkeypatch)
    x = bench.random((64, 64))
    bench("softmax", jax_softmax, x)
    assert benchmark._timer is time.perf_counter  # not the CPU's process_time
    rounds = benchmark.events.count("call")
    # One flush in every untimed setup (after the XLA version's run), then the timed call.
    assert len(flushes) == rounds
    assert all(benchmark.events[i:i + 2] == ["setup", "call"] for i in flushes)
    info = benchmark.extra_info
    assert info["cache_flushed_bytes"] == 4096 and info["platform"] == "gpu"
    assert info["peak_flops_per_second"] == 989.5e12
    assert info["peak_bytes_per_second"] == 4.8e12
    assert info["roofline_meaningful"] is True and info["xla_threads"] is None


def test_an_unknown_gpu_gets_no_roofline(monkeypatch):
    bench, benchmark, _ = _gpu_bench(monkeypatch, device_kind="NVIDIA GeForce RTX 4090")
    assert bench.roofline() is None
    bench("softmax", jax_softmax, bench.random((8, 128)))
    assert benchmark.extra_info["roofline_meaningful"] is False


def jax_softmax(a):
    import jax

    return jax.nn.softmax(a, axis=-1)


def test_each_gpu_constant_names_its_source():
    from pytest_pallas.gpu import gpu_facts

    h100, h200 = gpu_facts("NVIDIA H100 80GB HBM3"), gpu_facts("NVIDIA H200")
    assert (h100.peak_flops_per_second, h100.hbm_bytes_per_second) == (989.5e12, 3.35e12)
    assert (h200.peak_flops_per_second, h200.hbm_bytes_per_second) == (989.5e12, 4.8e12)
    assert h100.smem_bytes_per_block == h200.smem_bytes_per_block == 232448
    for facts in (h100, h200, gpu_facts("NVIDIA H100 PCIe")):
        assert set(facts.sources) == {"peak_flops_per_second", "hbm_bytes_per_second",
                                      "smem_bytes_per_block", "l2_bytes"}


def test_a_jax_whose_pallas_call_moved_turns_the_routing_off(monkeypatch):
    from pytest_pallas._compat import gpu_interpreter, jax_internals

    module = jax_internals.private_attribute("jax._src.pallas.pallas_call")
    monkeypatch.delattr(module, "_pallas_call")
    with pytest.raises(jax_internals.JaxInternalsChanged, match="_pallas_call"):
        with gpu_interpreter.gpu_kernels_routed(None, lambda kernel: None):
            pass


# --- What a GPU enforces and the interpreter does not: SMEM per thread block --------------


SMEM_KERNEL = HEAD + textwrap.dedent(
    """
    def staged(rows):
        @functools.partial(
            plgpu.kernel, out_type=jax.ShapeDtypeStruct((rows, 128), jnp.float32),
            scratch_types=dict(smem=plgpu.SMEM((rows, 128), jnp.float32),
                               loaded=plgpu.Barrier(num_arrivals=1)))
        def staged_copy(x_gmem, out_gmem, smem, loaded):
            plgpu.copy_gmem_to_smem(x_gmem, smem, loaded)
            plgpu.barrier_wait(loaded)
            out_gmem[...] = smem[...]
        return staged_copy

    @pytest.mark.parametrize("rows", [448, 456])  # 229376 and 233472 bytes of SMEM
    def test_staged(rows):
        x = jnp.ones((rows, 128), jnp.float32)
        np.testing.assert_array_equal(staged(rows)(x), x)
    """
)


def test_a_kernel_beyond_a_thread_blocks_smem_fails_on_the_cpu_too(pytester):
    pytester.makepyfile(SMEM_KERNEL)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*GpuLimitExceeded: pallas: Mosaic GPU kernel 'staged_copy' allocates 233480 bytes of "
        "SMEM per thread block > 232448 on H100/H200*",
        "FAILED *test_staged?456?*"])


def test_peak_smem_counts_nested_scopes_once_and_siblings_apart():
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from pytest_pallas.checks.gpu_rules import peak_smem_bytes

    def body(o_ref):
        def outer(a):  # 4096 bytes, live while the inner scopes run
            def first(b):  # 8192 bytes
                o_ref[...] = a[...] + b[...][:8]
            def second(c):  # 2048 bytes, after the first is freed
                o_ref[:, :64] = c[...]
            pl.run_scoped(first, plgpu.SMEM((16, 128), jnp.float32))
            pl.run_scoped(second, plgpu.SMEM((8, 64), jnp.float32))
        pl.run_scoped(outer, plgpu.SMEM((8, 128), jnp.float32))

    kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    closed = jax.make_jaxpr(kernel)()
    mpmd = [e for e in _all_eqns(closed.jaxpr) if e.primitive.name == "mpmd_map"][0]
    assert peak_smem_bytes(mpmd.params["jaxprs"][0]) == 4096 + 8192


def _all_eqns(jaxpr):
    from pytest_pallas.checks.gpu_rules import sub_jaxprs

    for eqn in jaxpr.eqns:
        yield eqn
        for sub in sub_jaxprs(eqn.params):
            yield from _all_eqns(sub)


def test_a_hung_barrier_wait_fails_its_test_under_the_timeout_and_the_run_goes_on(pytester):
    pytester.makepyfile(HEAD + textwrap.dedent(
        """
        @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                           scratch_types=dict(never_arrives=plgpu.Barrier(num_arrivals=1)))
        def waits_forever(out_ref, never_arrives):
            plgpu.barrier_wait(never_arrives)
            out_ref[...] = jnp.zeros((8, 128), jnp.float32)

        def test_hang():
            waits_forever().block_until_ready()

        def test_after():
            pass
        """))
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist",
                                "--pallas-timeout=3")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines([
        "*KernelTimeout: pallas: Mosaic GPU kernel 'waits_forever' (in test_*::test_hang) ran "
        "longer than --pallas-timeout=3s and was stopped*"])


def test_without_absl_a_tpu_users_run_says_nothing_of_the_gpu_interpreter(pytester, monkeypatch):
    # jax's CPU install has no absl-py, which JAX's Mosaic GPU modules import: no GPU kernel
    # can be written there, and a TPU user's run must not warn that a GPU feature is off.
    hidden = pytester.mkdir("hide_absl")
    (hidden / "absl").mkdir()
    (hidden / "absl" / "__init__.py").write_text("raise ImportError('absl-py not installed')\n")
    monkeypatch.setenv("PYTHONPATH", str(hidden))
    pytester.makepyfile(test_add=textwrap.dedent("""
        import jax, pytest
        from jax.experimental import pallas as pl

        def add_kernel(x_ref, y_ref, o_ref):
            o_ref[...] = x_ref[...] + y_ref[...]

        @pytest.mark.pallas
        def test_add(pallas_key):
            x = jax.random.normal(pallas_key, (8, 128))
            out = pl.pallas_call(add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, x)
            assert (out == x + x).all()
        """))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rw", timeout=240)
    result.assert_outcomes(passed=1)
    assert "JaxFeatureOff" not in result.stdout.str()
