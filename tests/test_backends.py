"""Backends: every pallas_call a Pallas test makes is interpreted on the CPU; chips stand in."""

import textwrap
import types

import pytest

USER_KERNEL = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def double_kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    def double(x):
        # A user kernel that never passes interpret=: it only runs on the CPU
        # because the plugin interprets it.
        return pl.pallas_call(double_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    """
)


def test_user_kernel_without_interpret_runs_on_the_cpu(pytester):
    pytester.makepyfile(USER_KERNEL + textwrap.dedent(
        """
        @pytest.mark.pallas
        def test_marked():
            assert (double(jnp.ones((8, 128))) == 2).all()

        def test_fixture(pallas_backend):
            assert pallas_backend.platform == "cpu"
            assert (double(jnp.ones((8, 128))) == 2).all()
        """
    ))
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_unmarked_test_is_left_alone(pytester):
    pytester.makepyfile(USER_KERNEL + textwrap.dedent(
        """
        def test_unmarked():
            with pytest.raises(Exception, match="Only interpret mode is supported on CPU"):
                double(jnp.ones((8, 128)))
        """
    ))
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    # A backend flag opts every test of the session in.
    pytester.runpytest("-p", "no:cacheprovider", "--pallas-interpret=tpu").assert_outcomes(failed=1)


@pytest.mark.parametrize("mode, expected", [("tpu", "InterpretParams"),
                                            ("tpu-always", "InterpretParams"), ("plain", "True")])
def test_interpreter_flag_selects_the_interpreter(pytester, mode, expected):
    pytester.makepyfile(USER_KERNEL + textwrap.dedent(
        """
        from jax.experimental.pallas import tpu as pltpu

        def test_params(pallas_backend):
            params = pallas_backend.interpret_params
            print("PARAMS", "InterpretParams" if isinstance(params, pltpu.InterpretParams)
                  else params)
            assert (double(jnp.ones((8, 128))) == 2).all()
        """
    ))
    result = pytester.runpytest("-p", "no:cacheprovider", "-s", f"--pallas-interpret={mode}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*PARAMS {expected}"])


def test_tpu_interpreter_poisons_uninitialized_memory(pytester):
    pytester.makepyfile(
        """
        import jax, jax.numpy as jnp, pytest
        from jax.experimental import pallas as pl

        def forgets_to_initialise(x_ref, o_ref):
            o_ref[...] += x_ref[...]

        @pytest.mark.pallas
        def test_nan():
            y = pl.pallas_call(
                forgets_to_initialise, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32)
            )(jnp.ones((8, 128)))
            assert jnp.isnan(y).all()
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


