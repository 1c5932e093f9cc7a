"""What JAX's Mosaic lowering says of a SparseCore kernel, on a machine without a TPU.

On the chip, ``jax.jit`` lowers a SparseCore kernel to Mosaic before anything runs, and a
kernel Mosaic's lowering refuses stops there: "Only the source ref can be indexed when doing a
gather", "... cannot have any transforms following the indexer", "Get only supports loading
scalars from SMEM". The plugin's compile check sees ``pallas_call`` kernels only, and a
``pl.kernel`` over a SparseCore mesh lowers through ``mpmd_map``: interpreted, such a kernel
ran (and computed something, or waited forever for a copy its wait could not count).

:func:`mosaic_refusal` lowers the kernel as ``mpmd_map``'s TPU rule does
(``pallas_call_registration.mpmd_map_tpu_lowering_rule``, jax 0.10.2 to 0.12: the kernel's
jaxpr into a Mosaic module of its own, for the chip the run stands in for) and returns what
the lowering raised, the exception JAX raises on the chip. Only Mosaic's own refusals count:
an error raised outside JAX's Pallas TPU lowering (this host, a moved internal) is not the
kernel's, and the kernel then runs as before.
"""

from __future__ import annotations

import traceback
from typing import Any

from jax.experimental.pallas import tpu as pltpu

from .jax_internals import JaxInternalsChanged, private_attribute

REGISTRATION = "jax._src.pallas.mosaic.pallas_call_registration"
LOWERING = "jax._src.pallas.mosaic.lowering"

# Where Mosaic's lowering of a Pallas TPU kernel lives: a refusal raised there is the
# lowering's, not this host's.
_MOSAIC_LOWERING_FILES = ("jax/_src/pallas/mosaic/lowering.py",
                          "jax/_src/pallas/mosaic/sc_lowering.py",
                          "jax/_src/pallas/mosaic/sc_primitives.py",
                          "jax/_src/pallas/mosaic/primitives.py",
                          "jax/_src/pallas/mosaic/core.py")
_REFUSALS = (NotImplementedError, ValueError, TypeError)


def _raised_by_mosaic(error: BaseException) -> bool:
    lowering = private_attribute(LOWERING)
    if isinstance(error, lowering.LoweringException):
        return True
    if not isinstance(error, _REFUSALS):
        return False
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return False
    last = frames[-1].filename.replace("\\", "/")
    return any(last.endswith(path) for path in _MOSAIC_LOWERING_FILES)


def mosaic_refusal(ctx: Any, params: dict[str, Any]) -> BaseException | None:
    """What Mosaic's lowering raised for the SparseCore kernel of a ``pallas_call`` lowering
    (``params``: the kernel's jaxpr, mesh, grid mapping and compiler params), or None when it
    lowered (or could not be tried here)."""
    try:
        registration = private_attribute(REGISTRATION)
        lowering = private_attribute(LOWERING)
        mlir = private_attribute("jax._src.interpreters.mlir")
        ir = private_attribute("jax._src.lib.mlir", "ir")
        tpu = private_attribute(REGISTRATION, "tpu")  # Mosaic's dialect, as it imports it
        core = private_attribute("jax._src.core")
        pallas_core = private_attribute("jax._src.pallas.core")
        sharding_impls = private_attribute("jax._src.sharding_impls")
    except (JaxInternalsChanged, AttributeError, ImportError):
        return None
    jaxpr, mesh = params["jaxpr"], params["mesh"]
    compiler_params = params.get("compiler_params") or pltpu.CompilerParams()
    num_scratch = params["grid_mapping"].num_scratch_operands
    axis_context = ctx.module_context.axis_context
    jax_mesh = (axis_context.mesh if isinstance(axis_context, sharding_impls.SPMDAxisContext)
                else None)
    context = ctx.module_context.context
    try:
        tpu.register_dialect(context)
        with context, ir.Location.unknown(context):
            module = ir.Module.create()
            if any(isinstance(var.aval, core.ShapedArray) and not var.aval.shape
                   for var in jaxpr.invars):  # closed-over scalars, as the TPU rule does
                jaxpr = registration._rewrite_jaxpr_for_lowering(jaxpr, mesh, (mesh,))
            lowering.lower_jaxpr_into_unpipelined_module(
                ctx, module, jaxpr, jax_mesh=jax_mesh, pallas_mesh=mesh,
                name=mlir.sanitize_name(jaxpr.debug_info.func_name),
                dynamic_shape_replacement_enabled=(
                    pallas_core.dynamic_shapes_export_enabled()),
                num_scratch=num_scratch,
                needs_layout_passes=compiler_params.needs_layout_passes)
    except Exception as error:  # noqa: BLE001 -- only Mosaic's own refusals are returned
        return error if _raised_by_mosaic(error) else None
    return None
