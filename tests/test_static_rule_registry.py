"""A static TPU rule is one function registered where it is defined: the checks run it with
nothing else to change, in the order the chip meets its breach, and select it by name."""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from pytest_pallas.checks import violations
from pytest_pallas.checks.kernel_check import CheckOptions, check_kernel
from pytest_pallas.checks.static_rules import GRID_ORDER, OUT_OF_BOUNDS, TILING
from pytest_pallas.checks.violations import TpuRuleViolation, Violation, static_rule
from pytest_pallas.checks.vmem_footprint import VMEM

pytestmark = pytest.mark.pallas

STATIC_ONLY = CheckOptions(lower_for_tpu=False)
ONE_STEP = "one-step-grid"


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def blocked_copy(x, block):
    spec = pl.BlockSpec(block, lambda i: (0,) * len(block))
    return pl.pallas_call(_copy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(1,), in_specs=[spec], out_specs=spec, name="blocked_copy")(x)


@pytest.fixture
def registry(monkeypatch):
    """The registry as it is, restored after the test (a rule registered inside goes)."""
    monkeypatch.setattr(violations, "_STATIC_RULES", dict(violations._STATIC_RULES))


def _register_one_step_rule(stage="run"):
    @static_rule(ONE_STEP, stage=stage)
    def one_step_grid(call, info, options, report):
        if tuple(call.grid) != (1,):
            return []
        return [Violation(ONE_STEP, call.title, None, "its grid has one step.", "give it two.")]

    return one_step_grid


def _rules_broken(block, options=STATIC_ONLY):
    x = jax.ShapeDtypeStruct((16, 256), jnp.float32)
    with pytest.raises(TpuRuleViolation) as raised:
        check_kernel(blocked_copy, x, block, chip="v5e", check_options=options,
                     use_compiler=False)
    return raised.value


def test_a_registered_rule_runs_in_check_kernel_with_its_problem_and_fix(registry):
    _register_one_step_rule()
    error = _rules_broken((8, 128))
    assert error.rule == ONE_STEP
    assert str(error).startswith("TPU rule [one-step-grid] broken by kernel 'blocked_copy")
    assert str(error).endswith(": its grid has one step. Fix: give it two.")


def test_rules_report_in_the_order_the_chip_meets_them(registry):
    # Registered last, but the chip's lowering rejects the blocks (the input's and the
    # output's) before anything runs.
    _register_one_step_rule(stage="run")
    error = _rules_broken((4, 128))
    assert [v.rule for v in error.violations] == [TILING, TILING, ONE_STEP]


def test_a_lowering_or_allocation_rule_is_a_compile_time_rule(registry):
    assert {TILING, VMEM} <= violations.compile_time_rules()
    assert OUT_OF_BOUNDS not in violations.compile_time_rules()
    _register_one_step_rule(stage="lowering")
    assert ONE_STEP in violations.compile_time_rules()


def test_checks_select_rules_by_name(registry):
    _register_one_step_rule()
    assert _rules_broken((4, 128), CheckOptions(lower_for_tpu=False, checks=(TILING,))
                         ).rule == TILING
    x = jax.ShapeDtypeStruct((16, 256), jnp.float32)
    reports = check_kernel(blocked_copy, x, (4, 128), chip="v5e", use_compiler=False,
                           check_options=CheckOptions(lower_for_tpu=False,
                                                      checks=(VMEM, GRID_ORDER)))
    assert reports[0].ok


def test_a_check_naming_no_rule_is_a_usage_error():
    x = jax.ShapeDtypeStruct((16, 256), jnp.float32)
    with pytest.raises(ValueError, match=r"names no static rule tilling; the static rules are "
                                         r"block-tiling, vmem-footprint, grid-order"):
        check_kernel(blocked_copy, x, (8, 128), chip="v5e", use_compiler=False,
                     check_options=CheckOptions(lower_for_tpu=False, checks=("tilling",)))


def test_two_rules_of_one_name_are_an_error(registry):
    with pytest.raises(ValueError, match="two static rules are named 'block-tiling'"):
        static_rule(TILING, stage="lowering")(lambda call, info, options, report: [])
