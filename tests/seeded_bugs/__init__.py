"""Implementations for proving the conformance suite's power (tests/test_suite_power.py).

* ``seeded_bugs.kernels``: Pallas kernels with one deliberate, realistic bug
  each; the suite must fail every one of them, on the property named in
  ``tests/test_suite_power.py``.
* ``seeded_bugs.correct``: correct alternatives (plain ``jnp``, the
  reference kernels with other block sizes, the kernels JAX ships in
  ``jax.experimental.pallas.ops.tpu``); the suite must pass every one.

Each is a contract-signature callable (docs/contract.md section 2), given to the
suite as ``--pallas-impl OP=seeded_bugs.kernels:NAME``.
"""
