"""The conformance suite's tests, generated from ``Operation`` records.

Two users of the same generator:

* ``conformance_tests(op, implementation)``: a pytest test class for one op
  and one implementation, for a user's test module (public, see
  docs/your-own-op.md);
* the packaged suite (``conformance/test_*.py``), whose modules each hold the
  built-in ops of one kernel module (``conformance/test_matmul.py``: the ops
  whose reference kernels live in ``reference_kernels/matmul.py``), and
  ``conformance/test_operations.py`` every other op (a new built-in op with a
  kernel module of its own, or an op registered from a conftest).

Each test draws with ``st.data()`` (the domain depends on the implementation,
chosen on the command line or given here, so it cannot be fixed at import
time) and hands over to the harness (``suite.harness.Conformance``).
The value property checks the profile's full number of examples after the
sweep (explicit examples that try each value profile and dtype on purpose,
``ops.inputs.sweep``), drawn as a fifth as many signatures with five inputs each
(``ops.inputs.VALUES_PER_SIGNATURE``: one compilation serves all five); the
properties that cost several kernel calls per example (written and
deterministic, vmap) run a fifth of them, at least two.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ..ops.domains import SupportsError
from ..ops.inputs import VALUES_PER_SIGNATURE, SweepSlot, sweep_slots
from ..ops.operation import Operation
from ..ops.registry import OPERATIONS
from .implementation import bind_function
from .membership import CLASS_ATTRIBUTE, CONFORMANCE_DIRECTORY

__all__ = ["conformance_tests", "packaged_tests"]

# The attribute of a test function that the plugin turns into its Hypothesis settings when
# the test runs (the profile is only known then): ``f(settings.default) -> settings``.
SETTINGS_ATTRIBUTE = "_pallas_settings"


def _examples_setting(examples: int | None, count: Callable[[int], int]) -> Callable:
    """Settings that run ``count(total)`` Hypothesis examples, ``total`` being ``examples``
    or, when None, the profile's count (known only when the test runs)."""
    def make(default: Any) -> Any:
        total = examples if examples is not None else default.max_examples
        return settings(default, max_examples=count(total))

    return make


