"""The sweep's structural cases: every value of an op's own sizes, its device count and its
params, and every kept combination of its ``sweep_pairs``, whatever the seed."""

from __future__ import annotations

import pytest

from pytest_pallas import operations
from pytest_pallas.ops import inputs as op_inputs
from pytest_pallas.ops.domains import Domain
from pytest_pallas.ops.operation import Operation, OperationError


def _sweep_cases(op):
    return [op_inputs.sweep_case(op, Domain(), index)
            for index in range(op_inputs.sweep_count(op, Domain()))]


@pytest.mark.parametrize("op", [op for op in operations.BUILT_IN if not op.is_elementwise],
                         ids=lambda op: op.name)
def test_every_value_of_every_structural_dimension_and_param_is_swept(op):
    cases = _sweep_cases(op)
    for dim in op.dimensions:
        wanted = set(op_inputs.dimension_bucket(op, dim))
        if op.dimension_kind(dim) == "devices":
            wanted = {n for n in wanted if n <= 4}  # 8 in the draws: a ring bug shows on 4
        elif dim not in op.sizes:
            wanted = {min(wanted)}  # rows = 1, cols = 1; the tiled sizes in the two shapes
        assert wanted <= {case.dims[dim] for case in cases}, dim
    for name, values in op.params.items():
        swept = {repr(case.kwargs[name]) for case in cases}
        assert len(swept) >= len(set(map(repr, values))) or name == "sm_scale", name


def test_the_interacting_pairs_are_swept_in_every_kept_combination():
    flash = [(c.dims["h"], c.dims["g"]) for c in _sweep_cases(operations.flash_attention)]
    assert {(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4)} <= set(flash)  # GQA: (4, 2)
    assert any(not c.kwargs["causal"] and c.dims["s"] < c.dims["t"]
               for c in _sweep_cases(operations.flash_attention))
    paged = {(c.dims["page_size"], c.dims["pages_per_sequence"])
             for c in _sweep_cases(operations.paged_attention)}
    assert paged == {(8, 1), (8, 2), (16, 1), (16, 2)}


def test_a_sweep_pair_must_name_dimensions_or_params():
    with pytest.raises(OperationError, match="sweep_pairs entry .*'rows', 'heads'"):
        Operation("norm", "(rows,cols)->(rows,cols)", oracle=lambda x: x,
                  sweep_pairs=(("rows", "heads"),))


@pytest.mark.parametrize("op, bug", [
    ("flash_attention", "structure:flash_attention_gqa_head_modulo"),
    ("flash_attention", "structure:flash_attention_key_mask_from_query_length"),
    ("paged_attention", "structure:paged_attention_page_size_16"),
    ("ppermute", "kernels:ppermute_wrong_direction"),
    ("rms_norm", "structure:rms_norm_without_eps"),  # the first case: rows = 1, cols = 1
])
def test_a_bug_of_one_structural_value_fails_on_the_sweep_alone(run_value_property, op, bug):
    result, report = run_value_property(op, f"seeded_bugs.{bug}", "--pallas-seed=0",
                                        "--pallas-examples=1")
    assert result.ret == 1
    assert "input (sweep case" in result.stdout.str()
    assert any(report["properties"][name]["verdict"] == "fail" for name in ("value", "finite"))
