"""The package's layout holds: no import cycle among its modules, function-level imports
counted, and no module over 700 lines.

A cycle hidden inside a function still ties two modules together: each can only be
understood, moved or tested with the other. The graph is read from the source (``ast``),
so nothing is imported and the test costs no JAX.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 700

# The top-level folders that install inside the package (pyproject.toml's package-dir).
_INSTALLED_AS = {"reference_kernels": "pytest_pallas.reference_kernels",
                 "conformance": "pytest_pallas.conformance"}


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Module name -> (its file, whether it is a package's ``__init__``)."""
    modules = {}
    for path in (root / "pytest_pallas").rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    for folder, package in _INSTALLED_AS.items():
        for path in (root / folder).glob("*.py"):
            is_package = path.stem == "__init__"
            modules[package if is_package else f"{package}.{path.stem}"] = (path, is_package)
    return modules


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """The nodes under ``if TYPE_CHECKING:``: not imports at run time."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for inner in ast.walk(node))
    return skipped


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at the top or inside a function."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for module, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        skipped = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, is_package, node)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                # The package's own __init__ imports nothing of it (its names load on use).
                if target and target != module and target != "pytest_pallas":
                    graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _describe(graph: dict[str, set[str]], component: list[str]) -> str:
    members = set(component)
    return "; ".join(f"{module} -> {', '.join(sorted(graph[module] & members))}"
                     for module in component)


def test_no_import_cycle_among_the_package_modules():
    graph = import_graph(ROOT)
    assert len(graph) > 50, "the package's modules were not found"
    found = cycles(graph)
    assert not found, "import cycles (function-level imports counted): " + " | ".join(
        _describe(graph, component) for component in found)


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function(tmp_path):
    package = tmp_path / "pytest_pallas"
    (package / "ops").mkdir(parents=True)
    for folder in _INSTALLED_AS:
        (tmp_path / folder).mkdir()
    (package / "__init__.py").write_text("")
    (package / "ops" / "__init__.py").write_text("")
    (package / "ops" / "operation.py").write_text(
        "def check():\n    from .inputs import build_arguments\n")
    (package / "ops" / "inputs.py").write_text("from .operation import check\n")
    (package / "ops" / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .inputs import Case\n")
    graph = import_graph(tmp_path)
    assert cycles(graph) == [["pytest_pallas.ops.inputs", "pytest_pallas.ops.operation"]]
    assert graph["pytest_pallas.ops.typed"] == set()


@pytest.mark.parametrize("folder", ["pytest_pallas", *_INSTALLED_AS])
def test_no_module_is_over_700_lines(folder):
    long = {str(path.relative_to(ROOT)): lines for path in (ROOT / folder).rglob("*.py")
            if (lines := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by job): {long}"


# Imports run one way: down this list (docs/design.md). A module may import its own layer
# and those below it, never one above, function-level imports counted. The plugin is pytest
# glue over the wings; the wings share the settings and the compatibility layer below them.
LAYERS = (
    ("entry points", ("pytest_pallas.benchmark_gate", "pytest_pallas.roofline_plot")),
    ("plugin", ("pytest_pallas.plugin", "pytest_pallas.conformance")),
    ("suite and benchmarks", ("pytest_pallas.suite", "pytest_pallas.bench")),
    ("test supervision", ("pytest_pallas.supervision",)),
    ("backend and comparator", ("pytest_pallas.backend", "pytest_pallas.compare")),
    ("checks", ("pytest_pallas.checks",)),
    ("ops and kernels", ("pytest_pallas.ops", "pytest_pallas.reference_kernels",
                         "pytest_pallas.strategies", "pytest_pallas.tpu", "pytest_pallas.gpu",
                         "pytest_pallas.numerics")),
    ("settings and compatibility", ("pytest_pallas.settings", "pytest_pallas.hosts",
                                    "pytest_pallas.slice_hosts", "pytest_pallas.chip_topology",
                                    "pytest_pallas.dtypes", "pytest_pallas.tiling",
                                    "pytest_pallas._compat")),
)


def layer_of(module: str) -> int | None:
    """The index in LAYERS of a module (0 is the top), None for the package's own __init__."""
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            return index
    return None


