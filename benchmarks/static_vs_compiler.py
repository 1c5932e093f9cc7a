"""How often the static TPU rules agree with the TPU compiler, per rule and chip.

The static rules (``pytest_pallas.checks.static_rules``: block tiling, VMEM footprint)
are instant and need no libtpu; the TPU compiler (``pytest_pallas.checks.compile_check``,
libtpu's ahead-of-time compilation for a TPU topology) is the authority. This
script traces a corpus of kernels, judges every ``pallas_call`` in it both ways
for each chip, and prints per rule and chip how often they agreed, and every
disagreement.

The corpus: the reference kernels and the seeded bugs (tests/seeded_bugs) on
every input of the suite's sweep (op_inputs.sweep_case), JAX's shipped
flash attention and matmul at several block sizes, and block-shape and VMEM
cases built to sit on either side of the rules (the whole-array call without a
grid among them).

    ALLOW_MULTIPLE_LIBTPU_LOAD=1 python benchmarks/static_vs_compiler.py [--chips v5e,v6e]
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import pathlib
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from pytest_pallas.checks import compile_check  # noqa: E402

compile_check.quiet_libtpu_environment()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

from pytest_pallas._compat import device_kinds  # noqa: E402
from pytest_pallas.checks import jaxpr_analysis, kernel_model  # noqa: E402
from pytest_pallas.checks.static_rules import TILING, check_pallas_call_info  # noqa: E402
from pytest_pallas.checks.vmem_footprint import VMEM, tpu_info_for  # noqa: E402
from pytest_pallas.ops.domains import declared_domain  # noqa: E402
from pytest_pallas.ops.inputs import sweep_case  # noqa: E402
from pytest_pallas.ops.registry import OP_NAMES, get_operation  # noqa: E402
from pytest_pallas.suite.properties import _call_kwargs  # noqa: E402

STATIC_RULES = (TILING, VMEM)


def _abstract(args):
    return tuple(jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in args)


def _sweep_entries(source: str, op: str, function) -> list[tuple[str, object, tuple]]:
    domain = declared_domain(function)
    entries = []
    for index in range(16):
        case = sweep_case(get_operation(op), domain, index)
        if case is None:
            break
        label = f"{source} {op} {case.dims} {case.dtype}"
        target = functools.partial(function, **_call_kwargs(case))
        if op == "ppermute":
            target = _sharded(function, case)
        entries.append((label, target, _abstract(case.args)))
    return entries


def _sharded(function, case):
    from jax.sharding import Mesh, PartitionSpec

    count = case.dims["devices"]
    mesh = Mesh(np.array(jax.devices()[:count]), ("ring",))
    body = functools.partial(function, axis_name="ring", shift=case.kwargs["shift"])
    return jax.shard_map(body, mesh=mesh, in_specs=PartitionSpec("ring"),
                         out_specs=PartitionSpec("ring"), check_vma=False)


def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _blocked_copy(x, block, grid=(1,)):
    spec = pl.BlockSpec(block, lambda i: (0,) * len(block))
    return pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=grid,
                          in_specs=[spec], out_specs=spec)(x)


def _whole_copy(x):
    return pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _built_cases() -> list[tuple[str, object, tuple]]:
    from jax.experimental.pallas.ops.tpu import flash_attention as fa
    from jax.experimental.pallas.ops.tpu.matmul import matmul

    entries = []
    s = jax.ShapeDtypeStruct
    for shape, block, dtype in [
        ((16, 256), (8, 128), jnp.float32), ((16, 256), (4, 128), jnp.float32),
        ((16, 256), (8, 64), jnp.float32), ((16, 256), (16, 256), jnp.float32),
        ((32, 256), (8, 128), jnp.bfloat16), ((32, 256), (16, 128), jnp.bfloat16),
        ((64, 256), (8, 128), jnp.int8), ((64, 256), (32, 128), jnp.int8),
        ((1024,), (256,), jnp.float32), ((1024,), (1024,), jnp.float32),
        ((4096,), (512,), jnp.float32), ((2048,), (128,), jnp.float32),
        ((4, 16, 256), (1, 8, 128), jnp.float32), ((4, 16, 256), (2, 16, 256), jnp.float32),
    ]:
        entries.append((f"block {block} of {shape} {jnp.dtype(dtype).name}",
                        functools.partial(_blocked_copy, block=block), (s(shape, dtype),)))
    for rows in (512, 1024, 1536, 2048):  # whole arrays, no grid: single-buffered
        entries.append((f"whole-array copy ({rows}, 2048) f32, no grid", _whole_copy,
                        (s((rows, 2048), jnp.float32),)))
    for rows in (256, 512, 1024):  # a grid: double-buffered
        entries.append((f"grid copy block ({rows}, 2048) f32", functools.partial(
            _blocked_copy, block=(rows, 2048), grid=(1,)), (s((rows, 2048), jnp.float32),)))
    for size, block in [(1024, (512, 512)), (1024, (256, 256)), (2048, (1024, 1024)),
                        (2048, (2048, 1024))]:
        x = s((size, size), jnp.bfloat16)
        entries.append((f"jax matmul {size} block {block}",
                        functools.partial(matmul, block_shape=block), (x, x)))
    for seq, d in [(128, 128), (512, 128), (1024, 64)]:
        q = s((1, 2, seq, d), jnp.float32)
        entries.append((f"jax flash_attention s={seq} d={d}", fa.flash_attention, (q, q, q)))
    return entries


def corpus() -> list[tuple[str, object, tuple]]:
    from seeded_bugs import kernels as seeded
    from test_suite_power import BUGS

    entries = _built_cases()
    for op in OP_NAMES:
        entries += _sweep_entries("reference", op, get_operation(op).load_reference())
    for op, name, _ in BUGS:
        entries += _sweep_entries(f"seeded {name}", op, getattr(seeded, name))
    return entries


def judge(entries, chips):
    """Per chip, a list of (label, kernel, static rules fired, compiler verdict)."""
    rows = collections.defaultdict(list)
    host_kind = jax.devices()[0].device_kind
    for chip in chips:
        info = tpu_info_for(chip)
        for label, function, args in entries:
            try:
                with (pltpu.force_tpu_interpret_mode(None),
                      device_kinds.device_kind_answers_as(host_kind, lambda: info)):
                    closed = jax.make_jaxpr(function)(*args)
            except Exception as error:  # noqa: BLE001  # a kernel that does not trace
                print(f"  skipped {label}: {type(error).__name__}: {str(error)[:100]}")
                continue
            for params, avals, mesh in jaxpr_analysis.pallas_call_equations_in(closed):
                call = kernel_model.describe_pallas_call(params)
                report = check_pallas_call_info(call, info, checks=STATIC_RULES)
                fired = sorted({v.rule for v in report.violations})
                verdict = compile_check.verdict_for(params, avals, chip, mesh)
                rows[chip].append((label, call.title, fired, verdict))
    return rows


def summarize(rows) -> None:
    print("\n| chip | pallas_calls | agree | static only (false alarm) | compiler only (missed) |")
    print("|---|---|---|---|---|")
    for chip, judged in rows.items():
        agree = sum(bool(f) == (not v.compiled) for _, _, f, v in judged)
        false_alarm = [r for r in judged if r[2] and r[3].compiled]
        missed = [r for r in judged if not r[2] and not r[3].compiled]
        print(f"| {chip} | {len(judged)} | {agree} | {len(false_alarm)} | {len(missed)} |")
    print("\nPer static rule: when it fired, did the compiler reject the call too?")
    print("| rule | chip | fired | compiler rejected | compiler accepted |")
    print("|---|---|---|---|---|")
    for rule in STATIC_RULES:
        for chip, judged in rows.items():
            fired = [r for r in judged if rule in r[2]]
            rejected = sum(not r[3].compiled for r in fired)
            print(f"| {rule} | {chip} | {len(fired)} | {rejected} | {len(fired) - rejected} |")
    print("\nCompiler rejections by class (static rules silent on them):")
    for chip, judged in rows.items():
        classes = collections.Counter(r[3].rule for r in judged if not r[2] and not r[3].compiled)
        print(f"  {chip}: {dict(classes) or 'none'}")
    print("\nDisagreements:")
    seen = set()
    for chip, judged in rows.items():
        for label, kernel, fired, verdict in judged:
            if bool(fired) == (not verdict.compiled):
                continue
            key = (label, kernel, tuple(fired), verdict.rule, chip)
            if key in seen:
                continue
            seen.add(key)
            said = f"static {fired}" if fired else "static: ok"
            compiler = ("compiles" if verdict.compiled
                        else f"{verdict.rule}: {verdict.message[:160]}")
            print(f"  [{chip}] {label} / {kernel}: {said}; compiler {compiler}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chips", default="v5e,v6e,v5p,v4,7x")
    parsed = parser.parse_args()
    chips = [c for c in parsed.chips.split(",") if c]
    start = time.perf_counter()
    entries = corpus()
    rows = judge(entries, chips)
    summarize(rows)
    stats = compile_check.STATS
    print(f"\n{len(entries)} functions; {stats.compiles} compiles in {stats.seconds:.1f} s, "
          f"{stats.cached} from the cache; {time.perf_counter() - start:.1f} s in all")


if __name__ == "__main__":
    main()
