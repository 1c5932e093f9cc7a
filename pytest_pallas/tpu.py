"""Public helpers for writing Pallas TPU kernels that run on every JAX of the supported range.

    >>> from pytest_pallas.tpu import tensorcore_mesh

``tensorcore_mesh(axis_name, num_cores)`` is the ``pl.kernel`` mesh of a chip's
TensorCores, spelled as the running JAX spells it.
"""

from ._compat.jax_internals import tensorcore_mesh

__all__ = ["tensorcore_mesh"]
