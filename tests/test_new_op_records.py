"""The version 0.2 ops' records (docs/contract.md section 2) and the two ``Operation`` fields they
need: ``constrain`` (facts tying dimensions and parameters together) and a ``reduction`` over
several dimensions."""

import math

import numpy as np
import pytest

from pytest_pallas import Operation, operations
from pytest_pallas.ops.domains import Domain
from pytest_pallas.ops.inputs import make_case, sweep_case
from pytest_pallas.ops.operation import OperationError

# The dimension names of docs/contract.md section 2, "Operations added in version 0.2", in order.
CONTRACT_DIMENSIONS = {
    "flash_attention": ("b", "h", "g", "s", "t", "d"),
    "rms_norm": ("rows", "cols"),
    "grouped_matmul": ("m", "k", "n", "g"),
    "quantized_matmul": ("m", "k", "n"),
    "paged_attention": ("b", "h", "g", "d", "pages", "page_size", "pages_per_sequence"),
    "all_gather": ("devices", "rows", "cols"),
    "reduce_scatter": ("devices", "rows", "cols"),
}


@pytest.mark.parametrize("name", sorted(CONTRACT_DIMENSIONS))
def test_the_records_have_the_contract_dimensions_and_a_reference(name):
    op = getattr(operations, name)
    assert op in operations.BUILT_IN
    assert op.dimensions == CONTRACT_DIMENSIONS[name]
    assert callable(op.load_reference()) and callable(op.load_xla())


@pytest.mark.parametrize("h, g, expected_g", [(4, 4, 4), (4, 2, 2), (4, 1, 1), (2, 4, 2),
                                               (1, 2, 1), (4, 3, 2)])
def test_flash_attention_draws_kv_heads_dividing_the_query_heads(h, g, expected_g):
    dims = {"b": 1, "h": h, "g": g, "s": 5, "t": 7, "d": 32}
    case = make_case(operations.flash_attention, dims, "float32", "normal", 0,
                     {"causal": False, "sm_scale": 1.0})
    q, k, v = case.args
    assert case.dims["g"] == expected_g and k.shape == v.shape == (1, expected_g, 7, 32)
    assert q.shape == (1, h, 5, 32)
    assert f"g={expected_g}" in repr(case)


def test_flash_attention_causal_cases_have_s_equal_to_t_and_the_scale_follows_d():
    dims = {"b": 1, "h": 2, "g": 1, "s": 100, "t": 256, "d": 128}
    case = make_case(operations.flash_attention, dims, "float32", "normal", 0,
                     {"causal": True, "sm_scale": "1/sqrt(d)"})
    assert case.dims["s"] == case.dims["t"] == 100
    assert case.kwargs["sm_scale"] == pytest.approx(1 / math.sqrt(128))
    assert "sm_scale=0.0883" in repr(case)
    uncausal = make_case(operations.flash_attention, dims, "float32", "normal", 0,
                         {"causal": False, "sm_scale": 1.0})
    assert (uncausal.dims["s"], uncausal.dims["t"]) == (100, 256)
    assert uncausal.kwargs["sm_scale"] == 1.0


def test_the_sweep_of_flash_attention_covers_both_masks_and_both_scales():
    cases = [sweep_case(operations.flash_attention, Domain(), i) for i in range(4)]
    assert {c.kwargs["causal"] for c in cases} == {False, True}
    # Each case's "1/sqrt(d)" is of its own d (the sweep's two shapes have different d).
    assert all(c.kwargs["sm_scale"] in (1.0, 1 / math.sqrt(c.dims["d"])) for c in cases)
    assert {c.kwargs["sm_scale"] == 1.0 for c in cases} == {True, False}
    assert all(c.dims["s"] == c.dims["t"] for c in cases if c.kwargs["causal"])


def test_constrain_of_your_own_op_is_applied_before_the_oracle_check():
    def constrain(dims, params):
        return {**dims, "n": dims["m"]}, {**params, "scale": 1.0 / dims["m"]}

    def oracle(x, y, *, scale):
        assert x.shape[0] == y.shape[1]  # square: m = n
        return scale * (x @ y)

    op = Operation("square", "(m,k),(k,n)->(m,n)", oracle=oracle, reduction="k",
                   params={"scale": ("1/m",)}, constrain=constrain)
    case = make_case(op, {"m": 3, "k": 4, "n": 5}, "float32", "normal", 0, {"scale": "1/m"})
    assert case.dims == {"m": 3, "k": 4, "n": 3}
    assert [a.shape for a in case.args] == [(3, 4), (4, 3)]
    assert case.kwargs == {"scale": pytest.approx(1 / 3)}
    with pytest.raises(OperationError, match="failed on inputs"):  # unconstrained: not square
        Operation("square", "(m,k),(k,n)->(m,n)", oracle=oracle, params={"scale": (1.0,)})


def test_a_reduction_over_several_dimensions_multiplies_their_sizes():
    op = operations.paged_attention
    assert op.reduction_dimensions == ("pages_per_sequence", "page_size")
    dims = {"b": 4, "h": 2, "g": 2, "d": 32, "pages": 16, "page_size": 8,
            "pages_per_sequence": 3}
    case = make_case(op, dims, "float32", "normal", 0, {})
    assert case.reduction_length == 24  # the capacity: every token a decode step may attend to
    lengths, tables = case.args[3], case.args[4]
    assert sorted(lengths.tolist()) == [1, 8, 9, 24]  # 1, a page, a page and one, the capacity
    assert len(set(tables.ravel().tolist())) == 12  # 16 pages: every table slot its own page
    with pytest.raises(OperationError, match="reduction names dimension 'x'"):
        Operation("op", "(r,c)->(r,c)", oracle=lambda x: x, reduction=("r", "x"))


@pytest.mark.parametrize("name, devices", [("all_gather", 2), ("all_gather", 4),
                                           ("reduce_scatter", 2), ("reduce_scatter", 8)])
def test_the_collectives_global_oracles_match_their_shapes(name, devices):
    op = getattr(operations, name)
    dims = {"devices": devices, "rows": 5, "cols": 3}
    case = make_case(op, dims, "int32", "normal", 0, {})
    from pytest_pallas.suite.properties import expected_output

    expected = expected_output(case)
    assert expected.shape == op.result_shape(dims)
    (x,) = case.args
    per_device = np.split(x.astype(np.int64), devices)
    if name == "all_gather":  # every device holds every block
        assert np.array_equal(expected, np.concatenate([x] * devices))
    else:  # device i holds rows block i of the sum
        total = np.sum(per_device, axis=0).astype(np.int32)
        assert np.array_equal(expected, total)
