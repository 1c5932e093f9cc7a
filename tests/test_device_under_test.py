"""An existing TPU test suite, written with JAX's test utilities, runs on the CPU once the run
opts in: the stand-in chip is the device under test (contract §9), while JAX's devices stay
CPU devices and JAX's interpret-mode test classes keep running on the CPU."""

import textwrap

import pytest

# A TPU test module as kernel libraries write them: absltest classes that gate on JAX's test
# utilities, a kernel called without interpret=, and an interpret-mode class for the CPU.
JAX_STYLE_TPU_TESTS = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np
    from absl.testing import absltest
    from jax._src import test_util as jtu
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def add_one(x):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1.0
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    class TpuOnlyTest(jtu.JaxTestCase):
        INTERPRET = False

        def setUp(self):
            if not jtu.test_device_matches(["tpu"]):
                self.skipTest("Test requires TPUs")
            super().setUp()

        def test_kernel_runs(self):
            x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
            np.testing.assert_array_equal(add_one(x), x + 1.0)

        def test_the_generation(self):
            if not jtu.is_device_tpu_at_least(4):
                self.skipTest("needs TPU v4 or newer")
            print("GENERATION", jtu.get_tpu_version(), jtu.is_device_tpu(5, "e"),
                  jtu.is_device_tpu(7, "x"), jtu.device_kind_match("TPU v5 lite$") is not None,
                  jax.default_backend(), jax.devices()[0].platform,
                  pltpu.get_tpu_info().generation, jax.devices()[0].num_cores,
                  pltpu.create_tensorcore_mesh("core").shape["core"])

    class InterpretTest(jtu.JaxTestCase):
        INTERPRET = True  # runs only on the CPU, interpreted

        def setUp(self):
            if not jtu.test_device_matches(["cpu"]) and self.INTERPRET:
                self.skipTest("Only run interpret tests on CPU.")
            super().setUp()

        def test_interpreted(self):
            # Its gates on the generation it interprets for (JAX's own interpret classes ask).
            if not jtu.is_device_tpu_at_least(4):
                self.skipTest("Operation not supported on this TPU version.")
            print("INTERPRET SEES", jtu.device_under_test(), jax.default_backend(),
                  jtu.test_device_matches(["tpu"]), jtu.is_device_tpu(),
                  jtu.is_device_tpu(5, "e"), jtu.get_tpu_version())
            x = jnp.ones((8, 128), jnp.float32)
            out = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
                                 out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                 interpret=True)(x)
            np.testing.assert_array_equal(out, x * 2)
