"""The conformance suite: the generated tests, the harness that draws and calls, the
properties, the grid coverage and the report.

The test modules themselves install as ``pytest_pallas.conformance`` (the
repository's top-level ``conformance/``).
"""
