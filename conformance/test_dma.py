"""Conformance of `copy` (bit-exact) (docs/contract.md §2)."""

from pytest_pallas.suite.generated import packaged_tests

# The tests of the built-in ops whose reference kernels live in the kernel module of the
# same name (pytest_pallas/ops/builtins.py): test_value, test_written_and_deterministic, test_vmap.
globals().update(packaged_tests(__name__))
