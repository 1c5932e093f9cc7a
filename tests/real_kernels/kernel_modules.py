"""Load a kernel module of an installed package without running the package's ``__init__``.

tpu-inference's ``__init__`` sets up vLLM, MaxText's a training stack, tokamax's
its autotuner and quantization library: none of it is needed by a Pallas kernel,
and most of it is not installed (``pip install --no-deps``). The package is
registered as an empty namespace whose ``__path__`` is the installed folder, so
``import package.kernels.x`` runs the kernel modules and nothing above them.
Modules a kernel imports only for logging or a device-name lookup are given
small stand-ins (``stand_ins``) before the kernel is imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Mapping


def _register_namespace(name: str) -> None:
    if name in sys.modules:
        return
    parent, _, child = name.rpartition(".")
    if parent:
        _register_namespace(parent)
        locations = [p + "/" + child for p in sys.modules[parent].__path__]
    else:
        spec = importlib.util.find_spec(name)   # finds the folder, runs nothing
        if spec is None or spec.submodule_search_locations is None:
            raise ModuleNotFoundError(f"{name} is not installed")
        locations = list(spec.submodule_search_locations)
    module = types.ModuleType(name)
    module.__path__ = locations
    sys.modules[name] = module
    if parent:
        setattr(sys.modules[parent], child, module)


def load_kernel_module(module: str, *, skip_init: tuple[str, ...],
                       stand_ins: Mapping[str, Mapping[str, object]] = {}) -> types.ModuleType:
    """Import ``module`` with the ``__init__`` of each package in ``skip_init`` left unrun.

    ``stand_ins`` maps a module name to the attributes of a stand-in module
    registered under that name (only where no module of that name is loaded).
    """
    for package in skip_init:
        _register_namespace(package)
    for name, attributes in stand_ins.items():
        if name not in sys.modules:
            stand_in = types.ModuleType(name)
            stand_in.__dict__.update(attributes)
            sys.modules[name] = stand_in
    return importlib.import_module(module)
