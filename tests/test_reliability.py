"""A broken kernel never breaks the run: hangs time out, state does not leak between tests."""

import json
import textwrap

HUNG_KERNEL = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, pytest
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def waits_for_a_dma_nobody_started(x_ref, o_ref, sem):
        pltpu.make_async_copy(x_ref, o_ref, sem).wait()

    def hung_copy(x):
        return pl.pallas_call(
            waits_for_a_dma_nobody_started, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA])(x)

    def copy(x):
        return hung_copy(x)
    """
)


def test_hung_kernel_times_out_and_the_run_goes_on(pytester):
    pytester.makepyfile(hung=HUNG_KERNEL)
    pytester.makepyfile(test_hang=textwrap.dedent(
        """
        import jax.numpy as jnp, pytest
        from hung import hung_copy

        @pytest.mark.pallas
        def test_hangs():
            hung_copy(jnp.ones((8, 128)))

        @pytest.mark.pallas
        def test_next_one_runs(pallas_backend):
            assert pallas_backend.platform == "cpu"
        """
    ))
    result = pytester.runpytest("-p", "no:cacheprovider", "--pallas-timeout=2")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*KernelTimeout: pallas: kernel 'waits_for_a_dma_nobody_started at hung.py:*' "
        "(in test_hang.py::test_hangs) ran longer than --pallas-timeout=2s and was stopped. "
        "The usual cause is a wait that is never satisfied*",
    ])


def test_hung_user_kernel_in_the_suite_still_writes_the_report(pytester):
    pytester.makepyfile(hung=HUNG_KERNEL)
    pytester.syspathinsert()
    report = pytester.path / "report.json"
    result = pytester.runpytest("-p", "no:cacheprovider", "--pallas-timeout=2",
                                "--pallas-seed=0", "--pallas-examples=2",
                                "--pallas-impl", "copy=hung:copy", "-k", "value",
                                f"--pallas-report={report}")
    assert result.ret == 1
    document = json.loads(report.read_text())
    assert document["complete"] is True
    assert document["ops"]["copy"]["properties"]["value"]["verdict"] == "fail"
    first_failure = document["ops"]["copy"]["properties"]["value"]["first_failure"]
    assert "kernel 'waits_for_a_dma_nobody_started at hung.py:" in first_failure
    assert "--pallas-timeout=2s" in first_failure


def test_the_suite_twice_in_one_process_gives_the_same_results(pytester):
    args = ("-p", "no:cacheprovider", "--pallas-conformance", "--pallas-ops=add,softmax",
            "--pallas-seed=5", "--pallas-examples=3")
    documents = []
    for run in range(2):
        report = pytester.path / f"report{run}.json"
        result = pytester.runpytest(*args, f"--pallas-report={report}")
        assert result.ret == 0, result.stdout.str()
        document = json.loads(report.read_text())
        documents.append({op: {name: (prop["verdict"], prop["examples"],
                                      prop["worst_error_in_tolerances"])
                               for name, prop in data["properties"].items()}
                          for op, data in document["ops"].items()})
    assert documents[0] == documents[1]


def test_jax_config_and_hypothesis_settings_do_not_leak_into_later_tests(pytester):
    pytester.makepyfile(textwrap.dedent(
        """
        import jax, pytest
        from hypothesis import given, settings, strategies as st
        from jax._src import config

        @pytest.mark.pallas
        @pytest.mark.parametrize("n", [1, 2])
        @given(x=st.integers())
        def test_pallas_first(n, x):
            assert config.pallas_tpu_interpret_mode_context_manager.value is not None
            assert settings.default.max_examples == 7  # --pallas-examples

        SETTINGS_AT_IMPORT = test_pallas_first._hypothesis_internal_use_settings

        def test_plain_after():
            assert config.pallas_tpu_interpret_mode_context_manager.value is None
            from jax.experimental.pallas import tpu as pltpu
            with pytest.raises(ValueError, match="Unsupported TPU device kind"):
                pltpu.get_tpu_info()
            # The plugin's per-test seed and settings were taken back from the function.
            assert getattr(test_pallas_first, "_hypothesis_internal_use_seed", None) is None
            assert test_pallas_first._hypothesis_internal_use_settings is SETTINGS_AT_IMPORT
        """
    ))
    from hypothesis import settings

    profile_before = settings.get_current_profile_name()
    examples_before = settings.default.max_examples
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly",
                                "--pallas-examples=7")
    result.assert_outcomes(passed=3)
    # The run's Hypothesis profile ends with the run (pytester runs it in this process).
    assert settings.get_current_profile_name() == profile_before
    assert settings.default.max_examples == examples_before