def imports_running_up(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        here = layer_of(module)
        for target in sorted(targets):
            there = layer_of(target)
            if here is not None and there is not None and there < here:
                found.append(f"{module} ({LAYERS[here][0]}) -> {target} ({LAYERS[there][0]})")
    return found


def test_every_module_has_a_layer():
    unplaced = sorted(module for module in import_graph(ROOT)
                      if module != "pytest_pallas" and layer_of(module) is None)
    assert not unplaced, f"modules in no layer of LAYERS: {unplaced}"


def test_imports_run_down_the_layers():
    found = imports_running_up(import_graph(ROOT))
    assert not found, "imports running up (function-level ones counted): " + "; ".join(found)


def _package_with(root: Path, *folders: str) -> Path:
    """An empty ``pytest_pallas`` under ``root`` with these sub-packages."""
    package = root / "pytest_pallas"
    for folder in folders:
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    for folder in _INSTALLED_AS:
        (root / folder).mkdir()
    (package / "__init__.py").write_text("")
    return package


def test_an_import_running_up_inside_a_function_is_found(tmp_path):
    package = _package_with(tmp_path, "checks", "plugin")
    (package / "plugin" / "options.py").write_text("LIBTPU = None\n")
    (package / "checks" / "compile_check.py").write_text(
        "def version():\n    from ..plugin.options import LIBTPU\n    return LIBTPU\n")
    assert imports_running_up(import_graph(tmp_path)) == [
        "pytest_pallas.checks.compile_check (checks) -> pytest_pallas.plugin.options (plugin)"]


def private_names_imported_across_modules(root: Path) -> list[str]:
    """``from <a project module> import _name``: a module's private name used by another."""
    modules = _modules(root)
    found = []
    for module, (path, is_package) in sorted(modules.items()):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = _absolute(module, is_package, node)
            if not base.startswith("pytest_pallas"):
                continue
            found += [f"{module}: from {base} import {alias.name}" for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_no_private_name_is_imported_from_another_module():
    found = private_names_imported_across_modules(ROOT)
    assert not found, "private names used across modules (make them public): " + "; ".join(found)


def test_every_reference_to_the_contract_names_its_file():
    """The contract is docs/contract.md; a docstring pointing elsewhere sends a reader nowhere."""
    stale = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("pytest_pallas", *_INSTALLED_AS, "tests", "benchmarks")
        for path in (ROOT / folder).rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "CONTRACT.md" in line and path.name != "test_layout.py"
    ]
    assert not stale, "CONTRACT.md is docs/contract.md: " + ", ".join(stale)


# plugin/ is pytest glue: hooks, options, fixtures and session wiring, each module with its job
# here. A module that is none of these (per-test kernel supervision, a rule, a comparison,
# rendering a report) belongs to a wing below (docs/design.md).
PLUGIN_GLUE = {
    "pytest_pallas.plugin": "the package (imports nothing)",
    "pytest_pallas.plugin.hooks": "hooks: the pytest11 entry point",
    "pytest_pallas.plugin.hookspecs": "hooks: the hook a conftest implements",
    "pytest_pallas.plugin.options": "options: flags and ini options",
    "pytest_pallas.plugin.implementations": "options: --pallas-impl and --pallas-ops",
    "pytest_pallas.plugin.versions": "options: the tested JAX range, for the header",
    "pytest_pallas.plugin.fixtures": "fixtures",
    "pytest_pallas.plugin.session": "session wiring: per-run state, a test's KernelRun opened",
    "pytest_pallas.plugin.conformance_ops": "session wiring: the ops a run selects",
    "pytest_pallas.plugin.conformance_order": "session wiring: the order xdist's workers take",
    "pytest_pallas.plugin.device_skips": "session wiring: skips for the simulated devices",
    "pytest_pallas.plugin.hypothesis_settings": "session wiring: Hypothesis's profile and seeds",
    "pytest_pallas.plugin.persistent_cache": "session wiring: pytest's cache directory",
    "pytest_pallas.plugin.run_records": "session wiring: workers' records, the report written",
    "pytest_pallas.plugin.workers": "session wiring: pytest-xdist's workers and devices",
    "pytest_pallas.plugin.processes": "session wiring: --pallas-processes, JAX's processes joined",
    "pytest_pallas.plugin.process_controller": "session wiring: the controller's workers",
    "pytest_pallas.plugin.process_worker": "session wiring: one process's order and reports",
    "pytest_pallas.plugin.process_verdicts": "session wiring: one verdict from every process",
    "pytest_pallas.plugin.tpu_slice": "session wiring: the hosts of a TPU slice joined",
    "pytest_pallas.plugin.chips": "session wiring: each test once per chip, the chip's tally",
    "pytest_pallas.plugin.header": "reports: the header's lines",
    "pytest_pallas.plugin.startup": "session wiring: start-up and end, in JAX's order",
    "pytest_pallas.plugin.collection": "session wiring: what the plugin does to collection",
    "pytest_pallas.plugin.test_protocol": "session wiring: one test from setup to report",
    "pytest_pallas.plugin.worker_events": "session wiring: pytest-xdist's events",
    "pytest_pallas.plugin.run_state": "session wiring: what the run has done, one place",
    "pytest_pallas.plugin.skips": "session wiring: the skips the plugin's markers decide",
    "pytest_pallas.plugin.failure_section": "reports: a failure's pallas section",
    "pytest_pallas.plugin.stuck_tests": "session wiring: a stuck test's process replaced",
}
# What runs, checks or judges kernels: the plugin hands a test to these through
# supervision.KernelRun and the suite, never enters them itself.
KERNEL_MACHINERY = (
    "pytest_pallas.compare", "pytest_pallas.checks.kernel_check",
    "pytest_pallas.checks.static_rules", "pytest_pallas.checks.runtime_rules",
    "pytest_pallas.checks.mismatch", "pytest_pallas.checks.violations",
    "pytest_pallas._compat.tpu_interpreter", "pytest_pallas._compat.gpu_interpreter",
    "pytest_pallas._compat.pallas_call_hooks", "pytest_pallas._compat.interpreter_fixes",
    "pytest_pallas._compat.out_of_bounds",
)


def plugin_beyond_glue(graph: dict[str, set[str]]) -> list[str]:
    """Modules of plugin/ that are not glue: not in PLUGIN_GLUE, or importing kernel
    machinery (function-level imports counted)."""
    plugin = sorted(module for module in graph if layer_of(module) == 1
                    and module.startswith("pytest_pallas.plugin"))
    found = [f"{module} (not a hook, option, fixture or session wiring module)"
             for module in plugin if module not in PLUGIN_GLUE]
    found += [f"{module} imports {target}" for module in plugin
              for target in sorted(graph[module]) if target in KERNEL_MACHINERY]
    return found


def test_plugin_holds_only_glue():
    graph = import_graph(ROOT)
    assert set(PLUGIN_GLUE) <= set(graph), "PLUGIN_GLUE names a module that is gone"
    found = plugin_beyond_glue(graph)
    assert not found, "plugin/ is pytest glue only: " + "; ".join(found)


def test_kernel_logic_in_the_plugin_is_found(tmp_path):
    package = _package_with(tmp_path, "plugin", "_compat")
    (package / "_compat" / "tpu_interpreter.py").write_text("def reset(): pass\n")
    (package / "plugin" / "hooks.py").write_text(
        "def pytest_runtest_setup(item):\n"
        "    from .._compat.tpu_interpreter import reset\n    reset()\n")
    (package / "plugin" / "kernel_guard.py").write_text("class KernelGuard: pass\n")
    assert plugin_beyond_glue(import_graph(tmp_path)) == [
        "pytest_pallas.plugin.kernel_guard (not a hook, option, fixture or session wiring "
        "module)",
        "pytest_pallas.plugin.hooks imports pytest_pallas._compat.tpu_interpreter"]


def design_tree(text: str) -> dict[str, set[str]]:
    """docs/design.md's tree of the package: folder ('' for the top) -> the modules it names."""
    tree: dict[str, set[str]] = {"": set()}
    folder = None
    for line in text.splitlines():
        if line.strip() == "pytest_pallas/":
            folder = ""
            continue
        if folder is None:
            continue
        if not line.startswith("      "):
            if tree[""] or len(tree) > 1:
                break  # past the package: reference_kernels/, tests/, ...
            continue
        name = line.split()[0]
        if line.startswith("        ") and name.endswith(".py"):
            tree[folder].add(name)
        elif name.endswith("/"):
            folder = name.rstrip("/")
            tree.setdefault(folder, set())
        elif name.endswith(".py"):
            folder = ""
            tree[""].add(name)
    return tree


def test_the_design_page_maps_every_module_of_the_package():
    tree = design_tree((ROOT / "docs" / "design.md").read_text())
    package = ROOT / "pytest_pallas"
    actual = {"": {path.name for path in package.glob("*.py") if path.name != "__init__.py"}}
    for folder in sorted(path for path in package.iterdir() if (path / "__init__.py").exists()):
        actual[folder.name] = {path.name for path in folder.glob("*.py")
                               if path.name != "__init__.py"}
    missing = {folder: sorted(names - tree.get(folder, set()))
               for folder, names in actual.items() if names - tree.get(folder, set())}
    stale = {folder: sorted(names - actual.get(folder, set()))
             for folder, names in tree.items() if names - actual.get(folder, set())}
    assert not missing and not stale, (
        f"docs/design.md's tree: modules it does not name {missing}, names of no module {stale}")


def design_layers(text: str) -> list[tuple[str, set[str]]]:
    """docs/design.md's table of layers: each row's layer and the modules it names."""
    rows = text.split("| layer | modules | may import |", 1)[1].split("\n\n", 1)[0]
    layers = []
    for row in rows.splitlines()[2:]:
        name, modules = (cell.strip() for cell in row.strip("|").split("|")[:2])
        layers.append((name, {"pytest_pallas." + module.rstrip("/")
                              for module in re.findall(r"`([\w/]+)`", modules)}))
    return layers


def test_the_design_page_places_every_module_in_the_layers_this_test_enforces():
    assert design_layers((ROOT / "docs" / "design.md").read_text()) == [
        (name, set(prefixes)) for name, prefixes in LAYERS]


def test_every_package_of_the_source_is_installed():
    """pyproject.toml lists the packages a wheel holds: one left out installs without it."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"])
    found = {".".join(path.parent.relative_to(ROOT).parts)
             for path in (ROOT / "pytest_pallas").rglob("__init__.py")}
    found |= set(_INSTALLED_AS.values())
    assert found <= listed, f"packages pyproject.toml does not install: {sorted(found - listed)}"


# Laziness at the edge only (docs/design.md, "Where imports wait"): the modules pytest loads
# in every run, the plugin's glue and the package's ``__init__``, import JAX and the heavy
# modules inside their hooks, once the run uses Pallas. Every module behind them imports JAX,
# NumPy and its neighbours at the top; an import that must wait (a module loaded before JAX
# starts, an entry point that sets JAX's environment first) says why, on its line or the
# comment line just above it: ``# lazy: <why>``.
EDGE = ("pytest_pallas.plugin",)  # and the package's own __init__
LAZY_MARKER = "# lazy:"
_HEAVY_TOP_LEVELS = ("jax", "jaxlib", "numpy", "ml_dtypes")


def is_edge(module: str) -> bool:
    return module == "pytest_pallas" or any(
        module == prefix or module.startswith(prefix + ".") for prefix in EDGE)


def _in_a_function(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    while (node := parents.get(id(node))) is not None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return True
    return False


def lazy_imports_behind_the_edge(root: Path) -> list[str]:
    """Function-level imports of JAX, NumPy or a module of the package, outside the edge,
    without a ``# lazy:`` reason."""
    modules = _modules(root)
    found = []
    for module, (path, is_package) in sorted(modules.items()):
        if is_edge(module):
            continue
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines), str(path))
        parents = {id(child): parent for parent in ast.walk(tree)
                   for child in ast.iter_child_nodes(parent)}
        skipped = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                names = [_absolute(module, is_package, node)]
            if not any(name.split(".")[0] in (*_HEAVY_TOP_LEVELS, "pytest_pallas")
                       for name in names) or not _in_a_function(node, parents):
                continue
            above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
            marked = any(LAZY_MARKER in line
                         for line in lines[node.lineno - 1:node.end_lineno]) or (
                above.startswith(LAZY_MARKER))
            if not marked:
                found.append(f"{path.relative_to(root)}:{node.lineno}: "
                             f"{lines[node.lineno - 1].strip()}")
    return found