''')


def test_tpu_tests_run_on_the_cpu_as_the_stand_in_chip(pytester, run_pytest):
    pytester.makepyfile(test_tpu_suite=JAX_STYLE_TPU_TESTS)
    result = run_pytest("--pallas-interpret=tpu", "-p", "no:xdist", "-s")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([
        "pallas: *device under test: TPU v5e for JAX's test utilities, "
        "jax.default_backend() and device objects (device kind 'TPU v5 lite', a v5e 2x4 "
        "slice; JAX's own machinery sees the CPU devices*",
        # The chip's answers where a test asks, device objects included.
        "*GENERATION 5 True False True tpu tpu 5 1 1",
        # An interpret class keeps seeing the CPU, but the generation it interprets for.
        "*INTERPRET SEES cpu cpu False False True 5",
    ])


def test_the_chip_flag_picks_the_generation_they_see(pytester, run_pytest):
    pytester.makepyfile(test_tpu_suite=JAX_STYLE_TPU_TESTS)
    result = run_pytest("--pallas-chip=7x", "-p", "no:xdist", "-s", "-k", "generation")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*GENERATION 7 False True False tpu tpu 7 1 1"])
    # A two-core chip's devices report both TensorCores, as JAX's mesh of cores reads them.
    result = run_pytest("--pallas-chip=v5p", "-p", "no:xdist", "-s", "-k", "generation")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*GENERATION 5 False False False tpu tpu 5 2 2"])


@pytest.mark.parametrize("args", [(), ("-p", "no:pallas")], ids=["no flag", "plugin off"])
def test_without_opting_in_the_suite_runs_as_without_the_plugin(pytester, run_pytest, args):
    pytester.makepyfile(test_tpu_suite=JAX_STYLE_TPU_TESTS)
    result = run_pytest("-p", "no:xdist", "-s", "-rs", *args)
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(["*Operation not supported on this TPU version.*"])


def test_the_answers_are_undone_after_the_test():
    import jax
    from jax._src import test_util as jtu

    from pytest_pallas._compat.device_under_test import stand_in_chip_under_test

    before = (jax.default_backend(), jtu.device_under_test(), jtu.test_device_matches(["tpu"]))
    with stand_in_chip_under_test("v6e"):
        assert jtu.is_device_tpu(6, "e") and jtu.get_tpu_version() == 6
        assert jax.default_backend() == "tpu"
        # JAX's own modules still see the CPU; without device facts, so do its devices.
        from jax._src import xla_bridge
        assert xla_bridge.default_backend() == "cpu"
        assert jax.devices()[0].platform == "cpu"
    assert not hasattr(jax.devices()[0], "num_cores")
    assert (jax.default_backend(), jtu.device_under_test(),
            jtu.test_device_matches(["tpu"])) == before == ("cpu", "cpu", False)


def test_a_test_written_for_the_interpreter_is_told_only_the_generation():
    from jax._src import test_util as jtu

    from pytest_pallas._compat.device_under_test import stand_in_chip_under_test

    with stand_in_chip_under_test("v6e", generation_only=True):
        assert jtu.get_tpu_version() == 6 and jtu.is_device_tpu_at_least(6)
        assert not jtu.is_device_tpu_at_least(7)
        assert jtu.is_device_tpu(6, "e") and not jtu.is_device_tpu(5, "e")
        # Still the CPU: where it runs, and "is this a TPU?" with no generation asked.
        assert jtu.test_device_matches(["cpu"]) and not jtu.is_device_tpu()
    assert not jtu.is_device_tpu_at_least(4)
    with pytest.raises(ValueError):
        jtu.get_tpu_version()


def test_each_chip_s_device_kind_is_the_one_jax_reads_back():
    from pytest_pallas._compat import device_kinds
    from pytest_pallas._compat.device_under_test import DEVICE_KIND_OF_CHIP, device_kind_of_chip

    for chip, kind in DEVICE_KIND_OF_CHIP.items():
        assert device_kinds.chip_version_of_device_kind(kind).value == chip
    with pytest.raises(ValueError, match="no TPU device kind is known for chip 'v9'"):
        device_kind_of_chip("v9")


def test_a_libtpu_new_enough_is_asked_of_the_installed_libtpu():
    # "Needs a newer libtpu" (jtu.is_cloud_tpu_at_least) is answered by the libtpu the TPU
    # compiler check compiles with: its client's platform version carries the build date.
    from jax._src import test_util as jtu

    from pytest_pallas._compat.device_under_test import stand_in_chip_under_test

    if not hasattr(jtu, "is_cloud_tpu_at_least"):
        pytest.skip("this JAX's test utilities no longer ask for a libtpu's build date")
    built = "PJRT C API\nTFRT TPU v5 lite\nBuilt on Jun 17 2026 11:08:48 (1781719728) cl/1"
    with stand_in_chip_under_test("v5e", lambda: built):
        assert jtu.is_cloud_tpu_at_least(2026, 6, 17)
        assert not jtu.is_cloud_tpu_at_least(2026, 6, 18)
        assert not jtu.is_cloud_tpu()  # only the build date is libtpu's
    with stand_in_chip_under_test("v5e", lambda: None):  # no libtpu: JAX's own answer
        assert jtu.is_cloud_tpu_at_least(2030, 1, 1)
    assert jtu.is_cloud_tpu_at_least(2030, 1, 1)


# JAX's asynchronous copy across two kernels (tests/pallas/tpu_pallas_async_test.py): the
# semaphore is an output of the first kernel. JAX's interpreters cannot allocate one, and
# libtpu's ahead-of-time compiler aborts the process on such a program.
SEMAPHORE_HANDED_BETWEEN_KERNELS = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np
    from absl.testing import absltest
    from jax._src import test_util as jtu
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def copy_start(x):
        def kernel(x_ref, aliased_x_ref, o_ref, sem):
            pltpu.make_async_copy(x_ref, o_ref, sem).start()
        return pl.pallas_call(
            kernel, out_shape=(jax.ShapeDtypeStruct.like(x), jax.ShapeDtypeStruct.like(x),
                               pltpu.SemaphoreType.DMA(())),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=(pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY),
                       pl.BlockSpec(memory_space=pltpu.SEMAPHORE)),
            input_output_aliases={0: 0})(x)

    class AsyncCopyTest(absltest.TestCase):
        def setUp(self):
            if not jtu.is_device_tpu_at_least(4):
                self.skipTest("DMAs need TPU v4+")

        def test_copy_start(self):
            x = jnp.ones((8, 128), jnp.float32)
            _, out, _ = jax.jit(copy_start)(x)
            np.testing.assert_array_equal(out, x)
''')


