"""XLA's CPU compiler options under which the suite's interpreted kernels compile fastest.

The conformance suite compiles a few hundred interpreted kernels and runs each once or
twice on small inputs: XLA's CPU compiler spends more time optimising them than they
take to run. Three of XLA's debug options trade that optimisation away (no fast math,
no change to the HLO's semantics; at -O0 LLVM emits other instruction sequences, so a
few float results round differently, by ulps, as accurate against the float64 oracle):

* ``xla_cpu_use_fusion_emitters=False``: the older LLVM emitters, not the MLIR
  fusion emitters, whose pipeline costs more per fusion (jaxlib 0.10; gone by 0.12,
  where the fusion emitters are the only ones);
* ``xla_backend_optimization_level=0``: LLVM at -O0;
* ``xla_llvm_disable_expensive_passes=True``.

Measured on the main job (one process, seed 0, cold, jax 0.10.2): XLA's compile time
70.7 s -> 38.0 s, the tests 100 s -> 78 s; docs/main-job.md has the table.

They are XLA's private flags, not JAX's API, and come and go between jaxlib releases: an
option the installed jaxlib does not know is dropped, found out once per process by
compiling a one-line function with it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from . import jax_internals

# LLVM's optimisation level: the one option that makes the compiled code itself slower.
OPTIMIZATION_LEVEL = "xla_backend_optimization_level"

# (option, value): the debug options, most effective first.
CANDIDATES: tuple[tuple[str, Any], ...] = (
    ("xla_cpu_use_fusion_emitters", False),
    (OPTIMIZATION_LEVEL, 0),
    ("xla_llvm_disable_expensive_passes", True),
)

# What XLA says of an option it does not know (jaxlib 0.10.2 to 0.12).
_UNKNOWN_OPTION = "No such compile option"


def fast_compile_options(*, long_run: bool = False) -> dict[str, Any]:
    """The candidates the installed jaxlib accepts, for a ``jax.jit(compiler_options=)``
    on the CPU; empty when JAX's default backend is not the CPU (a TPU VM compiles the
    kernels for the chip, where these options mean nothing).

    ``long_run``: the program runs long enough for LLVM's optimiser to pay (the vmap
    property's batched grids: ``flash_attention``'s at seed 0 ran 5.3 s at -O0, 0.8 s
    optimised), so LLVM keeps its default level."""
    options = _accepted_options()
    if long_run:
        options = {name: value for name, value in options.items()
                   if name != OPTIMIZATION_LEVEL}
    return options


@functools.cache
def _accepted_options() -> dict[str, Any]:
    if jax_internals.default_platform() != "cpu":
        return {}
    everything = dict(CANDIDATES)
    if _accepted(everything):
        return everything
    return {name: value for name, value in CANDIDATES if _accepted({name: value})}


def _accepted(options: dict[str, Any]) -> bool:
    try:
        jax.jit(_probe, compiler_options=options).lower(np.float32(0)).compile()
    except Exception as error:  # noqa: BLE001  # XLA's own error type moves between releases
        if _UNKNOWN_OPTION in str(error):
            return False
        raise
    return True


def _probe(x: Any) -> Any:
    return x + 1


@contextlib.contextmanager
def fast_cpu_compiles() -> Iterator[bool]:
    """Inside the block, every program JAX compiles for the CPU gets the fast options the
    installed jaxlib accepts (``fast_compile_options``), unless it set them itself.

    A test's kernels are interpreted inside the test's own ``jax.jit``, which the plugin does
    not write: the options reach those compiles through JAX's one function that builds
    every compile's options (``jax._src.compiler.get_compile_options``, as a jit's own
    ``compiler_options`` do). Interpreted kernels are mostly compile time: 128 tests of JAX's
    tpu_pallas_test.py took 41.6 s of CPU, 24.0 s with the options (docs/peer-suites.md).
    Programs compiled for a TPU (the compile check) and jits with options of their own are
    left alone. Yields False where the function moved, or no option is accepted.
    """
    options = fast_compile_options()
    try:
        compiler = jax_internals.private_attribute("jax._src.compiler")
        original = compiler.get_compile_options
    except (jax_internals.JaxInternalsChanged, AttributeError):
        yield False
        return
    if not options:
        yield False
        return

    @functools.wraps(original)
    def with_fast_options(*args: Any, **kwargs: Any) -> Any:
        backend = kwargs.get("backend")
        # A jit that chose its own options (the conformance suite's, for one) keeps them.
        if (backend is not None and getattr(backend, "platform", None) == "cpu"
                and not kwargs.get("env_options_overrides")):
            kwargs["env_options_overrides"] = dict(options)
        return original(*args, **kwargs)

    compiler.get_compile_options = with_fast_options
    try:
        yield True
    finally:
        compiler.get_compile_options = original