def _secondary(examples: int | None) -> Callable:
    """The properties that cost several kernel calls per example: a fifth, at least two."""
    return _examples_setting(examples, lambda total: max(2, total // 5))


def _primary(examples: int | None) -> Callable:
    """The value property's settings: ``examples`` value checks (default: the profile's),
    drawn as signatures of ``VALUES_PER_SIGNATURE`` inputs each."""
    return _examples_setting(examples,
                             lambda total: max(1, -(-total // VALUES_PER_SIGNATURE)))


def _with_sweep(test: Callable, slots: int) -> Callable:
    for index in reversed(range(slots)):  # the first applied runs last
        test = example(data=SweepSlot(index))(test)
    return test


def _tag(test: Callable, make_settings: Callable) -> Callable:
    setattr(test, SETTINGS_ATTRIBUTE, make_settings)
    return test


def _value_doc(test: Callable) -> Callable:
    test.__doc__ = ("Shape and dtype, no NaN/Inf the oracle lacks, and the value within the "
                    "tolerance.")
    return test


_REPEATABLE_DOC = "Every output element is written, and two calls on one input agree bit for bit."
_VMAP_DOC = "The op under jax.vmap equals the op on each batch element."


def packaged_tests(module_name: str) -> dict[str, Any]:
    """The test functions of packaged module ``module_name`` (``...conformance.test_matmul``).

    Parametrized by the ops' records, named by the ops' names (``test_value[matmul]``), so
    that ``--pallas-ops`` and ``--pallas-impl`` select among them; the ``conformance`` fixture
    hands each test the implementation of its op.
    """
    ops = _packaged_ops(module_name.rpartition(".")[2].removeprefix("test_"))
    tests: dict[str, Any] = {"pytestmark": pytest.mark.pallas, "OPS": [op.name for op in ops]}
    if not ops:
        return tests
    slots = max(sweep_slots(op) for op in ops)

    @_by_op(ops)
    @_with_sweep_decorator(slots)
    @given(data=st.data())
    def test_value(op, data, conformance):
        conformance.check_value(data)

    @_by_op(ops)
    @given(data=st.data())
    def test_written_and_deterministic(op, data, conformance):
        conformance.check_repeatable(data)

    tests["test_value"] = _tag(_value_doc(test_value), _primary(None))
    test_written_and_deterministic.__doc__ = _REPEATABLE_DOC
    tests["test_written_and_deterministic"] = _tag(test_written_and_deterministic,
                                                   _secondary(None))
    vmapped = [op for op in ops if op.vmap]
    if vmapped:
        @_by_op(vmapped)
        @given(data=st.data())
        def test_vmap(op, data, conformance):
            conformance.check_vmap(data)

        test_vmap.__doc__ = _VMAP_DOC
        tests["test_vmap"] = _tag(test_vmap, _secondary(None))
    for test in ("test_value", "test_written_and_deterministic", "test_vmap"):
        if test in tests:
            tests[test].__module__ = module_name
    return tests


def _by_op(ops: list[Operation]) -> Callable:
    """Parametrize a packaged test by the ops' records; each test id is the op's name."""
    return pytest.mark.parametrize("op", ops, ids=[op.name for op in ops])


def _with_sweep_decorator(slots: int) -> Callable:
    return lambda test: _with_sweep(test, slots)


def _packaged_ops(kernel_module: str) -> list[Operation]:
    """The ops of packaged module ``test_<kernel_module>``: those whose reference kernel lives
    in that kernel module; ``test_operations`` has every op no other packaged module has."""
    own = {name[len("test_"):-len(".py")] for name in os.listdir(CONFORMANCE_DIRECTORY)
           if name.startswith("test_") and name.endswith(".py")}
    chosen = []
    for op in OPERATIONS.values():
        module = _kernel_module(op)
        if module == kernel_module or (kernel_module == "operations" and module not in own):
            chosen.append(op)
    return chosen


def _kernel_module(op: Operation) -> str | None:
    if isinstance(op.reference, str):
        module = op.reference.partition(":")[0]
        prefix = "pytest_pallas.reference_kernels."
        if module.startswith(prefix):
            return module[len(prefix):]
    return None


def conformance_tests(op: Operation, implementation: Callable, **settings: Any) -> type:
    """A pytest test class that checks ``implementation`` of ``op`` with the suite's properties.

    Assign it to a ``Test*`` name in a test module::

        TestMyRmsNorm = conformance_tests(RMS_NORM, my_rms_norm)

    The class runs the value property (the sweep, then drawn examples: shape
    and dtype, finite, value), written and deterministic, and vmap (unless the
    op says ``vmap=False``), with the TPU rules and compile check the plugin
    applies to every Pallas test. Failures, reproduce lines, the end-of-run
    table and ``--pallas-report`` rows are the packaged suite's.
    ``@supports(...)`` on ``implementation`` narrows the inputs drawn.

    Settings: ``label`` (the implementation's name in the report; default
    ``module:function``), ``examples`` (examples of the value property, instead
    of the Hypothesis profile's; the other properties run a fifth of it).
    """
    unknown = sorted(set(settings) - {"label", "examples"})
    if unknown:
        raise TypeError(f"conformance_tests() got unknown setting(s) {', '.join(unknown)}; "
                        "it takes label= and examples=.")
    if not isinstance(op, Operation):
        raise TypeError(f"conformance_tests() takes an Operation first, not "
                        f"{type(op).__name__}; see pytest_pallas.Operation.")
    if not callable(implementation):
        raise TypeError(f"conformance_tests({op.name!r}, ...): the implementation is a "
                        f"{type(implementation).__name__}, not a callable.")
    examples = settings.get("examples")
    try:
        binding = bind_function(op, implementation, settings.get("label"))
    except SupportsError as error:
        raise SupportsError(f"conformance_tests({op.name!r}, ...): {error}") from None

    @_with_sweep_decorator(sweep_slots(op))
    @given(data=st.data())
    def test_value(self, data, conformance):
        conformance.check_value(data)

    @given(data=st.data())
    def test_written_and_deterministic(self, data, conformance):
        conformance.check_repeatable(data)

    test_written_and_deterministic.__doc__ = _REPEATABLE_DOC
    namespace: dict[str, Any] = {
        "pytestmark": [pytest.mark.pallas],
        CLASS_ATTRIBUTE: binding,
        "__doc__": f"The conformance properties of {op.name} for {binding.label}.",
        "test_value": _tag(_value_doc(test_value), _primary(examples)),
        "test_written_and_deterministic": _tag(test_written_and_deterministic,
                                               _secondary(examples)),
    }
    if op.vmap:
        @given(data=st.data())
        def test_vmap(self, data, conformance):
            conformance.check_vmap(data)

        test_vmap.__doc__ = _VMAP_DOC
        namespace["test_vmap"] = _tag(test_vmap, _secondary(examples))
    return type(f"Test_{op.name}", (), namespace)