def test_a_limit_of_jax_s_interpreters_in_a_test_case_skips_with_one_line(pytester, run_pytest):
    # unittest records a TestCase's error instead of raising it: it is judged all the same.
    pytester.makepyfile(test_async=SEMAPHORE_HANDED_BETWEEN_KERNELS)
    result = run_pytest("--pallas-interpret=tpu", "-p", "no:xdist", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED *pallas: JAX's TPU interpreter crashed inside JAX "
                                 "while running kernel 'kernel at test_async.py:*"])


def test_a_wrong_value_in_a_test_case_still_fails_with_its_own_message(pytester, run_pytest):
    pytester.makepyfile(test_wrong=JAX_STYLE_TPU_TESTS.replace("x + 1.0)", "x + 2.0)"))
    result = run_pytest("--pallas-interpret=tpu", "-p", "no:xdist", "-k", "kernel_runs")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*Mismatched elements: 1024 / 1024*", "*reproduce with:*"])


def test_an_interpret_class_kernel_is_not_judged_by_the_tpu_compiler(pytester, run_pytest):
    # A cumsum the TPU compiler rejects (tests/test_compile_check.py), in a class written for
    # the interpreter only: never compiled for a chip, so the compile check does not judge it.
    pytester.makepyfile(test_interpreted=textwrap.dedent('''
        import jax, jax.numpy as jnp, numpy as np
        from jax._src import test_util as jtu
        from jax.experimental import pallas as pl

        class CumsumInterpretTest(jtu.JaxTestCase):
            INTERPRET = True

            def test_cumsum(self):
                x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128) % 7
                out = pl.pallas_call(
                    lambda x_ref, o_ref: o_ref.__setitem__(..., jnp.cumsum(x_ref[...], axis=1)),
                    out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)(x)
                np.testing.assert_allclose(out, np.cumsum(np.asarray(x), axis=1))
    '''))
    from pytest_pallas.checks.compile_check import libtpu_version

    if libtpu_version() is None:
        pytest.skip("needs libtpu: the compile check is what is left out")
    run_pytest("--pallas-interpret=tpu", "--pallas-compile=v5e", "-p", "no:xdist",
               "--pallas-numerics=exact").assert_outcomes(passed=1)


# A kernel reading a semaphore's count: the TPU interpreter of jax 0.10.2 has no rule for
# pl.semaphore_read (its limit); the plain interpreter runs it.
SEMAPHORE_READ = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np
    from absl.testing import absltest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    class SemaphoreReadTest(absltest.TestCase):
        def test_read(self):
            def kernel(y_ref):
                def body(sem):
                    pl.semaphore_signal(sem, 3)
                    y_ref[0] = pl.semaphore_read(sem)
                    pl.semaphore_wait(sem, 3)
                pl.run_scoped(body, pltpu.SemaphoreType.REGULAR)
            y = pl.pallas_call(kernel, out_specs=pl.BlockSpec(memory_space=pltpu.SMEM),
                               out_shape=jax.ShapeDtypeStruct((1,), jnp.int32))()
            np.testing.assert_array_equal(y, [3])
''')


def test_the_interpreter_fallback_notice_is_not_a_failure_under_w_error(pytester, run_pytest):
    # JAX's suites turn warnings into errors: the plugin's notice that a test passed in the
    # other interpreter must not fail it.
    pytester.makepyfile(test_read=SEMAPHORE_READ)
    result = run_pytest("--pallas-interpret=tpu", "-p", "no:xdist", "-W", "error",
                        "--pallas-numerics=exact")
    result.assert_outcomes(passed=1)


# JAX's test_hbm_to_host_host_output_dma: a kernel copying into host memory. libtpu's compiler
# aborted the process compiling it, and JAX's TPU interpreter cannot lower it on the CPU.
HOST_MEMORY_OUTPUT = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(y_hbm_ref, x_host_ref):
        def body(sem):
            pltpu.async_copy(y_hbm_ref, x_host_ref, sem).wait()
        pl.run_scoped(body, pltpu.SemaphoreType.DMA)

    def in_host_memory():
        if callable(pl.HOST):  # jax 0.10 and 0.11
            return pl.HOST(shape=(8, 128), dtype=jnp.float32)
        return pl.MemoryRef(jax.core.ShapedArray((8, 128), jnp.float32), pl.HOST)

    def test_copy_to_host():
        host = jax.sharding.NamedSharding(jax.sharding.Mesh(jax.devices(), "x"),
                                          jax.sharding.PartitionSpec(), memory_kind="pinned_host")
        x = jnp.arange(8 * 128.0).reshape((8, 128))
        f = jax.jit(lambda x: pl.pallas_call(
            kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.HOST), out_shape=in_host_memory()
            )(x), out_shardings=host)
        np.testing.assert_array_equal(f(x), x)
''')


