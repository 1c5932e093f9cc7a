"""The accelerators of this host, read without starting JAX, and where JAX may run.

Interpreted means the CPU on every host: a run that interprets its kernels keeps JAX on
the CPU (``JAX_PLATFORMS=cpu``, set before JAX starts), or JAX on a GPU workstation runs
the "interpreted" kernels on the GPU (float32 dots in TF32, every pytest-xdist worker
preallocating the GPU's memory) and on a TPU VM the first process takes the chip. A run on
the accelerator (``--pallas-tpu``, ``--pallas-gpu``) with pytest-xdist gives each worker
one device, the way JAX's own CI does.

Everything here reads files and environment variables only: it imports neither JAX (the
decision must be made before JAX starts) nor pytest (the wings may use it).
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Mapping, MutableMapping

from .settings import device_count_from_xla_flags

# Set beside JAX_PLATFORMS when the plugin set it, so that a pytest-xdist worker (which
# inherits its controller's environment) and an inner pytest run can tell the plugin's
# choice from the user's.
SET_BY_PLUGIN = "PYTEST_PALLAS_SET_JAX_PLATFORMS"

_NVIDIA_NODE = re.compile(r"nvidia(\d+)$")
_TPU_ACCEL_NODE = re.compile(r"accel(\d+)$")  # v2 to v5e
_VFIO_GROUP = re.compile(r"(\d+)$")  # v5p, v6e and newer: /dev/vfio/<group>


@dataclasses.dataclass(frozen=True)
class HostAccelerators:
    """What JAX would see on this host if nothing restricted it.

    Attributes:
      platform: ``"gpu"``, ``"tpu"`` or None (a CPU-only host, or no JAX plugin for the
        accelerator that is there: JAX would run on the CPU anyway).
      devices: the device indices a process may use (``CUDA_VISIBLE_DEVICES`` and
        ``TPU_VISIBLE_CHIPS`` already applied).
      description: for the header, e.g. ``"2 NVIDIA GPUs"``.
      variable: the environment variable that chooses among them (``CUDA_VISIBLE_DEVICES``,
        ``HIP_VISIBLE_DEVICES``, ``TPU_VISIBLE_CHIPS``).
    """

    platform: str | None
    devices: tuple[str, ...] = ()
    description: str = "no accelerator"
    variable: str | None = None

    @property
    def count(self) -> int:
        return len(self.devices)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _module_installed(name: str) -> bool:
    """Whether a top-level module can be imported, found without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _jax_gpu_plugins() -> list[str]:
    """The names of JAX's installed GPU PJRT plugins (``xla_cuda12``, ...), found on disk.

    ``jax_plugins`` is a namespace package: looking at its folders imports nothing.
    """
    try:
        spec = importlib.util.find_spec("jax_plugins")
    except (ImportError, ValueError):
        return []
    locations = list(spec.submodule_search_locations or ()) if spec else []
    return sorted({name for location in locations for name in _listdir(location)
                   if name.startswith(("xla_cuda", "xla_rocm"))})


