"""The conformance suite's power: it fails every seeded bug and passes every correct alternative.

Each case runs the installed suite in-process (pytester) on one op, with the
implementation given by ``--pallas-impl``, and reads the verdict per property
from the ``--pallas-report`` JSON:

* a seeded bug (``tests/seeded_bugs/kernels.py``) must make the run fail
  (exit status 1) on the property that models its mistake: ``written`` for
  an uninitialised accumulator, ``value`` for a dropped block, ``finite`` for
  an overflowing softmax, ... Only the conformance test that checks that
  property is run (``-k``), which keeps the case fast and the claim precise.
* a correct alternative (``tests/seeded_bugs/correct.py``) must pass every
  property of its op (exit status 0).

Every run uses ``--pallas-seed=0`` (``PALLAS_POWER_SEED=N`` in the environment
picks another, to check that no bug is caught by luck of the seed). A correct
alternative runs the default number of examples (10; the
written/deterministic and vmap properties run a fifth of them, at least 2).
A seeded bug runs 30: a run stops at its first failure, so this costs time
only when a bug is hard to find. Before the value property's sweep (explicit
examples of every value profile and dtype, ``ops.inputs.sweep``), 10 drawn
examples missed the bugs that show on one profile or dtype only for some
seeds: over seeds 0..22, 19 of 115 runs of five such bugs; with the sweep,
none (docs/evidence/sweep-and-grid-coverage.md).

Hypothesis's shrink and explain phases are switched off by a small plugin
(``-p _pallas_no_shrink``, in tests/_pallas_no_shrink.py): they only simplify a
failure already found, cost minutes of kernel compilations, and do not change
the verdict.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

TESTS_DIR = pathlib.Path(__file__).resolve().parent
SEED = int(os.environ.get("PALLAS_POWER_SEED", "0"))
EXAMPLES = 10  # for a correct alternative: the profiles' default
BUG_EXAMPLES = 30  # for a seeded bug (see the module docstring)

# Which conformance test checks which property.
_TEST_OF_PROPERTY = {
    "shape_dtype": "test_value",
    "finite": "test_value",
    "value": "test_value",
    "written": "test_written_and_deterministic",
    "deterministic": "test_written_and_deterministic",
    "vmap": "test_vmap",
}

# (op, seeded bug in seeded_bugs.kernels, the properties that catch it). Where
# two are named, which one fails depends on the dtype drawn: an unwritten or
# garbage output element is NaN in a float output ("finite") and a wrong
# number in an int32 one ("value"). All properties of one entry are checked
# by the same conformance test.
BUGS = [
    ("add", "add_tail_not_written", ("finite", "value")),
    ("add", "add_int32_via_float32", ("value",)),
    ("add", "add_ragged_row_block_not_written", ("finite", "value")),
    ("sum", "sum_uninitialized_accumulator", ("written",)),
    ("sum", "sum_started_flag_assumed_zero", ("written",)),
    ("sum", "sum_unmasked_ragged_block", ("finite",)),
    ("matmul", "matmul_uninitialized_accumulator", ("written",)),
    ("matmul", "matmul_dropped_last_k_block", ("value",)),
    ("matmul", "matmul_last_k_step_dropped", ("value",)),
    ("matmul", "matmul_jax_kernel_undeclared_domain", ("finite", "value")),
    ("matmul_activation", "matmul_activation_per_k_block", ("value",)),
    ("batched_matmul", "batched_matmul_rhs_batch_ignored", ("value",)),
    ("softmax", "softmax_no_max_subtraction", ("finite",)),
    ("softmax", "softmax_online_missing_rescale", ("value",)),
    ("attention", "attention_missing_rescale", ("value",)),
    ("attention", "attention_no_max_subtraction", ("finite",)),
    ("mha", "mha_batch_head_swapped", ("value",)),
    ("mqa", "mqa_kv_indexed_by_head", ("value",)),
    ("copy", "copy_read_before_wait", ("written",)),
    ("copy", "copy_tail_rows_not_written", ("finite", "value")),
    ("ppermute", "ppermute_wrong_direction", ("value",)),
    ("ppermute", "ppermute_no_recv_wait", ("written",)),
]

# The version 0.2 ops' seeded bugs (seeded_bugs.new_ops): (op, bug, the properties that catch
# it), as BUGS. Each is a kernel that runs and returns the right shape and dtype; the record's
# derived allowance must still be tight enough to fail it.
NEW_OP_BUGS = [
    ("flash_attention", "flash_attention_bfloat16_accumulator", ("value",)),
    ("flash_attention", "flash_attention_unscaled", ("value",)),
    ("flash_attention", "flash_attention_mask_off_by_one", ("value",)),
    ("flash_attention", "flash_attention_mask_block_local", ("value",)),
    ("rms_norm", "rms_norm_bfloat16_accumulator", ("value",)),
    ("grouped_matmul", "grouped_matmul_bfloat16_accumulator", ("value",)),
    ("grouped_matmul", "grouped_matmul_group_end_off_by_one", ("value",)),
    ("quantized_matmul", "quantized_matmul_bfloat16_accumulator", ("value",)),
    ("quantized_matmul", "quantized_matmul_int8_read_as_uint8", ("value",)),
    ("paged_attention", "paged_attention_stale_last_page", ("finite", "value")),
    ("paged_attention", "paged_attention_ignores_page_table", ("value",)),
    ("all_gather", "all_gather_one_receive_semaphore", ("finite", "value")),
    ("reduce_scatter", "reduce_scatter_bfloat16_partial_sums", ("value",)),
    ("reduce_scatter", "reduce_scatter_keeps_the_next_block", ("value",)),
]

# (op, correct alternative in seeded_bugs.correct, its @supports restrictions as reported)
CORRECT = [
    ("add", "add_jnp", "none"),
    ("add", "add_2d_grid_small_blocks", "none"),
    ("add", "add_1d_grid_small_blocks", "none"),
    ("sum", "sum_jnp", "none"),
    ("sum", "sum_tiled_small_blocks", "none"),
    ("sum", "sum_whole_slab", "none"),
    ("matmul", "matmul_jnp", "none"),
    ("matmul", "matmul_small_blocks", "none"),
    ("matmul", "matmul_jax", "m%8==0; k%128==0; n%128==0"),
    ("matmul_activation", "matmul_activation_jnp", "none"),
    ("matmul_activation", "matmul_activation_small_blocks", "none"),
    ("batched_matmul", "batched_matmul_jnp", "none"),
    ("batched_matmul", "batched_matmul_small_blocks", "none"),
    ("softmax", "softmax_jnp", "none"),
    ("softmax", "softmax_small_blocks", "none"),
    ("attention", "attention_jnp", "none"),
    ("attention", "attention_small_blocks", "none"),
    ("attention", "attention_jax_flash", "s%128==0; t%128==0"),
    ("attention", "attention_jax_flash_fitted_blocks", "dtypes=float32,bfloat16"),
    ("mha", "mha_jnp", "none"),
    ("mha", "mha_small_blocks", "none"),
    ("mha", "mha_jax_flash", "s%128==0; t%128==0"),
    ("mha", "mha_jax_flash_fitted_blocks", "dtypes=float32,bfloat16"),
    ("mqa", "mqa_jnp", "none"),
    ("mqa", "mqa_small_blocks", "none"),
    ("mqa", "mqa_jax_flash", "s%128==0; t%128==0"),
    ("copy", "copy_jnp", "none"),
    ("copy", "copy_double_buffered_small_blocks", "none"),
    ("ppermute", "ppermute_jnp", "none"),
    ("ppermute", "ppermute_in_chunks", "none"),
]

_DEVICES_NEEDED = 8  # the collective ops draw 2, 4 and 8 devices
_COLLECTIVE_OPS = ("ppermute", "all_gather", "reduce_scatter")


def _in_process_has_devices() -> bool:
    """Whether an in-process run can have 8 CPU devices (else it needs a fresh process)."""
    from pytest_pallas._compat import jax_internals

    if not jax_internals.backends_are_initialized():
        return True  # the run's plugin asks JAX for its 8 devices before JAX starts
    import jax

    return jax.device_count("cpu") >= _DEVICES_NEEDED


@pytest.fixture
def conformance_run(pytester, monkeypatch):
    """``run(op, target, *args, examples=)``: the suite on ``target`` for ``op``.

    Returns pytester's result and the op's entry of the JSON report.
    """
    pytester.syspathinsert(TESTS_DIR)
    monkeypatch.setenv("PYTHONPATH", str(TESTS_DIR))  # for a subprocess run
    report = pytester.path / "pallas-report.json"

    def run(op: str, target: str, *args: str, examples: int = EXAMPLES):
        argv = ["-p", "no:cacheprovider", "-p", "_pallas_no_shrink", "--pallas-conformance",
                "--pallas-impl", f"{op}={target}", f"--pallas-ops={op}",
                f"--pallas-seed={SEED}", f"--pallas-examples={examples}",
                f"--pallas-report={report}", *args]
        if op in _COLLECTIVE_OPS and not _in_process_has_devices():
            result = pytester.runpytest_subprocess(*argv, timeout=1200)
        else:
            result = pytester.runpytest(*argv)
        assert report.exists(), result.stdout.str()[-3000:]
        document = json.loads(report.read_text())
        assert document["complete"], document
        return result, document["ops"][op]

    return run


def _failed_properties(op_report: dict) -> set[str]:
    return {name for name, prop in op_report["properties"].items() if prop["verdict"] == "fail"}


_SEEDED = [(op, f"seeded_bugs.kernels:{bug}", properties) for op, bug, properties in BUGS] + [
    (op, f"seeded_bugs.new_ops:{bug}", properties) for op, bug, properties in NEW_OP_BUGS]


@pytest.mark.parametrize("op, target, properties", _SEEDED,
                         ids=[f"{op}-{target.partition(':')[2]}" for op, target, _ in _SEEDED])
def test_suite_fails_seeded_bug(conformance_run, op, target, properties):
    (test_name,) = {_TEST_OF_PROPERTY[name] for name in properties}
    bug = target.partition(":")[2]
    result, op_report = conformance_run(op, target, "-k", test_name, examples=BUG_EXAMPLES)
    output = result.stdout.str()
    assert result.ret == 1, output[-3000:]
    assert op_report["implementation"] == target
    failed = _failed_properties(op_report)
    caught_by = sorted(failed & set(properties))
    assert caught_by, (f"{bug}: expected {' or '.join(properties)} to fail, failed: "
                       f"{sorted(failed)}\n{output[-3000:]}")
    assert all(op_report["properties"][name]["first_failure"] for name in caught_by)
    # The summary table names the failing property too.
    summary = [line for line in output.splitlines() if line.startswith(f"{op} ") and target in line]
    assert summary and any(name in summary[0] for name in caught_by), output[-3000:]


_REJECTED_BY_THE_TPU_COMPILER = ("attention_jax_flash_fitted_blocks",
                                 "mha_jax_flash_fitted_blocks", "ppermute_in_chunks",
                                 "copy_double_buffered_small_blocks")


@pytest.mark.parametrize("op, alternative, restrictions", CORRECT,
                         ids=[f"{op}-{alt}" for op, alt, _ in CORRECT])
def test_suite_passes_correct_alternative(conformance_run, op, alternative, restrictions):
    # These are correct in value but the TPU compiler (on by default where libtpu is
    # installed) rejects them at some drawn shapes: JAX's flash attention on bfloat16
    # with a single key ("'vector.broadcast' op failed to verify"), and ppermute_in_chunks'
    # 12-row VMEM slices ("Slice sizes along tiled dimensions must be aligned to tiles"), as
    # the reference double_buffered_copy(block_rows=16) on the sweep's 29 rows (a 13-row tail).
    # What this test measures is the suite's value properties, so they run without it.
    flags = (("--pallas-compile=none",) if alternative in _REJECTED_BY_THE_TPU_COMPILER
             else ())
    result, op_report = conformance_run(op, f"seeded_bugs.correct:{alternative}", *flags)
    output = result.stdout.str()
    assert result.ret == 0, output[-5000:]
    verdicts = {name: prop["verdict"] for name, prop in op_report["properties"].items()}
    assert verdicts and set(verdicts.values()) == {"pass"}, verdicts
    assert {"shape_dtype", "finite", "value", "written", "deterministic"} <= set(verdicts)
    # The summary table shows the declared restrictions, so coverage is visible.
    summary = [line for line in output.splitlines()
               if line.startswith(op + " ") and f"seeded_bugs.correct:{alternative}" in line]
    assert summary and summary[0].endswith(restrictions), output[-3000:]


# The version 0.2 ops' plain-XLA versions (pytest_pallas.ops.xla_versions): a second correct
# implementation of each, written independently of its reference kernel, so a tolerance or
# input structure tuned to the reference kernel alone shows up as a false alarm here.
NEW_OPS = ("flash_attention", "rms_norm", "grouped_matmul", "quantized_matmul",
           "paged_attention", "all_gather", "reduce_scatter")


@pytest.mark.parametrize("op", NEW_OPS)
def test_suite_passes_plain_xla_version(conformance_run, op):
    target = f"pytest_pallas.ops.xla_versions:{op}"
    result, op_report = conformance_run(op, target)
    output = result.stdout.str()
    assert result.ret == 0, output[-5000:]
    verdicts = {name: prop["verdict"] for name, prop in op_report["properties"].items()}
    assert verdicts and set(verdicts.values()) == {"pass"}, verdicts
    assert {"shape_dtype", "finite", "value", "written", "deterministic"} <= set(verdicts)
