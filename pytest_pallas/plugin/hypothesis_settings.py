"""Hypothesis inside a Pallas run: the settings profile loaded for the run, a seed per
test id, put back after each test, and Hypothesis's notes restated in the plugin's
terms.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ..suite.membership import is_conformance_item
from .session import PallasSession


def load_hypothesis_profile(pallas: PallasSession, config: pytest.Config, *,
                            collected: bool = False) -> None:
    """Load the run's profile (``pallas-dev``, ...). Once the tests are ``collected``, a
    profile a test module or conftest loaded of its own as it was imported stands (JAX's
    Pallas tests load ``deterministic``: derandomized, with health checks its examples pass)."""
    from hypothesis import Verbosity, settings

    from .._compat.hypothesis_internals import current_profile_name
    from ..strategies import register_profiles

    if collected and _suite_s_own_profile(config, current_profile_name()):
        return
    register_profiles()
    profile = f"pallas-{pallas.options.profile}"
    overrides = {}
    if pallas.options.examples is not None:
        overrides["max_examples"] = pallas.options.examples
    # Hypothesis's own flag: our profile replaces the one it loaded, so carry it over.
    verbosity = config.getoption("--hypothesis-verbosity", default=None)
    if verbosity:
        overrides["verbosity"] = Verbosity[verbosity]
    if overrides:
        settings.register_profile("pallas-cli", parent=settings.get_profile(profile),
                                  **overrides)
        profile = "pallas-cli"
    if pallas.hypothesis_profile_before is None:
        # Restored at pytest_unconfigure: the profile is this run's, not the process's.
        pallas.hypothesis_profile_before = current_profile_name()
    settings.load_profile(profile)


def _suite_s_own_profile(config: pytest.Config, name: str) -> bool:
    """Whether the loaded profile ``name`` is one the tests' own modules loaded: not
    Hypothesis's default, not the one ``--hypothesis-profile`` asked for, not the plugin's."""
    asked = config.getoption("--hypothesis-profile", default=None)
    return name not in ("default", asked) and not name.startswith("pallas-")


def seed_hypothesis(pallas: PallasSession, item: pytest.Item) -> None:
    """The same --pallas-seed and test id give the same examples, on any worker.

    Seeded just before the item runs: parametrized items share one function, so a seed
    set at collection would be the last item's; a method's ``obj`` is a bound method, which
    takes no attributes, so the seed goes on the function behind it.
    """
    from hypothesis import settings

    from .._compat.hypothesis_internals import (
        current_profile_name,
        is_given_test,
        seed_with_run_settings,
    )

    function = getattr(item, "obj", None)
    function = getattr(function, "__func__", function)
    if is_given_test(function):
        from ..suite.generated import SETTINGS_ATTRIBUTE

        # A suite's own derandomized profile (JAX's) keeps the examples its authors chose.
        own_draw = (_suite_s_own_profile(item.config, current_profile_name())
                    and settings.default.derandomize)
        # Put back at teardown: the function is shared by its parametrized items and by
        # a later run of the suite in the same process. A conformance test makes its own
        # count (a fifth of the profile's, say) from the profile of this run.
        item.stash[_HYPOTHESIS_RESTORE] = seed_with_run_settings(
            function, None if own_draw else pallas.key_seed(item.nodeid),
            getattr(function, SETTINGS_ATTRIBUTE, None))


_HYPOTHESIS_RESTORE = pytest.StashKey[Callable[[], None]]()


def restore_hypothesis_attributes(item: pytest.Item) -> None:
    restore = item.stash.get(_HYPOTHESIS_RESTORE, None)
    if restore is not None:
        restore()
        del item.stash[_HYPOTHESIS_RESTORE]


def restate_hypothesis_notes(item: pytest.Item, error: BaseException) -> None:
    """Hypothesis's advice, in terms a user of the plugin can act on."""
    from .._compat.hypothesis_internals import restate_notes

    if is_conformance_item(item):
        # The suite's explicit examples are its sweep cases, and its tests are not the
        # user's to decorate: the pallas section below gives the command that reproduces.
        # The harness notes a sweep case's input, so Hypothesis's call of the test goes.
        restate_notes(error, examples="sweep cases", reproduce="", explicit_example=False)
    else:
        restate_notes(error)
