"""Benchmarks on top of pytest-benchmark: the fixture's object, the roofline, the
terminal table, the regression gate, the roofline plot and the TPU compiler's
estimate.
"""
