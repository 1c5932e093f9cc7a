"""The pytest-benchmark internals pallas_benchmark relies on, checked against the installed
pytest-benchmark (a release that moved one fails here, not silently in a user's run), and
the fallbacks when one is gone."""

import time

from pytest_pallas._compat import benchmark_internals as compat


def test_the_fixture_keeps_its_clock_where_the_compat_layer_reads_it(benchmark):
    assert compat.timer_of(benchmark) is not None
    assert compat.use_timer(benchmark, time.process_time)
    assert compat.timer_of(benchmark) is time.process_time
    benchmark(lambda: None)


def test_a_fixture_without_the_attribute_keeps_the_default_clock():
    class Moved:
        pass

    assert compat.timer_of(Moved()) is time.perf_counter
    assert not compat.use_timer(Moved(), time.process_time)


def test_the_session_object_is_found(pytestconfig):
    session = compat.benchmark_session(pytestconfig)
    assert session is not None
    assert hasattr(session, "save") and hasattr(session, "autosave")
    assert compat.benchmark_session(object()) is None


def test_the_round_budget_is_read_from_the_fixture(pytester, outside_xdist):
    pytester.makepyfile("""
        from pytest_pallas._compat.benchmark_internals import round_budget

        def test_budget(benchmark):
            assert round_budget(benchmark) == (0.25, 3)
            benchmark(lambda: None)
        """)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist",
                                "--benchmark-max-time=0.25", "--benchmark-min-rounds=3")
    result.assert_outcomes(passed=1)


def test_a_fixture_without_the_budget_gets_pytest_benchmarks_defaults():
    assert compat.round_budget(object()) == (1.0, 5)
