"""--pallas-seed: a failing Pallas test prints its seed and a command that reproduces it,
and that command draws the same Hypothesis examples."""

import re
import shlex
import shutil
import textwrap

import hypothesis  # noqa: F401  (imported by the plugin in each in-process run; slow to redo)
import pytest

import pytest_pallas.strategies  # noqa: F401

NO_CACHE = ("-p", "no:cacheprovider")

# Each test prints every value Hypothesis draws for it, tagged with its own name, and fails
# on some of them, so the draws (and the falsifying example) can be compared between runs.
PROPERTIES = """
    import pytest
    from hypothesis import given, strategies as st

    @pytest.mark.pallas
    @pytest.mark.parametrize("offset", [0, 1, 2])
    @given(value=st.integers(0, 2**30))
    def test_parametrized(offset, value):
        print(f"DRAW parametrized[{offset}] {value}")
        assert (value + offset) % 3 != 1

    @pytest.mark.pallas
    class TestInAClass:
        @given(value=st.integers(0, 2**30))
        def test_method(self, value):
            print(f"DRAW method {value}")
            assert value % 3 != 2

    @pytest.mark.pallas
    @given(value=st.integers(0, 2**30))
    def test_passing(value):
        print(f"DRAW passing {value}")
    """


def draws(result, name):
    return re.findall(rf"DRAW {re.escape(name)} (\d+)", result.stdout.str())


def run(pytester, *args):
    # Hypothesis replays saved failures from its database; remove it so each run draws afresh.
    shutil.rmtree(pytester.path / ".hypothesis", ignore_errors=True)
    return pytester.runpytest(*NO_CACHE, "-s", *args)


def reproduce_commands(result):
    lines = result.stdout.lines
    return [lines[index + 1].strip() for index, line in enumerate(lines)
            if re.fullmatch(r"seed \d+; reproduce with:", line)]


def test_failing_test_prints_its_seed_and_a_reproduce_command(pytester):
    pytester.makepyfile(test_fails=textwrap.dedent("""
        import pytest

        @pytest.mark.pallas
        def test_fails():
            assert 1 == 2

        @pytest.mark.pallas
        def test_passes():
            pass

        def test_not_pallas_fails():
            assert 1 == 2
        """))
    # Values given as the next word ("--pallas-examples 3") are carried with their flag.
    result = pytester.runpytest(*NO_CACHE, "--pallas-seed=1234", "--pallas-examples", "3",
                                "--pallas-timeout=60")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([
        "*- pallas -*",
        "seed 1234; reproduce with:",
        ("  pytest test_fails.py::test_fails --pallas-seed=1234 --pallas-examples 3 "
         "--pallas-timeout=60"),
    ])
    # Only the Pallas test gets the section.
    assert reproduce_commands(result) == [
        ("pytest test_fails.py::test_fails --pallas-seed=1234 --pallas-examples 3 "
         "--pallas-timeout=60")
    ]
    # The report path is not part of reproducing.
    result = pytester.runpytest(*NO_CACHE, "--pallas-seed=1234", "--pallas-report",
                                "report.json", "test_fails.py",
                                "-k", "test_fails and not not_pallas")
    assert reproduce_commands(result) == [
        "pytest test_fails.py::test_fails --pallas-seed=1234"]


def test_reproduce_command_keeps_the_backend_flags(pytester):
    pytester.makepyfile(test_fails="""
        def test_fails():
            assert False
        """)
    result = pytester.runpytest(*NO_CACHE, "--pallas-chip", "v4", "--pallas-detect-races",
                                "--pallas-seed", "9")
    result.assert_outcomes(failed=1)
    # A backend flag opts every test in, so the unmarked test is a Pallas test here.
    assert reproduce_commands(result) == [
        "pytest test_fails.py::test_fails --pallas-seed=9 --pallas-chip v4 --pallas-detect-races"
    ]


def test_a_fresh_seed_is_printed_when_none_is_given(pytester, monkeypatch):
    monkeypatch.delenv("CI", raising=False)  # CI would choose the ci profile's fixed seed
    pytester.makepyfile(test_fails="""
        import pytest

        @pytest.mark.pallas
        def test_fails():
            assert False
        """)
    seeds = []
    for _ in range(2):
        result = pytester.runpytest(*NO_CACHE)
        result.assert_outcomes(failed=1)
        [command] = reproduce_commands(result)
        seed = re.fullmatch(r"pytest test_fails\.py::test_fails --pallas-seed=(\d+)", command)
        assert seed, command
        seeds.append(seed[1])
    assert seeds[0] != seeds[1]  # one chance in 2**31 of a false failure


@pytest.mark.parametrize("how", ["CI variable", "--pallas-profile=ci"])
def test_the_ci_profile_draws_the_same_examples_every_run(pytester, monkeypatch, how):
    # A gate that passes or fails on the luck of the draw is no gate.
    monkeypatch.delenv("CI", raising=False)
    args = ["--pallas-examples=7", "-k", "passing or method"]
    if how == "CI variable":
        monkeypatch.setenv("CI", "true")
    else:
        args.append("--pallas-profile=ci")
    pytester.makepyfile(test_properties=textwrap.dedent(PROPERTIES))
    one, two = run(pytester, *args), run(pytester, *args)
    for result in (one, two):
        result.assert_outcomes(passed=1, failed=1)
        assert reproduce_commands(result) == [
            "pytest test_properties.py::TestInAClass::test_method --pallas-seed=0 "
            "--pallas-examples=7" + (" --pallas-profile=ci" if how != "CI variable" else "")]
    assert len(draws(one, "passing")) == 7
    assert draws(one, "passing") == draws(two, "passing")
    assert draws(one, "method") == draws(two, "method")
    # The reproduce command, run where CI is not set, draws the same examples.
    monkeypatch.delenv("CI", raising=False)
    again = run(pytester, "--pallas-seed=0", *args)
    assert draws(again, "passing") == draws(one, "passing")
    assert draws(again, "method") == draws(one, "method")


def test_reproduce_command_draws_the_same_examples(pytester):
    pytester.makepyfile(test_properties=textwrap.dedent(PROPERTIES))
    first = run(pytester, "--pallas-seed=77", "--pallas-examples=20")
    first.assert_outcomes(passed=1, failed=4)
    commands = reproduce_commands(first)
    assert len(commands) == 4, first.stdout.str()

    for command in commands:
        words = shlex.split(command)
        assert words[0] == "pytest" and "--pallas-seed=77" in words
        nodeid = words[1]
        name = "method" if nodeid.endswith("test_method") else nodeid.split("::test_")[-1]
        again = run(pytester, *words[1:])
        again.assert_outcomes(failed=1)
        assert draws(again, name) == draws(first, name), f"{command} drew other examples"
        falsifying = [line for line in again.stdout.lines if "value=" in line]
        assert falsifying and all(line in first.stdout.lines for line in falsifying)


def test_same_seed_same_draws_other_seed_other_draws(pytester):
    pytester.makepyfile(test_properties=textwrap.dedent(PROPERTIES))
    one = run(pytester, "--pallas-seed=5", "--pallas-examples=7", "-k", "passing")
    two = run(pytester, "--pallas-seed=5", "--pallas-examples=7", "-k", "passing")
    other = run(pytester, "--pallas-seed=6", "--pallas-examples=7", "-k", "passing")
    for result in (one, two, other):
        result.assert_outcomes(passed=1)
    assert len(draws(one, "passing")) == 7, "--pallas-examples sets the examples per property"
    assert draws(one, "passing") == draws(two, "passing")
    assert draws(one, "passing") != draws(other, "passing")
