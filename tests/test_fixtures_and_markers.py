"""The fixtures and markers a user sees: pallas_backend, pallas_key, device_mesh, the markers,
device counts, the report header and race detection."""

import re
import textwrap

import hypothesis  # noqa: F401  (imported by the plugin in each in-process run; slow to redo)
import pytest

import pytest_pallas.strategies  # noqa: F401
from pytest_pallas.plugin.options import DEFAULT_DEVICES

try:
    # Every interpreted pallas_call's lowering imports the GPU interpreter, which registers
    # MLIR dialects; pytester's in-process runs drop it from sys.modules afterwards and a
    # second registration fails, so keep it imported (see conftest.py).
    import jax._src.pallas.mosaic_gpu.interpret.interpret_pallas_call  # noqa: F401
except ImportError:
    pass

NO_CACHE = ("-p", "no:cacheprovider")


def run_inline(pytester, source, *args):
    pytester.makepyfile(textwrap.dedent(source))
    return pytester.runpytest(*NO_CACHE, *args)


# --- pallas_backend ------------------------------------------------------------


def test_pallas_backend_describes_the_default_cpu_backend(pytester):
    result = run_inline(pytester, """
        from jax.experimental.pallas import tpu as pltpu

        def test_backend(pallas_backend):
            assert pallas_backend.platform == "cpu"
            assert pallas_backend.is_tpu is False
            assert pallas_backend.interpreter == "tpu"
            assert pallas_backend.chip == "v5e"
            assert str(pallas_backend.tpu_info.chip_version) == "v5e"
            assert pallas_backend.tpu_info.vmem_capacity_bytes == 128 * 2**20
            params = pallas_backend.interpret_params
            assert isinstance(params, pltpu.InterpretParams)
            assert params.uninitialized_memory == "nan"
            assert params.detect_races is False
            assert pallas_backend.device_count >= 1
        """)
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize("args, chip, interpreter, params", [
    # Routed: a kernel the TPU interpreter would run no differently takes the plain path,
    # on a chip of two TensorCores too.
    (["--pallas-chip=v4"], "v4", "tpu", "RoutedInterpretParams"),
    (["--pallas-interpret=plain"], "v5e", "plain", "True"),
    (["--pallas-detect-races"], "v5e", "tpu", "InterpretParams races"),
], ids=["chip", "plain", "detect-races"])
def test_pallas_backend_follows_the_flags(pytester, args, chip, interpreter, params):
    result = run_inline(pytester, """
        def test_backend(pallas_backend):
            params = pallas_backend.interpret_params
            described = "True" if params is True else type(params).__name__
            if params is not True and params.detect_races:
                described += " races"
            print("BACKEND", pallas_backend.chip, pallas_backend.interpreter, described)
        """, "-s", *args)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*BACKEND {chip} {interpreter} {params}"])


# --- pallas_key ------------------------------------------------------------------

KEY_TESTS = """
    import jax, jax.numpy as jnp

    def test_a(pallas_key):
        print("KEY a", jax.random.key_data(pallas_key).tolist())
        assert jnp.issubdtype(pallas_key.dtype, jax.dtypes.prng_key)

    def test_b(pallas_key):
        print("KEY b", jax.random.key_data(pallas_key).tolist())
    """


def keys_printed(result):
    return dict(re.findall(r"KEY (\w) (\[.*?\])", result.stdout.str()))


def test_pallas_key_depends_on_the_seed_and_the_test_id(pytester):
    pytester.makepyfile(textwrap.dedent(KEY_TESTS))
    first = keys_printed(pytester.runpytest(*NO_CACHE, "-s", "--pallas-seed=7"))
    again = keys_printed(pytester.runpytest(*NO_CACHE, "-s", "--pallas-seed=7"))
    other_seed = keys_printed(pytester.runpytest(*NO_CACHE, "-s", "--pallas-seed=8"))
    assert set(first) == {"a", "b"}
    assert first == again, "the same --pallas-seed and test id must give the same key"
    assert first["a"] != first["b"], "different test ids must get different keys"
    assert other_seed["a"] != first["a"]


# --- device_mesh and devices(n) ------------------------------------------------------


def test_device_mesh_makes_a_mesh_or_skips_naming_the_flag(pytester):
    result = run_inline(pytester, """
        import jax

        def test_two(device_mesh):
            mesh = device_mesh(2, axis_name="i")
            assert isinstance(mesh, jax.sharding.Mesh)
            assert mesh.axis_names == ("i",)
            assert mesh.devices.shape == (2,)
            assert len(set(mesh.devices.flat)) == 2

        def test_too_many(device_mesh):
            device_mesh(4096)
            raise AssertionError("unreachable: the fixture skips")
        """, "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines([("SKIPPED*needs 4096 devices, JAX sees * CPU devices; run with "
                                  "--pallas-devices=4096*")])


