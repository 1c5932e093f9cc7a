"""pytest-pallas: test, validate and benchmark JAX Pallas TPU kernels inside pytest.

The public names are loaded on first use, so that the plugin, which pytest
imports in every run of an environment that has it installed, costs no JAX
import for tests that do not use it.

    from pytest_pallas import assert_allclose, supports, check_kernel
    from pytest_pallas import Operation, conformance_tests, operations
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "assert_allclose": "pytest_pallas.compare",
    "default_tolerance": "pytest_pallas.compare",
    "error_models": "pytest_pallas.ops.error_models",
    "Tolerance": "pytest_pallas.compare",
    "supports": "pytest_pallas.ops.domains",
    "check_kernel": "pytest_pallas.checks.kernel_check",
    "check_uninitialized_reads": "pytest_pallas.checks.kernel_check",
    "TpuRuleViolation": "pytest_pallas.checks.violations",
    "Backend": "pytest_pallas.backend",
    "strategies": "pytest_pallas.strategies",
    "Operation": "pytest_pallas.ops.operation",
    "conformance_tests": "pytest_pallas.suite.generated",
    "operations": "pytest_pallas.ops.builtins",
    "estimate": "pytest_pallas.bench.estimate",
    "Estimate": "pytest_pallas.bench.estimate",
    "EstimateUnavailable": "pytest_pallas.bench.estimate",
    "rank_blocks": "pytest_pallas.bench.estimate",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = _installed_version()
        return globals()[name]
    if name not in _PUBLIC:
        raise AttributeError(f"module 'pytest_pallas' has no attribute {name!r}")
    module = importlib.import_module(_PUBLIC[name])
    is_module = name in ("strategies", "operations", "error_models")
    value = module if is_module else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC, "__version__"})


def _installed_version() -> str:
    """The version pyproject.toml gives, as the installed distribution records it."""
    from importlib import metadata

    try:
        return metadata.version("pytest-pallas")
    except metadata.PackageNotFoundError:
        raise AttributeError("pytest_pallas.__version__: the pytest-pallas distribution is not "
                             "installed, so no version is recorded; pip install it (pip "
                             "install -e . in a clone)") from None
