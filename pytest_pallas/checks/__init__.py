"""What a TPU would reject or get wrong: the static rules, the run-time rules, the
kernel check, the TPU compiler's check, mismatch diagnosis, and the project's own
model of a ``pallas_call`` (``kernel_model``) with its jaxpr analysis.

A new check goes here, reading ``kernel_model`` rather than JAX's params.
"""