def test_devices_marker_skips_when_there_are_too_few(pytester):
    result = run_inline(pytester, """
        import jax, pytest

        @pytest.mark.devices(2)
        def test_enough():
            assert jax.device_count() >= 2

        @pytest.mark.devices(4096)
        def test_too_many():
            raise AssertionError("unreachable: the marker skips")
        """, "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*needs 4096 devices*--pallas-devices=4096*"])


# --- tpu_only, interpret_only, tpu_generation --------------------------------------------


def test_tpu_only_is_skipped_on_the_cpu_and_interpret_only_runs(pytester):
    result = run_inline(pytester, """
        import pytest

        @pytest.mark.tpu_only
        def test_needs_a_chip():
            raise AssertionError("unreachable on the CPU")

        @pytest.mark.interpret_only
        def test_interpreted(pallas_backend):
            assert pallas_backend.platform == "cpu"
        """, "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    # Reported at the test's own line, as pytest reports a skipif mark, not the plugin's.
    result.stdout.fnmatch_lines([("SKIPPED ?1? test_*.py:[0-9]: tpu_only: needs a real TPU (run "
                                  "with --pallas-tpu on a TPU VM)")])


def test_tpu_generation_stands_in_for_that_chip_on_the_cpu(pytester):
    result = run_inline(pytester, """
        import pytest
        from jax.experimental.pallas import tpu as pltpu

        @pytest.mark.tpu_generation("v4")
        def test_v4(pallas_backend):
            info = pltpu.get_tpu_info()
            assert str(info.chip_version) == "v4"
            assert info.vmem_capacity_bytes == 16 * 2**20
            assert pallas_backend.chip == "v4"
            assert pallas_backend.tpu_info.num_cores == 2  # megacore
            assert pallas_backend.interpret_params.num_cores_or_threads == 2

        @pytest.mark.tpu_generation("v4", "v6e")
        def test_chip_flag_among_them_wins(pallas_backend):
            assert str(pltpu.get_tpu_info().chip_version) == "v6e"

        @pytest.mark.pallas
        def test_unmarked_keeps_the_session_chip():
            assert str(pltpu.get_tpu_info().chip_version) == "v6e"
        """, "--pallas-chip=v6e")
    result.assert_outcomes(passed=3)


def test_strict_markers_accepts_every_marker(pytester):
    result = run_inline(pytester, """
        import pytest

        @pytest.mark.pallas
        @pytest.mark.interpret_only
        @pytest.mark.tpu_generation("v5e", "v6e")
        @pytest.mark.devices(1)
        def test_all():
            pass

        @pytest.mark.tpu_only
        def test_tpu():
            pass
        """, "--strict-markers")
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == 0


# --- device counts: a fresh process, since JAX fixes them when it starts ---------------

DEVICE_COUNT_TEST = """
    import jax, pytest

    @pytest.mark.pallas
    def test_count(pallas_backend):
        print("DEVICES", jax.device_count("cpu"), pallas_backend.device_count)
    """


@pytest.fixture
def clean_device_environment(monkeypatch):
    for name in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES", "JAX_PLATFORMS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    return monkeypatch


@pytest.mark.parametrize("args, xla_flags, expected", [
    (["--pallas-devices=2"], None, 2),
    ([], "--xla_force_host_platform_device_count=3", 3),
    ([], None, DEFAULT_DEVICES),
], ids=["flag", "xla-flags-win-over-default", "default"])
def test_device_count_in_a_fresh_process(pytester, clean_device_environment, args, xla_flags,
                                         expected):
    if xla_flags:
        clean_device_environment.setenv("XLA_FLAGS", xla_flags)
    pytester.makepyfile(textwrap.dedent(DEVICE_COUNT_TEST))
    result = pytester.runpytest_subprocess(*NO_CACHE, "-s", *args, timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*DEVICES {expected} {expected}"])


# --- the report header ---------------------------------------------------------------


def test_header_line_only_with_a_pallas_flag(pytester):
    pytester.makepyfile(textwrap.dedent("""
        import pytest

        @pytest.mark.pallas
        def test_marked():
            pass

        def test_plain():
            pass
        """))
    quiet = pytester.runpytest(*NO_CACHE)
    quiet.assert_outcomes(passed=2)
    assert "pallas:" not in quiet.stdout.str()

    flagged = pytester.runpytest(*NO_CACHE, "--pallas-interpret=tpu", "--pallas-seed=11")
    flagged.assert_outcomes(passed=2)
    flagged.stdout.fnmatch_lines([
        ("pallas: CPU, tpu interpreter, standing in for TPU v5e (1 TensorCore); * CPU devices* "
         "simulated, for "
         "multi-device kernels (--pallas-devices=N to change; tests that need an exact count "
         "skip under another); seed 11 (reproduce with --pallas-seed=11); hypothesis profile "
         "pallas-*"),
    ])
    assert sum(line.startswith("pallas:") for line in flagged.stdout.lines) == 1


# --- --pallas-detect-races -------------------------------------------------------------

RACE_TESTS = """
    import jax, jax.numpy as jnp, numpy as np
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def racy(x_hbm, o_ref, buffer, semaphore):
        copy = pltpu.make_async_copy(x_hbm, buffer, semaphore)
        copy.start()
        o_ref[...] = buffer[...]  # read while the DMA may still be writing it
        copy.wait()

    def clean(x_hbm, o_ref, buffer, semaphore):
        copy = pltpu.make_async_copy(x_hbm, buffer, semaphore)
        copy.start()
        copy.wait()
        o_ref[...] = buffer[...]

    def run(kernel):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA(())],
        )(jnp.ones((8, 128), jnp.float32))

    def test_racy():
        jax.block_until_ready(run(racy))

    def test_clean():
        np.testing.assert_array_equal(run(clean), 1.0)

    def test_racy_then_clean():
        # The interpreter keeps only its last kernel's race flag; the race must still count.
        jax.block_until_ready(run(racy))
        np.testing.assert_array_equal(run(clean), 1.0)
    """


def test_detect_races_fails_the_racy_kernel_and_passes_the_clean_one(pytester):
    pytester.makepyfile(textwrap.dedent(RACE_TESTS))
    result = pytester.runpytest(*NO_CACHE, "--pallas-detect-races", "-rf")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([
        "*_ test_racy _*",
        "E   *TpuRuleViolation: TPU rule ?data-race? broken by kernel 'racy at *",
        "*RACE DETECTED*",
    ])
    failed = {line.split("::")[1].split(" ")[0] for line in result.stdout.lines
              if line.startswith("FAILED")}
    assert failed == {"test_racy", "test_racy_then_clean"}

    # Without the flag the same kernels run (interpreted) and nothing checks for races.
    pytester.runpytest(*NO_CACHE, "--pallas-interpret=tpu").assert_outcomes(passed=3)


def test_skips_for_the_simulated_device_count_are_counted_in_the_summary(pytester, run_pytest):
    # A suite written for one device skips itself under the 8 simulated devices; the run
    # exits 0, and -q hides the header: the summary says how many and the flag to pass.
    pytester.makepyfile(test_one_device='''
        import jax, pytest

        @pytest.mark.parametrize("case", range(3))
        def test_single(case):
            if jax.device_count() != 1:
                pytest.skip(f"requires 1 device, found {jax.device_count()}")

        @pytest.mark.devices(16)
        def test_many():
            pass

        def test_other():
            pytest.skip("not about devices")
    ''')
    result = run_pytest("--pallas-interpret=tpu", "--pallas-devices=8", "-q", "-p", "no:xdist")
    result.assert_outcomes(skipped=5)
    result.stdout.fnmatch_lines([
        "pallas: 3 test(s) skipped because they need 1 device(s) and the run simulates 8 CPU "
        "devices; run them with --pallas-devices=1",
        "pallas: 1 test(s) skipped because they need 16 device(s) and the run simulates 8 CPU "
        "devices; run them with --pallas-devices=16",
    ])


def test_the_fixtures_that_opt_a_test_in_are_the_plugins_fixtures():
    """A test that requests one of the plugin's fixtures uses Pallas (session.FIXTURE_NAMES):
    a fixture added to the plugin without joining that list would run outside the backend.
    (``conformance`` is the suite's own: its tests opt in as conformance tests.)"""
    from pytest_pallas.plugin import fixtures
    from pytest_pallas.plugin.session import FIXTURE_NAMES

    defined = {name for name, value in vars(fixtures).items()
               if type(value).__name__ == "FixtureFunctionDefinition"
               or hasattr(value, "_fixture_function_marker")}
    assert set(FIXTURE_NAMES) == defined - {"conformance"}
