"""Every use of a private JAX, XLA, Hypothesis, pytest, pytest-benchmark or libtpu internal,
one module per job, each guarded and tested at both ends of the supported range.

docs/design.md names each module's job and where a new workaround goes (a private JAX
attribute read: an accessor in ``jax_internals``). This package imports nothing else of
the project.
"""
