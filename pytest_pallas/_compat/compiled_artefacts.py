"""Which compiled artefacts a test reads: ``jax.stages``' ``Lowered`` and ``Compiled`` texts,
cost and memory analyses. On the CPU a Pallas kernel is compiled as JAX's interpreter, not as
the chip's Mosaic custom call, so a test asserting what the chip's compiled program holds
(JAX's ``test_cost_analysis``, ``test_metadata_is_preserved``) fails for that reason: its
failure then says so (``supervision.diagnoses.compiled_artefact_note``).

``jax.stages`` is public; its methods are wrapped while a test runs, and only record.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

# (class of jax.stages, method): what reads the compiled program.
READERS = (("Lowered", "as_text"), ("Lowered", "compiler_ir"), ("Lowered", "cost_analysis"),
           ("Compiled", "as_text"), ("Compiled", "cost_analysis"),
           ("Compiled", "memory_analysis"))


@contextlib.contextmanager
def compiled_artefacts_read(read: list[str]) -> Iterator[list[str]]:
    """Inside the block, each call of a :data:`READERS` method appends its name
    (``"Compiled.cost_analysis"``) to ``read``; yields ``read``."""
    import jax.stages

    wrapped = []
    for class_name, method in READERS:
        owner = getattr(jax.stages, class_name, None)
        original = getattr(owner, method, None)
        if original is None:
            continue

        @functools.wraps(original)
        def reading(self, *args, _original=original, _name=f"{class_name}.{method}", **kwargs):
            read.append(_name)
            return _original(self, *args, **kwargs)

        setattr(owner, method, reading)
        wrapped.append((owner, method, original))
    try:
        yield read
    finally:
        for owner, method, original in wrapped:
            setattr(owner, method, original)
