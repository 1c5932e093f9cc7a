"""Every use of a private JAX, XLA, Hypothesis, pytest, pytest-benchmark or libtpu internal, one
module per library, each guarded and tested at both ends of the supported range (XLA's
debug options: ``xla_cpu_options``).

A new JAX workaround goes here: an accessor in ``jax_internals``, a patch in
``pallas_call_hooks``, ``tpu_interpreter`` or ``device_kinds``.
"""
