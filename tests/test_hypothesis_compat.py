"""The Hypothesis internals the plugin relies on (pytest_pallas/_compat/hypothesis_internals.py),
checked
against the installed Hypothesis, and the suite's failures free of Hypothesis's jargon."""

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pytest_pallas._compat import hypothesis_internals


def _two_failing_explicit_examples():
    @given(st.integers())
    @example(1)
    @example(2)
    @settings(database=None, max_examples=1)
    def test(value):
        assert value < 0, "always fails"

    with pytest.raises(AssertionError) as failure:
        test()
    return failure.value


def test_hypothesis_still_adds_the_note_that_is_restated():
    error = _two_failing_explicit_examples()
    assert any("use Verbosity.verbose to view" in note for note in error.__notes__), \
        error.__notes__


def test_the_note_is_restated_in_the_plugins_terms():
    error = _two_failing_explicit_examples()
    hypothesis_internals.restate_notes(error, examples="sweep cases")
    notes = "\n".join(error.__notes__)
    assert "Verbosity" not in notes
    assert ("(pallas: 1 other sweep case also failed with this error; rerun with "
            "--hypothesis-verbosity=verbose to see each of them)") in notes


def test_a_test_gets_the_loaded_settings_and_the_seed_and_is_put_back():
    drawn = []

    @given(st.integers(0, 10**9))
    def test(value):
        drawn.append(value)

    ours = ("_hypothesis_internal_use_settings", "_hypothesis_internal_use_seed")
    original = {name: test.__dict__.get(name) for name in ours}
    settings.register_profile("compat-three", max_examples=3, database=None)
    before = hypothesis_internals.current_profile_name()
    settings.load_profile("compat-three")
    try:
        assert hypothesis_internals.current_profile_name() == "compat-three"
        runs = []
        for _ in range(2):
            restore = hypothesis_internals.seed_with_run_settings(test, 1234)
            drawn.clear()
            test()
            runs.append(list(drawn))
            restore()
            assert {name: test.__dict__.get(name) for name in ours} == original
    finally:
        settings.load_profile(before)
    assert len(runs[0]) == 3, "the loaded profile's max_examples applies"
    assert runs[0] == runs[1], "the seed fixes the draws"


def test_a_test_with_its_own_settings_keeps_them():
    calls = []

    @given(st.integers())
    @settings(max_examples=2, database=None)
    def test(value):
        calls.append(value)

    restore = hypothesis_internals.seed_with_run_settings(test, 7)
    test()
    restore()
    assert len(calls) == 2


ADD_WRONG = "def add(x, y):\n    return x - y\n"


def test_changed_settings_apply_to_the_next_run():
    calls = []

    @given(st.integers())
    @settings(max_examples=50, database=None)
    def test(value):
        calls.append(value)

    hypothesis_internals.change_settings(test, max_examples=3)
    test()
    assert len(calls) == 3


def test_the_suites_failure_says_how_to_see_the_other_failing_sweep_cases(run_pytest, pytester):
    pytester.makepyfile(wrong_add=ADD_WRONG)
    args = ("-p", "no:xdist", "--pallas-impl", "add=wrong_add:add", "-k", "value",
            "--pallas-seed=0", "--pallas-examples=1")
    result = run_pytest(*args)
    assert result.ret == 1
    output = result.stdout.str()
    assert "Verbosity" not in output
    assert "other sweep cases also failed with this error; rerun with " \
           "--hypothesis-verbosity=verbose to see each of them)" in output

    # And that flag does show them, though the plugin loads its own settings profile.
    verbose = run_pytest(*args, "--hypothesis-verbosity=verbose").stdout.str()
    assert "distinct failures in explicit examples" in verbose
    assert "input (sweep case 1)" in verbose and "input (sweep case 2)" in verbose
