"""Every use of a Hypothesis internal, in one place, guarded; tests/test_hypothesis_compat.py
checks each against the installed Hypothesis.

* A ``@given`` test keeps its settings and seed in private attributes of the
  function (``_hypothesis_internal_use_settings``, ``_hypothesis_internal_use_seed``;
  ``@settings`` leaves ``_hypothesis_internal_settings_applied``). The plugin sets
  them per test, so that a test gets the run's profile and ``--pallas-seed``,
  and puts them back afterwards.
* The name of the loaded settings profile (``settings.get_current_profile_name``,
  ``settings._current_profile`` before it existed), to restore it at the end of a run.
* The notes Hypothesis adds to a failure speak to someone who edits the test
  ("use Verbosity.verbose to view", "temporarily adding @reproduce_failure(...)");
  :func:`restate_notes` says the same in pytest's and the plugin's terms. A
  Hypothesis that words its notes differently leaves them as they are.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from hypothesis import seed as seeded
from hypothesis import settings

_SETTINGS = "_hypothesis_internal_use_settings"
_SEED = "_hypothesis_internal_use_seed"
_OWN_SETTINGS = "_hypothesis_internal_settings_applied"
_ABSENT = object()

# "(note: 2 other explicit examples also failed with this error; use Verbosity.verbose to view)"
_OTHER_EXAMPLES = re.compile(
    r"\(note: (\d+) other explicit examples? also failed with this error; "
    r"use Verbosity\.verbose to view\)")
_EXPLICIT_EXAMPLE = re.compile(r"(Falsifying|Failing) explicit example: ")
_REPRODUCE_FAILURE = re.compile(r"\s*You can reproduce this test case by temporarily adding "
                                r"@reproduce_failure\(")


def is_given_test(function: Any) -> bool:
    """Whether ``function`` is a ``@given`` test."""
    return bool(getattr(function, "is_hypothesis_test", False))


def seed_with_run_settings(function: Any, seed: int | None,
                           make_settings: Callable[[Any], Any] | None = None
                           ) -> Callable[[], None]:
    """Make the ``@given`` test ``function`` run with ``seed`` and, unless it has its own
    ``@settings``, the loaded profile; returns what puts the function back as it was.

    ``make_settings``, if given, derives the test's settings from the loaded profile
    (a conformance property that runs a fifth of the profile's examples, say). ``seed=None``:
    no seed, the settings' own draw (a derandomized suite's examples).
    """
    saved = {name: function.__dict__.get(name, _ABSENT) for name in (_SETTINGS, _SEED)}
    if make_settings is not None:
        setattr(function, _SETTINGS, make_settings(settings.default))
    elif not hasattr(function, _OWN_SETTINGS):
        # @given took the profile loaded when the module was imported, before the plugin
        # knew the test was ours.
        setattr(function, _SETTINGS, settings.default)
    if seed is not None:
        seeded(seed)(function)

    def restore() -> None:
        for name, value in saved.items():
            if value is _ABSENT:
                function.__dict__.pop(name, None)
            else:
                setattr(function, name, value)

    return restore


def change_settings(function: Any, **changes: Any) -> None:
    """Change settings of the ``@given`` test ``function`` for its next run (after the
    plugin has given it the run's profile): ``phases=...``, ``database=None``, ..."""
    current = getattr(function, _SETTINGS, None) or settings.default
    setattr(function, _SETTINGS, settings(current, **changes))


def current_profile_name() -> str:
    """The name of the loaded Hypothesis settings profile ("default" if it cannot be read)."""
    current = getattr(settings, "get_current_profile_name", None)
    if callable(current):
        return current()
    return getattr(settings, "_current_profile", None) or "default"


def restate_notes(error: BaseException, *, examples: str = "explicit examples",
                  reproduce: str | None = None, explicit_example: bool = True) -> None:
    """Reword Hypothesis's notes on ``error`` (and on the errors it groups) for pytest users.

    ``examples`` names what Hypothesis calls explicit examples ("sweep cases" in the
    conformance suite); ``reproduce``, if given, replaces the ``@reproduce_failure`` note
    (for tests the user cannot edit); ``explicit_example=False`` drops the "Failing explicit
    example: test(...)" note (the conformance suite notes the sweep case's input itself).
    """
    pending, seen = [error], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        notes = getattr(current, "__notes__", None)
        if isinstance(notes, list):
            notes[:] = [_restated(note, examples, reproduce) for note in notes
                         if explicit_example or not _EXPLICIT_EXAMPLE.match(note)]
            notes[:] = [note for note in notes if note]
        if isinstance(current, BaseExceptionGroup):
            pending += current.exceptions


def _restated(note: str, examples: str, reproduce: str | None) -> str:
    match = _OTHER_EXAMPLES.search(note)
    if match:
        count = int(match.group(1))
        what = examples if count > 1 else examples.rstrip("s")
        return (f"(pallas: {count} other {what} also failed with this error; rerun with "
                "--hypothesis-verbosity=verbose to see each of them)")
    if reproduce is not None and _REPRODUCE_FAILURE.match(note):
        return reproduce
    return note
