"""Conformance of every other op: a built-in op whose kernel module has no packaged module of
its own, and an op registered from a conftest (the ``pytest_pallas_operations`` hook)."""

from pytest_pallas.suite.generated import packaged_tests

globals().update(packaged_tests(__name__))
