"""Class 10: every drawn example stays within the documented size budget, restrictions honoured.

A ``@supports(multiple_of={"shape": 256})`` on the rank-free ``add`` once made
the suite draw 768^3 arrays (1.8 GB each); every example must now fit
``ops.inputs.EXAMPLE_BUDGET_BYTES``, with every size still a declared multiple.
"""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_pallas.ops import inputs as op_inputs
from pytest_pallas.ops.domains import Domain
from pytest_pallas.ops.registry import OP_NAMES, get_operation

BUDGET = op_inputs.EXAMPLE_BUDGET_BYTES


def _bytes(case):
    return sum(4 * math.prod(a.shape) for a in case.args)


RESTRICTED = [
    ("add", Domain(multiple_of={"shape": 256})),
    ("matmul", Domain(multiple_of={"m": 512, "k": 512, "n": 512})),
    ("mha", Domain(multiple_of={"s": 256, "t": 256, "d": 256})),
]


@pytest.mark.parametrize("op, domain", RESTRICTED, ids=[op for op, _ in RESTRICTED])
def test_drawn_examples_stay_in_the_budget_and_honour_the_restriction(op, domain):
    @settings(max_examples=25, database=None, deadline=None)
    @given(st.data())
    def draw(data):
        case = data.draw(op_inputs.cases(get_operation(op), domain))
        assert _bytes(case) <= BUDGET, case
        sizes = case.dims["shape"] if op == "add" else [case.dims[d] for d in domain.multiple_of]
        multiples = ([domain.multiple_of["shape"]] * len(sizes) if op == "add"
                     else list(domain.multiple_of.values()))
        assert all(size % m == 0 for size, m in zip(sizes, multiples)), case

    draw()


@pytest.mark.parametrize("op", OP_NAMES)
def test_sweep_cases_stay_in_the_budget(op):
    index = 0
    while (case := op_inputs.sweep_case(get_operation(op), Domain(), index)) is not None:
        assert _bytes(case) <= BUDGET
        index += 1


def test_a_restriction_with_no_example_in_the_budget_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"over the suite's budget of 16 MiB per example"):
        op_inputs.sweep_case(get_operation("matmul"),
                             Domain(multiple_of={"m": 4096, "k": 4096, "n": 4096}), 0)
