"""Tracing a program as the TPU compiler would see it for a chip, on any host: the one
``with`` stack that ``check_kernel`` and the estimate (``bench.estimate``) trace under."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from jax.experimental.pallas import tpu as pltpu

from .._compat import (
    compiled_artefacts,
    device_kinds,
    interpreter_fixes,
    jax_internals,
    pallas_call_hooks,
)
from . import compile_check
from .vmem_footprint import tpu_info_for

STAND_IN_AS_ABSTRACT_DEVICE = "the stand-in chip as JAX's abstract device"


@contextlib.contextmanager
def tracing_for_chip(device_kind: str, info: Any, *,
                     replace_stand_in: bool = False) -> Iterator[None]:
    """Within the block, a trace is the chip's: kernels trace for Mosaic, not for an
    interpreter a surrounding test forces; ``pltpu.get_tpu_info()`` (``emit_pipeline``, the
    rank-1 block rules) answers ``info`` for ``device_kind``; meshes count its TensorCores;
    and observers a harness installed (which would check the same kernels with their own
    options) are suspended. ``replace_stand_in``: see
    ``_compat.interpreter_fixes.chip_as_abstract_device``."""
    with (
        pltpu.force_tpu_interpret_mode(None),
        device_kinds.device_kind_answers_as(device_kind, lambda: info),
        jax_internals.optional_feature(
            STAND_IN_AS_ABSTRACT_DEVICE,
            lambda: interpreter_fixes.chip_as_abstract_device(
                device_kind, info.num_cores, replace_stand_in=replace_stand_in)),
        pallas_call_hooks.suspend_pallas_call_observers(),
    ):
        yield


def chip_compiler(chip: str, device_kind: str) -> compiled_artefacts.ChipCompiler:
    """How a test's compiled artefacts are made for ``chip`` (``_compat.compiled_artefacts``):
    traced as the TPU compiler sees the chip, over libtpu's devices of it where libtpu is
    installed."""
    info = tpu_info_for(chip)
    devices = None
    if compile_check.libtpu_version() is not None:
        devices = functools.partial(compile_check.topology_devices, chip)
    return compiled_artefacts.ChipCompiler(
        chip=chip, devices=devices,
        lowering=lambda: tracing_for_chip(device_kind, info, replace_stand_in=True))