def _visible(indices: list[str], variable: str, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The devices a process may use after ``variable`` (a comma list of indices), if set."""
    chosen = environ.get(variable)
    if chosen is None:
        return tuple(indices)
    wanted = [word.strip() for word in chosen.split(",") if word.strip()]
    if any(word.startswith("-") for word in wanted):
        return ()  # CUDA_VISIBLE_DEVICES=-1 hides every GPU
    return tuple(word for word in wanted if word in indices or not word.isdigit())


def host_accelerators(
    environ: Mapping[str, str] = os.environ,
    *,
    listdir: Callable[[str], list[str]] = _listdir,
    module_installed: Callable[[str], bool] = _module_installed,
    gpu_plugins: Callable[[], list[str]] = _jax_gpu_plugins,
) -> HostAccelerators:
    """The accelerator JAX would start on, from device nodes and installed JAX plugins.

    The keyword arguments replace the host's facts in tests.
    """
    plugins = gpu_plugins()
    if any(name.startswith("xla_cuda") for name in plugins):
        nodes = sorted((m.group(1) for m in map(_NVIDIA_NODE.match, listdir("/dev")) if m),
                       key=int)
        devices = _visible(nodes, "CUDA_VISIBLE_DEVICES", environ)
        if devices:
            return HostAccelerators("gpu", devices, _counted(len(devices), "NVIDIA GPU"),
                                    "CUDA_VISIBLE_DEVICES")
    if any(name.startswith("xla_rocm") for name in plugins) and "kfd" in listdir("/dev"):
        nodes = sorted((name[len("renderD"):] for name in listdir("/dev/dri")
                        if name.startswith("renderD")), key=int)
        indices = [str(i) for i in range(len(nodes))]
        devices = _visible(indices, "HIP_VISIBLE_DEVICES", environ)
        if devices:
            return HostAccelerators("gpu", devices, _counted(len(devices), "AMD GPU"),
                                    "HIP_VISIBLE_DEVICES")
    if module_installed("libtpu"):
        nodes = [m.group(1) for m in map(_TPU_ACCEL_NODE.match, listdir("/dev")) if m]
        if not nodes:
            nodes = [m.group(1) for m in map(_VFIO_GROUP.match, listdir("/dev/vfio")) if m]
        indices = [str(i) for i in range(len(nodes))]
        devices = _visible(indices, "TPU_VISIBLE_CHIPS", environ)
        if devices:
            return HostAccelerators("tpu", devices, _counted(len(devices), "TPU chip"),
                                    "TPU_VISIBLE_CHIPS")
    return HostAccelerators(None)


def host_has_tpu() -> bool:
    """Whether a TPU chip sits on this host's PCI bus (Google's vendor id, 0x1ae0).

    Not ``host_accelerators``' answer: that one is what JAX would start on (libtpu
    installed, the chips ``TPU_VISIBLE_CHIPS`` leaves visible); this one whether libtpu's
    runtime, once loaded, finds a chip and so needs its own view of the host.
    """
    for path in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(path) as handle:
                if handle.read().strip() == _GOOGLE_PCI_VENDOR:
                    return True
        except OSError:
            continue
    return False


_GOOGLE_PCI_VENDOR = "0x1ae0"


def _counted(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


# --- keeping JAX on the CPU ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PlatformDecision:
    """Where this run's JAX runs, and the header's words for it.

    Attributes:
      by_user: the user set it (the plugin then leaves it alone).
      note: one line for the header, or None when there is nothing to say (a CPU-only host).
      previous: the environment's values before the plugin set its own, to put back.
    """

    by_user: bool
    note: str | None
    previous: tuple[tuple[str, str | None], ...] = ()


def user_jax_platforms(environ: Mapping[str, str] = os.environ) -> str | None:
    """JAX_PLATFORMS as the user set it (None if unset, or set by the plugin)."""
    if environ.get(SET_BY_PLUGIN):
        return None
    value = environ.get("JAX_PLATFORMS")
    return value if value else None


def keep_jax_on_cpu(environ: MutableMapping[str, str],
                    host: HostAccelerators) -> PlatformDecision:
    """Set ``JAX_PLATFORMS=cpu`` for a run that interprets its kernels, unless the user set
    JAX_PLATFORMS (the user's choice wins). Read by JAX when it creates its backends, and
    inherited by pytest-xdist's workers and every subprocess of the run.

    The caller must still tell an already-imported JAX (``jax.config``): see
    ``_compat.jax_internals.restrict_imported_jax_to_cpu``.
    """
    flag = {"gpu": "--pallas-gpu", "tpu": "--pallas-tpu"}.get(host.platform or "")
    user = user_jax_platforms(environ)
    if user is not None:
        note = f"JAX_PLATFORMS={user} (set by you) decides where JAX runs"
        if host.platform is not None and "cpu" != user.split(",")[0].strip():
            note += (f"; interpreted kernels run on the {host.platform.upper()} and its "
                     f"precision ({flag} compiles them for it instead)")
        return PlatformDecision(True, note)
    previous = tuple((name, environ.get(name)) for name in ("JAX_PLATFORMS", SET_BY_PLUGIN))
    environ["JAX_PLATFORMS"] = "cpu"
    environ[SET_BY_PLUGIN] = "1"
    note = None
    if host.platform is not None:
        note = (f"JAX kept on the CPU (JAX_PLATFORMS=cpu): it would have seen "
                f"{host.description}; {flag} runs the kernels on it")
    return PlatformDecision(False, note, previous)


def undo_keep_jax_on_cpu(environ: MutableMapping[str, str], decision: PlatformDecision) -> None:
    """Put back what :func:`keep_jax_on_cpu` changed (at the end of the pytest run; an inner
    run inside a test leaves its outer run's setting as it found it)."""
    for name, value in decision.previous:
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value


# --- one device per pytest-xdist worker ---------------------------------------------------


def worker_index(environ: Mapping[str, str] = os.environ) -> int | None:
    """This pytest-xdist worker's number (``gw3`` -> 3), or None outside a worker."""
    name = environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else None


def worker_device_environment(host: HostAccelerators, index: int) -> dict[str, str]:
    """The environment that gives pytest-xdist worker ``index`` its own device.

    GPU: ``CUDA_VISIBLE_DEVICES`` (``HIP_VISIBLE_DEVICES`` on AMD) names one device. TPU:
    what JAX's TPU CI sets per worker, ``TPU_VISIBLE_CHIPS`` and
    ``ALLOW_MULTIPLE_LIBTPU_LOAD`` (several processes load libtpu, each with its chip).
    """
    if host.variable is None or not host.devices:
        return {}
    chosen = {host.variable: host.devices[index % host.count]}
    if host.platform == "tpu":
        chosen["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "true"
    return chosen


def workers_for_devices(requested: int, host: HostAccelerators) -> tuple[int, str | None]:
    """How many workers an accelerator run may have (one device each), and a line saying
    why when it is fewer than ``requested``."""
    if host.count == 0 or requested <= host.count:
        return requested, None
    return host.count, (f"{host.count} pytest-xdist workers, not {requested}: one "
                        f"{host.platform.upper()} each ({host.description})")


# --- the TPU compiler, without loading it ---------------------------------------------------


def installed_libtpu() -> str | None:
    """The installed libtpu's version (the ``tpu`` extra), or None when it is not installed.

    Found on disk, not imported: importing the ``libtpu`` package sets ``TPU_LIBRARY_PATH``
    and stays in ``sys.modules``, where JAX's own import of it later finds it, so a run that
    asks nothing of the plugin would start JAX in another environment than without it.
    """
    try:
        spec = importlib.util.find_spec("libtpu")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    # Its metadata lies beside it; a libtpu without any cannot be imported (its __init__
    # reads its own version from there).
    for location in spec.submodule_search_locations or ():
        site = os.path.dirname(os.path.abspath(location))
        for name in _listdir(site):
            if name.startswith("libtpu-") and name.endswith((".dist-info", ".egg-info")):
                return name[len("libtpu-"):].rsplit(".", 1)[0]
    return None


# --- this host's memory -----------------------------------------------------------------------


def free_memory_bytes() -> int | None:
    """The memory no process and no cache holds now (free pages), or None where it cannot be
    read. Less than :func:`available_memory_bytes`, which counts the page cache the kernel
    would give back: the count of pytest-xdist workers is bounded by this one."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def available_memory_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """The memory this host can still give a process without swapping (Linux's
    ``MemAvailable``), or None where it cannot be read (another system)."""
    try:
        with open(meminfo) as lines:
            for line in lines:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def request_cpu_devices(count: int, environ) -> tuple[int, str]:
    """Ask JAX for ``count`` simulated CPU devices, if it is still possible.

    Returns how many JAX will have, and a sentence describing what happened, for the
    report header.
    """
    already = device_count_from_xla_flags(environ)
    if already is not None:
        return already, f"{already} CPU devices (from XLA_FLAGS)"
    jax = sys.modules.get("jax")
    if jax is None:
        # Read by JAX when it is imported; avoids importing JAX at configure time.
        environ["JAX_NUM_CPU_DEVICES"] = str(count)
        return count, f"{count} CPU devices"
    from ._compat import jax_internals  # lazy: JAX is imported by now; hosts loads at start-up

    if jax_internals.backends_are_initialized():
        initialised = jax.device_count("cpu")
        return initialised, (f"{initialised} CPU devices (JAX was initialised before "
                             "pytest-pallas)")
    jax.config.update("jax_num_cpu_devices", count)
    return count, f"{count} CPU devices"