@pytest.mark.parametrize("chip, vmem_mib", [("v5e", 128), ("v4", 16), ("v6e", 128), ("7x", 64)])
def test_chip_flag_makes_get_tpu_info_answer_for_that_chip(pytester, chip, vmem_mib):
    pytester.makepyfile(
        f"""
        import pytest
        from jax.experimental.pallas import tpu as pltpu

        @pytest.mark.pallas
        def test_info():
            info = pltpu.get_tpu_info()
            assert str(info.chip_version) == {chip!r}
            assert info.vmem_capacity_bytes == {vmem_mib} * 2**20

        def test_registry_restored_after_the_test():
            with pytest.raises(ValueError, match="Unsupported TPU device kind"):
                pltpu.get_tpu_info()
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", f"--pallas-chip={chip}", "-o",
                                "pallas_scope=marked")
    # --pallas-chip opts every test in, so the second test also sees the chip.
    result.assert_outcomes(passed=1, failed=1)
    pytester.runpytest(
        "-p", "no:cacheprovider", "-o", f"pallas_chip={chip}"
    ).assert_outcomes(passed=2)


def test_emit_pipeline_runs_on_the_cpu(pytester):
    pytester.makepyfile(
        """
        import jax, jax.numpy as jnp, numpy as np, pytest
        from jax.experimental import pallas as pl
        from jax.experimental.pallas import tpu as pltpu

        def inner(x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1

        def outer(x_hbm, o_hbm):
            pltpu.emit_pipeline(inner, grid=(4,),
                                in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                                out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x_hbm, o_hbm)

        @pytest.mark.pallas
        def test_pipeline():
            x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
            y = pl.pallas_call(outer, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                               in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                               out_specs=pl.BlockSpec(memory_space=pl.ANY))(x)
            np.testing.assert_array_equal(y, x + 1)
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def fake_tpu_devices(device_kind="TPU v5 lite", count=1):
    """What ``jax.devices("tpu")`` would return on a TPU host: only the facts the plugin reads."""
    devices = [types.SimpleNamespace(device_kind=device_kind, num_cores=1) for _ in range(count)]
    return lambda: devices


def test_fake_tpu_device_facts_select_the_chip():
    from pytest_pallas.backend import select_backend
    from pytest_pallas.plugin.options import PallasOptions

    backend = select_backend(PallasOptions(tpu=True), tpu_devices=fake_tpu_devices(count=4))
    assert (backend.platform, backend.chip, backend.device_count) == ("tpu", "v5e", 4)
    assert backend.interpret_params is None
    assert backend.matmul_precision == "bfloat16"
    assert backend.tpu_info.vmem_capacity_bytes == 128 * 2**20
    with backend.activate():  # a real TPU needs no interpreter
        pass


def test_fake_tpu_that_disagrees_with_chip_flag_is_a_usage_error():
    from pytest_pallas.backend import select_backend
    from pytest_pallas.plugin.options import PallasOptions

    with pytest.raises(pytest.UsageError, match=r"--pallas-chip=v5e disagrees with the TPU JAX "
                                                r"sees \(TPU v6 lite, chip v6e\)"):
        select_backend(PallasOptions(tpu=True, chip="v5e", chip_given=True),
                       tpu_devices=fake_tpu_devices("TPU v6 lite"))


def test_unknown_tpu_device_kind_is_a_usage_error():
    from pytest_pallas.backend import select_backend
    from pytest_pallas.plugin.options import PallasOptions

    with pytest.raises(pytest.UsageError, match="does not know the chip of device kind 'TPU v99'"):
        select_backend(PallasOptions(tpu=True), tpu_devices=fake_tpu_devices("TPU v99"))


def test_interpreter_state_is_reset_after_a_failing_kernel(pytester):
    pytester.makepyfile(
        """
        import jax, jax.numpy as jnp, pytest
        from jax.experimental import pallas as pl
        from jax.experimental.pallas import tpu as pltpu

        def out_of_bounds(x_ref, o_ref):
            o_ref[...] = x_ref[pl.ds(8, 8), :]

        def good(x_ref, o_ref):
            o_ref[...] = x_ref[...]

        @pytest.mark.pallas
        def test_a_kernel_that_raises():
            pl.pallas_call(out_of_bounds, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(
                jnp.ones((8, 128)))

        @pytest.mark.pallas
        def test_next_kernel_is_not_poisoned():
            y = pl.pallas_call(good, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(
                jnp.ones((8, 128)))
            assert (y == 1).all()
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1, failed=1)


def _fake_tpu_session(device_kind="TPU v5 lite", count=4):
    """A session whose backend is a TPU host described by fake device facts."""
    from pytest_pallas.backend import select_backend
    from pytest_pallas.plugin.options import PallasOptions
    from pytest_pallas.plugin.session import PallasSession

    options = PallasOptions(tpu=True)
    backend = select_backend(options, tpu_devices=fake_tpu_devices(device_kind, count))
    return PallasSession(options=options, _backend=backend)


MARKED_TESTS = textwrap.dedent(
    """
    import pytest

    @pytest.mark.tpu_only
    def test_tpu_only(): pass

    @pytest.mark.interpret_only
    def test_interpret_only(): pass

    @pytest.mark.tpu_generation("v5e", "v6e")
    def test_for_v5e_or_v6e(): pass

    @pytest.mark.tpu_generation("v4")
    def test_for_v4(): pass

    @pytest.mark.devices(64)
    def test_sixty_four_devices(): pass

    @pytest.mark.devices(2)
    def test_two_devices(): pass
    """
)


def test_markers_on_a_fake_tpu_host_skip_what_the_chip_cannot_run(pytester):
    from pytest_pallas.plugin.skips import skip_reason

    items = {item.name: item for item in pytester.getitems(MARKED_TESTS)}
    session = _fake_tpu_session("TPU v5 lite", count=4)
    reasons = {name: skip_reason(session, item) for name, item in items.items()}
    assert reasons == {
        "test_tpu_only": None,
        "test_interpret_only": "interpret_only: runs only in interpret mode on the CPU",
        "test_for_v5e_or_v6e": None,
        "test_for_v4": "tpu_generation: for v4, this TPU is v5e",
        "test_sixty_four_devices": "needs 64 TPU devices, this host has 4",
        "test_two_devices": None,
    }


def test_a_worker_with_one_chip_skips_a_multi_chip_test_naming_the_flags_that_run_it(pytester):
    import dataclasses

    from pytest_pallas.plugin.skips import skip_reason

    items = {item.name: item for item in pytester.getitems(MARKED_TESTS)}
    session = dataclasses.replace(_fake_tpu_session("TPU v5 lite", count=1),
                                  one_device_worker=True)
    assert skip_reason(session, items["test_two_devices"]) == (
        "needs 2 TPU devices, this pytest-xdist worker holds 1 (one TPU per worker); run it "
        "with -n 0 --pallas-tpu, which gives one process every device")


def test_tpu_only_is_skipped_with_its_reason_on_the_cpu(pytester):
    pytester.makepyfile(MARKED_TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=4, skipped=2)
    result.stdout.fnmatch_lines([
        "*tpu_only: needs a real TPU (run with --pallas-tpu on a TPU VM)*",
        "*needs 64 devices, JAX sees * CPU devices; run with --pallas-devices=64*",
    ])


def test_on_a_tpu_assert_allclose_allows_for_bfloat16_matmul_rounding(pytester):
    import numpy as np

    from pytest_pallas import assert_allclose

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 1024)), rng.standard_normal((1024, 128))
    exact = x @ y
    # What a TPU's default-precision float32 dot computes: operands rounded to bfloat16.
    rounded = (x.astype("bfloat16").astype(np.float64) @ y.astype("bfloat16").astype(np.float64))
    rounded = rounded.astype(np.float32)
    [item] = pytester.getitems("import pytest\n@pytest.mark.pallas\ndef test_k(): pass\n")
    session = _fake_tpu_session()
    session.open_kernel_run(item)
    try:
        assert assert_allclose(rounded, exact, reduction_length=1024) <= 1
    finally:
        session.close_kernel_run(item)
    with pytest.raises(AssertionError, match="Arrays are not close"):
        assert_allclose(rounded, exact, reduction_length=1024)  # float32 on the CPU