def test_a_kernel_in_host_memory_skips_with_one_line(pytester, run_pytest):
    pytester.makepyfile(test_host=HOST_MEMORY_OUTPUT)
    result = run_pytest("--pallas-interpret=tpu", "--pallas-devices=1", "-p", "no:xdist", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED *pallas: kernel 'kernel at test_host.py:*' keeps an "
                                 "operand in host memory (pl.HOST), which JAX's interpreters "
                                 "do not run on the CPU*"])


# JAX's test_dma_with_regular_semaphore (TPU v6+): a DMA signals a regular semaphore, which
# the kernel waits for once.
DMA_SIGNALLING_A_REGULAR_SEMAPHORE = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_hbm_ref, y_hbm_ref):
        def body(x_ref, sem):
            pltpu.async_copy(x_hbm_ref, x_ref, sem)
            pl.semaphore_wait(sem)
            pltpu.async_copy(x_ref, y_hbm_ref, sem)
            pl.semaphore_wait(sem)
        pl.run_scoped(body, pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.REGULAR)

    def test_copy_through_vmem():
        x = jnp.arange(8 * 128.0).reshape((8, 128))
        any_space = pl.BlockSpec(memory_space=pl.ANY)
        y = pl.pallas_call(kernel, in_specs=[any_space], out_specs=any_space,
                           out_shape=jax.typeof(x))(x)
        np.testing.assert_array_equal(y, x)
''')


def test_a_dma_signalling_a_regular_semaphore_runs_in_the_plain_interpreter(pytester,
                                                                            run_pytest):
    # JAX's TPU interpreter adds the DMA's bytes to the semaphore (the kernel's wait of one
    # passes early, its values are wrong and its semaphore ends off 0); not the kernel's bug.
    pytester.makepyfile(test_regular=DMA_SIGNALLING_A_REGULAR_SEMAPHORE)
    result = run_pytest("--pallas-chip=v6e", "-p", "no:xdist")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*PallasInterpreterFallback: pallas: JAX's TPU interpreter "
                                 "cannot run kernel 'kernel at test_regular.py:*' as the chip "
                                 "does (it adds a DMA's bytes to the regular semaphore*"])


# A suite that loads its own Hypothesis profile as its module is imported, as JAX's Pallas
# tests do (derandomized: the same examples on every machine).
OWN_HYPOTHESIS_PROFILE = textwrap.dedent('''
    import hypothesis as hp, hypothesis.strategies as hps
    import jax, jax.numpy as jnp, numpy as np
    from jax.experimental import pallas as pl

    hp.settings.register_profile("deterministic", database=None, derandomize=True,
                                 deadline=None, max_examples=7)
    hp.settings.load_profile("deterministic")
    SEEN = []

    @hp.given(hps.integers(1, 1000))
    def test_kernel(n):
        SEEN.append(n)
        x = jnp.full((8, 128), n, jnp.int32)
        out = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1),
                             out_shape=jax.typeof(x), interpret=True)(x)
        np.testing.assert_array_equal(out, x + 1)

    def test_report():
        print("PROFILE", hp.settings.get_current_profile_name(), "EXAMPLES", SEEN)
