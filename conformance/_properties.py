"""Shared by the conformance modules: the Hypothesis settings of the secondary properties.

The value property runs the profile's full number of examples; the
properties that cost several kernel calls per example (written and
deterministic, vmap) run a fifth of them, at least two.
"""

from hypothesis import settings


def secondary() -> settings:
    return settings(max_examples=max(2, settings.default.max_examples // 5))