def test_lazy_imports_live_at_the_edge_only():
    found = lazy_imports_behind_the_edge(ROOT)
    assert not found, (
        "function-level imports behind the plugin's edge: import at the top, or say why "
        f"the import waits with '{LAZY_MARKER} <why>': " + "; ".join(found))


def test_a_lazy_import_behind_the_edge_is_found(tmp_path):
    package = _package_with(tmp_path, "ops", "plugin")
    (package / "ops" / "inputs.py").write_text("CASES = ()\n")
    (package / "ops" / "operation.py").write_text(
        "import re\n\n\n"
        "def draw():\n    import numpy as np\n    import json\n    return np, json\n\n\n"
        "def cases():\n    from .inputs import CASES\n    return CASES\n\n\n"
        "def estimate():\n    from jax.experimental import pallas as pl  # lazy: a conftest\n"
        "    # lazy: the reason, on the line above\n    import jax\n    return pl, jax\n")
    (package / "plugin" / "hooks.py").write_text(
        "def pytest_configure(config):\n    import jax\n    from ..ops import inputs\n")
    assert lazy_imports_behind_the_edge(tmp_path) == [
        "pytest_pallas/ops/operation.py:5: import numpy as np",
        "pytest_pallas/ops/operation.py:11: from .inputs import CASES"]
