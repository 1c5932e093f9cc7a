"""Which kernel grid axes the suite exercised, and shapes that exercise them.

A kernel that drops its last k step, or leaves a ragged last row block unwritten, is
right whenever that grid axis runs one step or ends on a whole block. The suite records,
per kernel and grid axis, whether an example ran it with several steps and with a
ragged last block, names in the summary and the report every axis that never ran more
than one step, and its sweep tries a ragged multi-tile shape and a shape of several
whole tiles, so that neither bug depends on the seed.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from pytest_pallas._compat import jax_internals, pallas_call_hooks
from pytest_pallas.checks import kernel_model
from pytest_pallas.ops import inputs as op_inputs
from pytest_pallas.ops.domains import Domain
from pytest_pallas.ops.registry import OP_NAMES, get_operation
from pytest_pallas.suite import grid_coverage
from pytest_pallas.suite.report import ConformanceRecorder


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _tiled_copy(x, block=(8, 128)):
    rows, cols = x.shape
    spec = pl.BlockSpec(block, lambda i, j: (i, j))
    return pl.pallas_call(
        _copy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(pl.cdiv(rows, block[0]), pl.cdiv(cols, block[1])),
        in_specs=[spec], out_specs=spec, interpret=True)(x)


def _traced_axes(function, *args, **names):
    runs = []

    def observer(params):
        runs.extend(grid_coverage.axis_runs(kernel_model.describe_pallas_call(params), **names))

    with pallas_call_hooks.observe_pallas_calls(observer):
        jax.make_jaxpr(function)(*args)
    return runs


def test_each_grid_axis_is_matched_to_the_dimension_it_walks_with_its_steps_and_end():
    x = jnp.zeros((29, 384), jnp.float32)  # 3 x 8 + 5 rows, 3 x 128 columns
    runs = _traced_axes(_tiled_copy, x, argument_names=(("rows", "cols"),),
                        result_names=("rows", "cols"), argument_shapes=((29, 384),))
    assert [(r.kernel, r.axis, r.walks, r.steps, r.ragged_last) for r in runs] == [
        ("_copy_kernel", 0, "rows", 4, True),
        ("_copy_kernel", 1, "cols", 3, False),
    ]
    # An operand that is not an argument of the op as drawn: named by its kernel parameter.
    runs = _traced_axes(lambda x: _tiled_copy(x.reshape(24, 256)), jnp.zeros((6144,)))
    assert [(r.walks, r.steps, r.ragged_last) for r in runs] == [
        ("x_ref dim 0", 3, False), ("x_ref dim 1", 2, False)]


def test_an_axis_never_run_with_several_steps_is_named_and_merged_across_workers():
    def record(shape):
        recorder = ConformanceRecorder()
        recorder.register("copy", "mine", {}, "none")
        recorder.grid_axes("copy", _traced_axes(
            _tiled_copy, jnp.zeros(shape), argument_names=(("rows", "cols"),),
            result_names=("rows", "cols"), argument_shapes=(shape,)))
        return recorder

    one_row_block = record((8, 256))  # rows: one step; cols: two whole blocks
    assert one_row_block.coverage_lines() == [
        "copy: kernel _copy_kernel grid axis 0 (rows) never ran more than one step"]
    controller = ConformanceRecorder()
    controller.merge(one_row_block.take())
    controller.merge(record((29, 128)).take())  # as a second pytest-xdist worker sends it
    assert controller.coverage_lines() == []  # each axis had several steps in one worker
    entries = controller.document(complete=True, environment={})["ops"]["copy"]["grid_coverage"]
    assert [(e["axis"], e["walks"], e["multi_step"], e["most_steps"], e["ragged_last"],
             e["examples"]) for e in entries] == [
        (0, "rows", True, 4, True, 2), (1, "cols", True, 2, False, 2)]
    json.dumps(entries, allow_nan=False)


@pytest.mark.parametrize("op", OP_NAMES)
def test_the_sweep_has_a_ragged_multi_tile_and_a_whole_multi_tile_size_on_every_tiled_dimension(
        op):
    operation = get_operation(op)
    cases = [op_inputs.sweep_case(operation, Domain(), index) for index in range(2)]
    if operation.is_elementwise:
        kinds = {"second_minor": 0, "minor": 1}
        sizes = {kind: {case.dims["shape"][axis] for case in cases}
                 for kind, axis in kinds.items()}
    else:
        sizes = {}
        for dim in operation.dimensions:
            if dim not in operation.sizes:
                sizes.setdefault(operation.dimension_kind(dim), set()).update(
                    case.dims[dim] for case in cases)
    tiles = {"second_minor": (8, 16), "minor": (128,), "reduction": (128,)}
    for kind, tried in sizes.items():
        for tile in tiles.get(kind, ()):
            assert any(size > tile and size % tile for size in tried), (
                f"{op}: no {kind} size ragged across several tiles of {tile} in {tried}")
            assert any(size >= 2 * tile and size % tile == 0 for size in tried), (
                f"{op}: no {kind} size of several whole tiles of {tile} in {tried}")


@pytest.mark.parametrize("op, bug", [
    # k blocked by 128 only when 128 divides it: k = 300 is one block, k = 512 four.
    ("matmul", "matmul_last_k_step_dropped"),
    # rows in blocks of 8: 24 and 40 rows are whole blocks, 29 has a ragged last one.
    ("add", "add_ragged_row_block_not_written"),
])
def test_a_bug_on_one_grid_axis_fails_on_the_sweep_alone(run_value_property, op, bug):
    # One drawn example (seed 0 draws no revealing size): the sweep's shapes must catch it.
    result, report = run_value_property(op, f"seeded_bugs.kernels:{bug}", "--pallas-seed=0",
                                        "--pallas-examples=1")
    assert result.ret == 1
    assert "input (sweep case" in result.stdout.str()  # a sweep case, not a drawn one
    assert report["properties"]["value"]["verdict"] == "fail" or (
        report["properties"]["finite"]["verdict"] == "fail")


def test_the_summary_and_the_report_name_the_axes_that_never_ran_several_steps(run_value_property):
    # matmul_blocked declares no block keywords, so the suite calls it with its default
    # blocks, a dimension of up to 512 in one block: m and n, at most 40 and 384 in the
    # contract's sizes, never run more than one step.
    result, report = run_value_property(
        "matmul", "pytest_pallas.reference_kernels.matmul:matmul_blocked",
        "--pallas-seed=0", "--pallas-examples=1")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "not exercised: matmul: kernel matmul grid axes 0 (m), 1 (n)* never ran more than one "
        "step",
    ])
    axes = {entry["walks"]: entry for entry in report["grid_coverage"]}
    assert set(axes) == {"m", "n", "k"}
    assert not axes["m"]["multi_step"] and axes["m"]["most_steps"] == 1
    assert all(entry["examples"] >= 1 for entry in axes.values())


def test_coverage_never_fails_a_kernel_when_the_grid_cannot_be_read(monkeypatch):
    # A JAX whose pallas_call params this module cannot read: the feature turns off with a
    # warning, the kernel's trace goes on.
    def unreadable(params):
        raise jax_internals.JaxInternalsChanged("no grid mapping")

    from pytest_pallas.suite import harness, implementation

    monkeypatch.setattr(kernel_model, "describe_pallas_call", unreadable)
    monkeypatch.setattr(jax_internals, "_features_off", {})
    recorder = ConformanceRecorder()
    add = get_operation("add")
    conformance = harness.Conformance(implementation.bind_function(add, _tiled_copy, "mine"),
                                      backend=None, recorder=recorder)
    case = op_inputs.sweep_case(add, Domain(), 0)
    with pytest.warns(jax_internals.JaxFeatureOff, match="grid coverage"):
        with conformance._grid_recorded(case) as runs:
            result = _tiled_copy(np.zeros((16, 128), np.float32))
    assert runs == [] and result.shape == (16, 128)
    assert recorder.coverage_lines() == []


def test_an_op_whose_value_property_failed_has_no_not_exercised_line():
    """It stopped at its first failing example: the axes later examples would have stepped
    say nothing of its inputs, and the failure is what the run reports."""
    from pytest_pallas.suite.grid_coverage import AxisRun
    from pytest_pallas.suite.implementation import bind_function

    lines = {}
    for verdict in (True, False):
        recorder = ConformanceRecorder()
        implementation = bind_function(get_operation("add"), _tiled_copy, "mine")
        row = recorder.row(implementation)
        recorder.grid_axes(row, [AxisRun("copy", 0, "rows", 1, None)])
        recorder.outcome(row, "value", verdict, "" if verdict else "wrong")
        lines[verdict] = recorder.coverage_lines()
    assert lines[True] == ["add: kernel copy grid axis 0 (rows) never ran more than one step"]
    assert lines[False] == []
