"""The docstrings' ``>>>`` examples run, and say what they print."""

import doctest
import importlib
import pathlib

import pytest

# The kernels' examples call pallas_call: the plugin interprets them on the CPU.
pytestmark = pytest.mark.pallas

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _modules_with_examples():
    for package, directory in (("pytest_pallas", "pytest_pallas"),
                               ("pytest_pallas.reference_kernels", "reference_kernels")):
        for path in sorted((ROOT / directory).rglob("*.py")):
            if ">>>" in path.read_text():
                parts = path.relative_to(ROOT / directory).with_suffix("").parts
                name = ".".join((package, *parts[: -1 if parts[-1] == "__init__" else None]))
                yield name


@pytest.mark.parametrize("module_name", list(_modules_with_examples()))
def test_docstring_examples(module_name):
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in finder.find(module, module_name) if t.examples]
    assert tests, f"{module_name} has '>>>' but no example was found"
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) of {module_name} failed"
