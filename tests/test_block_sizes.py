"""Declared block keywords: the suite picks small legal blocks, so every grid axis steps.

The reference kernels take a whole dimension of up to 512 in one block, and the
contract's sizes stay below that: without smaller blocks their multi-block code (the k
accumulation, the online softmax across kv blocks, a ragged last block) never runs in
the suite. An implementation declares its block keywords with ``@supports(blocks=...)``
and the sweep and the draws pick blocks that split the drawn sizes into several steps.
"""

from __future__ import annotations

import pytest

from pytest_pallas import operations, supports
from pytest_pallas.ops import inputs as op_inputs
from pytest_pallas.ops.domains import SupportsError, declared_domain
from pytest_pallas.ops.operation import load


def test_a_block_keyword_for_a_dimension_the_op_lacks_is_named():
    @supports(blocks={"block_m": "m", "block_x": "x"})
    def kernel(x, y, *, block_m=None, block_x=None): ...

    with pytest.raises(SupportsError, match="blocks=.*'block_x': 'x'.*no dimension 'x'"):
        declared_domain(kernel).validate_for("matmul", ("m", "k", "n"), ("float32",))


@pytest.mark.parametrize("blocks", [{"block_m": 8}, {"block_m": ("m", 0)}, ["block_m"]])
def test_a_malformed_block_declaration_says_how_to_write_one(blocks):
    with pytest.raises(SupportsError, match=r"e\.g\. blocks=\{'block_m': 'm'"):
        supports(blocks=blocks)


@pytest.mark.parametrize("op", [op.name for op in operations.BUILT_IN
                                if declared_domain(load(op.reference)).blocks])
def test_every_sweep_case_splits_each_blocked_dimension_past_a_tile_into_several_blocks(op):
    operation = operations.__dict__[op]
    domain = declared_domain(load(operation.reference))
    index, ragged = 0, set()
    while (case := op_inputs.sweep_case(operation, domain, index)) is not None:
        for keyword, (dim, declared) in domain.blocks.items():
            size = case.dims[dim]
            multiple = op_inputs.block_multiple(operation, dim, case.dtype, declared)
            if size <= multiple:
                assert keyword not in case.blocks  # one tile: the kernel's default
                continue
            block = case.blocks[keyword]
            assert block % multiple == 0 and block < size, (case, keyword)
            if size % block:
                ragged.add(keyword)
        index += 1
    # The ragged shape (29 rows, 200 lanes, k = 300) ends every sublane and lane axis on a
    # ragged block.
    assert ragged, op


def test_a_kernel_that_needs_dividing_blocks_gets_them():
    domain = supports(blocks={"block_k": "k"}, ragged_blocks=False)(lambda x, y: x)
    domain = declared_domain(domain)
    choices = op_inputs.block_choices(operations.matmul, domain, {"m": 8, "k": 384, "n": 128},
                                      "float32")
    assert all(size is None or 384 % size == 0 for size in choices["block_k"])
    assert choices["block_k"][0] == 128  # 384 = 3 x 128: no two-block split divides it


@pytest.mark.parametrize("op, bug", [
    ("matmul", "matmul_k_steps_overwrite"),
    ("attention", "attention_kv_blocks_missing_rescale"),
    ("rms_norm", "rms_norm_ragged_rows_dropped"),
])
def test_a_bug_in_multi_block_code_fails_on_the_sweep_alone_once_blocks_are_declared(
        run_value_property, op, bug):
    result, report = run_value_property(op, f"seeded_bugs.blocks:{bug}", "--pallas-seed=0",
                                        "--pallas-examples=1")
    assert result.ret == 1
    assert "input (sweep case" in result.stdout.str()
    assert any(report["properties"][name]["verdict"] == "fail" for name in ("value", "finite"))
    # Undeclared, the same kernel runs one block per dimension and passes.
    result, _ = run_value_property(op, f"seeded_bugs.blocks:undeclared.{bug}",
                                   "--pallas-seed=0", "--pallas-examples=1")
    assert result.ret == 0


def test_the_reference_matmul_runs_every_grid_axis_in_several_steps(run_value_property):
    result, report = run_value_property(
        "matmul", "pytest_pallas.reference_kernels.matmul:matmul",
        "--pallas-seed=0", "--pallas-examples=1")
    assert result.ret == 0
    assert "not exercised" not in result.stdout.str()
    # m, n and k: the kernel pads its operands to whole blocks (so the report names the
    # padded operand's dimension, and no block is ragged), and every axis steps.
    assert len(report["grid_coverage"]) == 3
    assert all(entry["multi_step"] for entry in report["grid_coverage"])
    assert report["restrictions"]["blocks"]["block_k"] == {"dimension": "k", "multiple": None}
