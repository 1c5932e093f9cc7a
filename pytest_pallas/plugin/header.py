"""The plugin's line in pytest's header: where the kernels run, standing in for which chip or
chips, the seed and profile, what the stand-in chip answers, the compile check and the
numbers. Each part is a function of the run's options and state; the session holds none of
the text."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from ..numerics import header_text
from ..settings import PallasOptions
from .session import session_of
from .versions import untested_jax_note

if TYPE_CHECKING:
    from .session import PallasSession


def header_line(session: PallasSession) -> str:
    """The header's ``pallas:`` line."""
    options = session.options
    interpreted = not options.compiled
    if interpreted:
        session.ensure_devices()
    return "".join((
        f"pallas: {_where(session)}",
        f"; {text}" if (text := plain_path_text(options)) else "",
        _devices(session) if interpreted else "",
        f"; {_seed(options)}",
        _declared(session) if interpreted and (options.session_opted_in or session.scope_all)
        else "",
        f"; {text}" if (text := compile_check_text(options)) else "",
        "; " + header_text("tpu" if options.compiled else "cpu", options.chips,
                           options.numerics, conformance=options.conformance),
    ))


def _where(session: PallasSession) -> str:
    options = session.options
    if options.tpu:
        return "TPU (compiled)"
    if options.gpu:
        return "GPU (compiled: Mosaic GPU, Triton where a kernel asks for it)"
    from ..backend import chip_info

    chip_texts = []
    for chip in options.chips:
        backend = session.backend_if_made
        info = backend.tpu_info if backend is not None and backend.chip == chip \
            else chip_info(chip)
        cores = int(info.num_cores)
        chip_texts.append(f"TPU {chip} ({cores} TensorCore{'s' if cores > 1 else ''})")
    chips = (chip_texts[0] if not options.several_chips else
             f"{', '.join(chip_texts)}, each test once per chip (its id suffixed [chip])")
    suite = (" (the conformance suite runs its value, deterministic and vmap examples in the "
             "plain one, for speed)" if options.conformance and not options.interpreter_chosen
             else "")
    return f"CPU, {options.interpreter} interpreter{suite}, standing in for {chips}"


def plain_path_text(options: PallasOptions) -> str | None:
    """Which kernels a TPU-interpreted run hands to JAX's plain interpreter, and how not to."""
    if options.compiled or options.interpreter != "tpu":
        return None
    if options.tpu_interpreter_always:
        return "every kernel in the TPU interpreter (--pallas-interpret=tpu-always)"
    if options.detect_races:
        return "every kernel in the TPU interpreter (race detection)"
    return ("a kernel the TPU interpreter would run no differently runs in JAX's plain "
            "interpreter, one XLA loop (no DMA, semaphore, mesh or other TPU-only primitive, "
            "no input written, every access proved in bounds); "
            "--pallas-interpret=tpu-always for none")


def _devices(session: PallasSession) -> str:
    # A suite written for one device skips itself under more ("requires 1 device, found 8")
    # and the run looks green: say how many there are and why.
    return (f"; {session.devices_note} simulated, for multi-device kernels "
            "(--pallas-devices=N to change; tests that need an exact count skip under another)")


def _seed(options: PallasOptions) -> str:
    seed = f"seed {options.seed}"
    if not options.seed_given and options.profile == "ci":
        seed += ", the ci profile's fixed seed"
    return (f"{seed} (reproduce with --pallas-seed={options.seed}); hypothesis profile "
            f"pallas-{options.profile}")


def _declared(session: PallasSession) -> str:
    """What the stand-in chip answers as the device under test, per chip."""
    from .._compat.device_under_test import device_kind_of_chip
    from ..backend import chip_info, chip_slice

    options = session.options
    chips = options.chips
    devices = []
    for chip in chips:
        where = chip_slice(chip, chip_info(chip), session.devices_requested_count).describe()
        devices.append(f"device kind {device_kind_of_chip(chip)!r}, a {where} slice")
    named = f"TPU {chips[0]}" if len(chips) == 1 else "each test's chip"
    return (f"; device under test: {named} for JAX's test utilities, jax.default_backend() "
            f"and device objects ({'; '.join(devices)}; JAX's own machinery sees the CPU "
            "devices; INTERPRET = True test classes see the CPU, interpreting for that "
            "generation)")


def compile_check_text(options: PallasOptions) -> str | None:
    """The chips the TPU compiler check compiles for, or why it is off and how to turn it on."""
    if options.tpu or options.gpu:
        return None
    if options.compile_chips:
        each = (", each test's kernels for its own chip" if options.several_chips
                and not options.compile_given else "")
        return (f"TPU compiler check for {', '.join(options.compile_chips)}{each} "
                f"(libtpu {options.libtpu}); --pallas-compile=none turns it off")
    if options.libtpu is None:
        return ("TPU compiler check off: libtpu is not installed; "
                "pip install 'pytest-pallas[tpu]' to compile every kernel for the chip")
    if options.compile_given:
        return (f"TPU compiler check off (--pallas-compile=none); "
                f"--pallas-compile={options.chip} turns it on")
    return (f"TPU compiler check off: it does not compile for {options.chip}; "
            "--pallas-compile=CHIP turns it on for another chip")


def report_header(config: pytest.Config) -> list[str] | None:
    """pytest's header lines of the plugin, for a run whose header shows them (a Pallas
    flag, ``pallas_scope = all`` or ``--pallas-compile``): the ``pallas:`` line, where JAX
    runs, the workers the plugin chose, a JAX outside the tested range."""
    from .workers import device_split_note, header_note

    session = session_of(config)
    if not session.header_shown:
        return None
    lines = [header_line(session), *session.platform_lines()]
    workers = header_note(config) or device_split_note(config)
    untested = untested_jax_note()
    return lines + [line for line in (workers, untested) if line]


def collection_finish_lines(config: pytest.Config) -> list[str] | None:
    """Where JAX runs, for a run whose header said nothing (no Pallas flag, Pallas tests)."""
    session = session_of(config)
    if session.header_shown:
        return None  # the header said it
    return session.platform_lines() or None
