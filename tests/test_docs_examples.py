"""The examples of the README and the docs pages run as they are written.

Every Python block compiles; a block that starts with ``# test_NAME.py`` is a test module and
passes under the plugin; ``>>>`` examples run as doctests; every ``--pallas-*`` flag a page
names is one the plugin registers, every repository file it names is in the repository, and
every ``python -m`` module it names exists.
"""

import doctest
import importlib.util
import os
import re

import pytest
from test_docs import ROOT, doc_pages, read, registered_flags

# The README and the docs pages, each as its path from the repository's root.
PAGES = ["README.md"] + doc_pages()

_FENCED = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.S | re.M)


def python_blocks(page):
    return [body for language, body in _FENCED.findall(read(page)) if language == "python"]


def page_test_modules():
    """(page, file name, source) of every block that is a test module."""
    found = []
    for page in PAGES:
        for block in python_blocks(page):
            name = re.match(r"# (test_\w+\.py)\n", block)
            if name:
                found.append((page, name.group(1), block))
    return found


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)])
def test_every_python_block_of_a_page_compiles(page):
    for number, block in enumerate(python_blocks(page), 1):
        try:
            compile(block, f"{page}, Python block {number}", "exec")
        except SyntaxError as error:
            pytest.fail(f"{page}: Python block {number} does not compile: {error}")


def test_the_readme_has_a_complete_test_module_of_a_kernel():
    assert [name for page, name, _ in page_test_modules() if page == "README.md"], (
        "the README's example is a test module that starts with '# test_NAME.py'")


@pytest.mark.parametrize("page, name, source", page_test_modules(),
                         ids=[f"{page}:{name}" for page, name, _ in page_test_modules()])
def test_a_pages_test_module_passes_as_written(pytester, page, name, source):
    pytester.makepyfile(**{name[:-3]: source})
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist", "--pallas-seed=0")
    assert result.ret == 0, f"{page}'s {name}:\n" + result.stdout.str()[-3000:]
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 1 and not outcomes.get("failed"), outcomes


@pytest.mark.parametrize("page", [p for p in PAGES if ">>> " in read(p)])
def test_a_pages_doctest_examples_print_what_they_show(page):
    parser = doctest.DocTestParser()
    examples = "\n".join(body for language, body in _FENCED.findall(read(page))
                         if language in ("pycon", "python") and ">>> " in body)
    test = parser.get_doctest(examples, {}, page, page, 0)
    assert test.examples, f"{page} has '>>>' outside a pycon block"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0, f"a doctest example of {page} failed"


@pytest.mark.parametrize("page", PAGES)
def test_every_flag_a_page_names_is_registered(page):
    text = read(page)
    if page == "docs/contract.md":  # the contract may name what is not implemented yet
        text = "\n".join(line for line in text.splitlines() if "not implemented yet" not in line)
    named = set(re.findall(r"(--pallas-[a-z]+(?:-[a-z]+)*)", text))
    unknown = sorted(named - registered_flags())
    assert not unknown, f"{page} names flags the plugin does not have: {unknown}"


_REPOSITORY_PATH = re.compile(
    r"(?<![\w/.-])((?:tests|benchmarks|pytest_pallas|reference_kernels|conformance|constraints"
    r"|\.ci|docs)/[\w./-]*\w)")


@pytest.mark.parametrize("page", PAGES)
def test_every_repository_file_a_page_names_exists(page):
    missing = sorted({path for path in _REPOSITORY_PATH.findall(read(page))
                      if not path.startswith("docs/_build")
                      and not os.path.exists(os.path.join(ROOT, path))})
    assert not missing, f"{page} names files the repository does not have: {missing}"


@pytest.mark.parametrize("page", PAGES)
def test_every_module_a_page_runs_with_python_dash_m_exists(page):
    modules = set(re.findall(r"python -m ([\w.]+)", read(page)))
    missing = sorted(m for m in modules if importlib.util.find_spec(m) is None)
    assert not missing, f"{page} runs modules that do not exist: {missing}"
