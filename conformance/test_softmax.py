"""Conformance of `softmax` over the last axis (CONTRACT.md §2)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance._properties import secondary, value_sweep

pytestmark = pytest.mark.pallas

OPS = ["softmax"]


@pytest.mark.parametrize("op", OPS)
@value_sweep()
@given(data=st.data())
def test_value(op, data, conformance):
    """Shape and dtype, no NaN/Inf the oracle lacks, and the value within the tolerance."""
    conformance.check_value(op, data)


@pytest.mark.parametrize("op", OPS)
@secondary()
@given(data=st.data())
def test_written_and_deterministic(op, data, conformance):
    """Every output element is written, and two calls on one input agree bit for bit."""
    conformance.check_repeatable(op, data)


@pytest.mark.parametrize("op", ["softmax"])
@secondary()
@given(data=st.data())
def test_vmap(op, data, conformance):
    """The op under jax.vmap equals the op on each batch element."""
    conformance.check_vmap(op, data)
