"""The child process of ``pytest_pallas.estimate``: compile kernels for a chip, dump, parse.

libtpu reads its dump flags once, when it starts, from ``LIBTPU_INIT_ARGS``; a
process whose libtpu already started (a compile check, an earlier estimate)
cannot be asked for dumps. So the kernels are exported (StableHLO, in
``jax.export``'s form) by the caller and compiled here, in a fresh process whose
libtpu dumps into a temporary directory, one kernel at a time; each kernel's
dump is parsed and deleted before the next compiles. Reads a pickled request on
stdin, writes a pickled list of ``(libtpu version, [Schedule | error text])``.
"""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import tempfile


def main() -> None:
    request = pickle.load(sys.stdin.buffer)
    dump = tempfile.mkdtemp(prefix="pallas-schedule-")
    try:
        os.environ["LIBTPU_INIT_ARGS"] = " ".join(filter(None, [
            os.environ.get("LIBTPU_INIT_ARGS", ""),
            f"--xla_jf_dump_to={dump} --xla_mosaic_dump_to={dump}"]))
        # lazy: the compile check imports JAX, after LIBTPU_INIT_ARGS is set (entry point)
        from ..checks import compile_check

        compile_check.quiet_libtpu_environment()
        results = [_compile_and_read(exported, request["chip"], request["delay_slots"], dump)
                   for exported in request["kernels"]]
        pickle.dump((compile_check.libtpu_version(), results), sys.stdout.buffer)
    finally:
        shutil.rmtree(dump, ignore_errors=True)


def _compile_and_read(exported: object, chip: str, delay_slots: int, dump: str) -> object:
    # lazy: this process imports JAX only after main() sets LIBTPU_INIT_ARGS
    import jax
    from jax.sharding import SingleDeviceSharding  # lazy: as jax above

    from .._compat import libtpu_dump  # lazy: as jax above
    from ..checks import compile_check  # lazy: as jax above

    for name in os.listdir(dump):
        os.remove(os.path.join(dump, name))
    device = compile_check.topology_devices(chip)[0]
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=SingleDeviceSharding(device))
              for a in exported.in_avals]  # type: ignore[attr-defined]
    try:
        jax.jit(exported.call).lower(*shapes).compile()  # type: ignore[attr-defined]
    except Exception as error:  # noqa: BLE001  # the compiler's rejection, reported
        return f"the TPU compiler rejects it for {chip}: {str(error).splitlines()[0][:300]}"
    schedules = libtpu_dump.read_kernel_schedules(dump, delay_slots)
    kept = os.environ.get("PYTEST_PALLAS_KEEP_DUMP")
    if kept:  # a copy of the dump, for reading what the schedule reader read
        count = len(os.listdir(kept)) if os.path.isdir(kept) else 0
        shutil.copytree(dump, os.path.join(kept, f"kernel-{count}"), dirs_exist_ok=True)
    if len(schedules) > 1:  # XLA's own code around it (a copy for an aliased operand, ...)
        schedules = {name: s for name, s in schedules.items() if s.custom_call}
    if len(schedules) != 1:
        schedule = libtpu_dump.Schedule()
        schedule.notes.append(f"libtpu dumped {len(schedules)} Pallas kernels where 1 was compiled")
        return schedule
    schedule = next(iter(schedules.values()))
    schedule.addresses = {}  # only the parser needs it
    return schedule


if __name__ == "__main__":
    main()