''')


def test_a_suite_s_own_hypothesis_profile_stands(pytester, run_pytest):
    pytester.makepyfile(test_own_profile=OWN_HYPOTHESIS_PROFILE)
    off = run_pytest("-p", "no:pallas", "-p", "no:xdist", "-s")
    on = run_pytest("--pallas-interpret=tpu", "-p", "no:xdist", "-s")
    on.assert_outcomes(passed=2)

    def examples(result):
        return next(line for line in result.outlines if "PROFILE" in line)

    # Its profile, its derandomized examples: not the plugin's profile or seed.
    assert "PROFILE deterministic" in examples(on)
    assert examples(on).split("PROFILE")[1] == examples(off).split("PROFILE")[1]


# JAX's test_disable_bounds_check: a kernel that turned the chip's bounds checks off reads past
# its (8, 128) input; only the part in bounds is compared. With the checks on it passes too: the
# chip does not check a vector load from VMEM (libtpu emits a check for one only under
# --xla_jf_bounds_check=true, which JAX's test asks to be run with by hand), and the poison
# read past the input is not compared (docs/tpu-fidelity.md, out-of-bounds accesses).
BOUNDS_CHECKS_OFF = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(src, tgt):
        tgt[:] = src[tuple(pl.ds(d) for d in tgt.shape)]

    @pytest.mark.parametrize("checks_off", [True, False])
    def test_reads_past_its_input(checks_off):
        x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
        out = pl.pallas_call(kernel, jax.ShapeDtypeStruct((16, 256), jnp.float32),
                             compiler_params=pltpu.CompilerParams(
                                 disable_bounds_checks=checks_off))(x)
        np.testing.assert_array_equal(out[:8, :128], x)
''')


def test_a_kernel_with_bounds_checks_off_reads_out_of_bounds_as_on_the_chip(pytester,
                                                                            run_pytest):
    pytester.makepyfile(test_bounds=BOUNDS_CHECKS_OFF)
    result = run_pytest("--pallas-interpret=tpu", "--pallas-compile=none", "-p", "no:xdist",
                        "-rf")
    if "Out of bound slice" in result.stdout.str():
        pytest.skip("this JAX refuses a static slice past the input as it traces the kernel, "
                    "bounds checks off or on (jax 0.12), on any backend")
    result.assert_outcomes(passed=2)


# JAX's test_large_array_indexing, scaled down: a DMA from an operand too large for the
# interpreter's copies in the host's memory (here a host said to have 100 MiB free). The
# process was killed by the host's out-of-memory killer (pytest-xdist: "worker crashed").
LARGER_THAN_THE_HOST = textwrap.dedent('''
    import unittest
    import jax, jax.numpy as jnp, numpy as np
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x, y, sem):
        pltpu.async_copy(x.at[0], y, sem).wait()

    def copy_first(x):
        any_space = pl.BlockSpec(memory_space=pl.ANY)
        return pl.pallas_call(kernel, in_specs=[any_space], out_specs=any_space,
                              scratch_shapes=[pltpu.SemaphoreType.DMA],
                              out_shape=jax.ShapeDtypeStruct(x.shape[1:], x.dtype))(x)

    def test_large_operand():
        x = jnp.ones((4, 2048, 2048), jnp.float32)  # 64 MiB
        np.testing.assert_array_equal(copy_first(x), 1)

    def test_small_operand():
        x = jnp.ones((4, 8, 128), jnp.float32)
        np.testing.assert_array_equal(copy_first(x), 1)

    class LargeOperandTest(unittest.TestCase):
        def test_large_operand_after_an_unraisable_exception(self):
            # Under -W error, pytest raises the unraisable exception as the call's error after
            # the test recorded its own: the recorded one is judged.
            class RaisesWhenCollected:
                def __del__(self):
                    raise RuntimeError("raised while collected")
            RaisesWhenCollected()
            copy_first(jnp.ones((4, 2048, 2048), jnp.float32))
''')
SAYS_100_MIB_ARE_FREE = textwrap.dedent('''
    import pytest_pallas.hosts
    pytest_pallas.hosts.available_memory_bytes = lambda: 100 * 2**20
''')


def test_an_operand_past_the_hosts_memory_skips_with_one_line(pytester, run_pytest):
    pytester.makepyfile(test_large=LARGER_THAN_THE_HOST)
    pytester.makeconftest(SAYS_100_MIB_ARE_FREE)
    result = run_pytest("--pallas-interpret=tpu", "--pallas-devices=1", "-p", "no:xdist", "-rs",
                        "--pallas-compile=none",
                        "-W", "error::pytest.PytestUnraisableExceptionWarning")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["SKIPPED *pallas: interpreting this test's kernel needs about "
                                 "0.2 GiB of host memory (*), and this host has 0.1 GiB "
                                 "available*"])


def test_the_hosts_available_memory_is_read_from_meminfo(tmp_path):
    from pytest_pallas.hosts import available_memory_bytes

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:    2048 kB\n")
    assert available_memory_bytes(str(meminfo)) == 2048 * 1024
    meminfo.write_text("MemTotal:       24000000 kB\n")
    assert available_memory_bytes(str(meminfo)) is None
    assert available_memory_bytes(str(tmp_path / "absent")) is None
