"""Shared by the conformance modules: the Hypothesis settings and explicit examples.

The value property runs the profile's full number of examples, after the
sweep: explicit examples that try each value profile and dtype on purpose
(``op_inputs.sweep``). The properties that cost several kernel calls per
example (written and deterministic, vmap) run a fifth of them, at least two.
"""

from hypothesis import example, settings

from pytest_pallas.op_inputs import SWEEP_SLOTS, SweepSlot


def secondary() -> settings:
    return settings(max_examples=max(2, settings.default.max_examples // 5))


def value_sweep():
    """Add the sweep's explicit examples to a value property (above its ``@given``)."""

    def apply(test):
        for index in reversed(range(SWEEP_SLOTS)):  # the first applied runs last
            test = example(data=SweepSlot(index))(test)
        return test

    return apply
