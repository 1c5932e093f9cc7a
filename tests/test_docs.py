"""The documentation a clone has: the README's and the docs pages' links resolve inside the
repository, the contract is docs/contract.md and agrees with the flags and ops of the code,
and the project's own test runs say why a test was skipped. (The pages' examples run in
test_docs_examples.py.)"""

import fnmatch
import os
import re
import subprocess
import sys

import pytest

from pytest_pallas.ops.registry import OP_NAMES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(relative):
    with open(os.path.join(ROOT, relative), encoding="utf-8") as handle:
        return handle.read()


def registered_flags():
    from pytest_pallas.plugin import options

    class Group:
        def __init__(self):
            self.flags = []

        def addoption(self, *names, **_):
            self.flags += names

    class Parser:
        def __init__(self):
            self.group = Group()

        def getgroup(self, *_):
            return self.group

        def addini(self, *_, **__):
            pass

    parser = Parser()
    options.add_options(parser)
    return set(parser.group.flags)


def test_every_file_the_readme_names_is_in_the_repository():
    readme = read("README.md")
    linked = set(re.findall(r"\]\(([^)#:]+)\)", readme))
    named = set(re.findall(r"\b([\w./-]+\.md)\b", readme))
    assert "docs/contract.md" in linked
    missing = sorted(path for path in linked | named
                     if not os.path.exists(os.path.join(ROOT, path)))
    assert not missing, f"the README names files a clone does not have: {missing}"


def doc_pages():
    docs = os.path.join(ROOT, "docs")
    return sorted(os.path.relpath(os.path.join(folder, name), ROOT)
                  for folder, subfolders, names in os.walk(docs)
                  if "_build" not in os.path.relpath(folder, docs).split(os.sep)
                  for name in names if name.endswith(".md"))


def heading_anchors(markdown):
    """The anchors GitHub and MyST (myst_heading_anchors) give a page's headings."""
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", re.sub(r"```.*?```", "", markdown, flags=re.S),
                              re.MULTILINE):
        anchor = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(anchor)
    return anchors


def test_the_readme_links_the_docs_pages_a_new_reader_needs():
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", read("README.md")))
    assert {"docs/installing.md", "docs/command-line.md", "docs/conformance-suite.md",
            "docs/your-own-op.md", "docs/contract.md", "docs/developing.md"} <= linked
    assert len(read("README.md").splitlines()) <= 250, "the README is the front door: a screen"


@pytest.mark.parametrize("page", doc_pages())
def test_every_link_of_a_docs_page_reaches_a_page_and_heading_that_exist(page):
    """What Sphinx's warnings say in `tox -e docs`, in every test run, also for GitHub."""
    text = read(page)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"\w+:", target):  # an external address
            continue
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(os.path.join(ROOT, resolved)):
            broken.append(target)
        elif anchor and anchor not in heading_anchors(read(resolved)):
            broken.append(target)
    assert not broken, f"{page} links to pages or headings that do not exist: {broken}"


def test_every_docs_page_is_in_the_sites_table_of_contents():
    index = read("docs/index.md")
    listed = set()
    for block in re.findall(r"```\{toctree\}\n(.*?)```", index, re.S):
        entries = [line.strip() for line in block.splitlines()
                   if line.strip() and not line.startswith(":")]
        for entry in entries:
            pages = [p for p in doc_pages() if fnmatch.fnmatch(p[len("docs/"):-3], entry)]
            listed.update(pages)
    missing = sorted(set(doc_pages()) - listed - {"docs/index.md"})
    assert not missing, (
        f"pages in no toctree of docs/index.md (the site would leave them out): {missing}")


def test_the_contract_names_every_flag_of_the_suite_and_only_flags_that_exist():
    contract = read("docs/contract.md")
    section = contract[contract.index("## 1. Command line"):contract.index("## 2.")]
    rows = re.findall(r"^\| `(--pallas-[\w-]+)[^|]*\|([^\n]*)$", section, re.MULTILINE)
    flags = registered_flags()
    for flag, text in rows:
        assert flag in flags or "not implemented yet" in text, (
            f"docs/contract.md documents {flag}, which the plugin does not register; "
            "implement it or mark it 'not implemented yet'")
    documented = {flag for flag, _ in rows}
    assert {"--pallas-impl", "--pallas-ops", "--pallas-report", "--pallas-conformance"} \
        <= documented
    assert "Turns the suite on" in dict(rows)["--pallas-ops"], (
        "docs/contract.md: --pallas-ops turns the suite on")


def test_the_contracts_operations_are_the_suites():
    contract = read("docs/contract.md")
    tables = contract[contract.index("## 2. Operations"):contract.index("## 3.")]
    ops = re.findall(r"^\| `(\w+)` \|", tables, re.MULTILINE)
    assert tuple(ops) == tuple(OP_NAMES)


def test_the_command_line_page_documents_every_flag_the_plugin_registers():
    table = read("docs/command-line.md")
    undocumented = sorted(flag for flag in registered_flags() if f"`{flag}" not in table)
    assert not undocumented, undocumented


def test_the_projects_test_runs_say_why_a_test_was_skipped(tmp_path):
    """The project's pytest configuration (pyproject.toml) shows skip reasons without -rs."""
    (tmp_path / "test_skipping.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.skip(reason='needs the plot extra')\n"
        "def test_skipped():\n    pass\n")
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", os.path.join(ROOT, "pyproject.toml"),
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-p", "no:xdist",
         str(tmp_path / "test_skipping.py")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert completed.returncode == 0, completed.stdout
    assert re.search(r"SKIPPED \[1\] .*test_skipping.py:\d+: needs the plot extra",
                     completed.stdout), completed.stdout


@pytest.mark.parametrize("extra", ["tpu", "plot", "dev"])
def test_the_installing_page_shows_each_extra_from_a_clone(extra):
    section = read("docs/installing.md")
    assert f"pip install -c constraints/ci.txt '.[{extra}]'" in section \
        or f"-e '.[{extra}]'" in section
    assert "pip wheel" in section


def test_the_readmes_two_commands_are_what_ci_runs_and_what_the_site_shows():
    readme = read("README.md")
    commands = re.findall(r"^    (python3\.11 -m venv .*)$", readme, re.MULTILINE)
    assert len(commands) == 2, commands
    main_job, test_command = commands
    assert main_job.endswith("pytest --pallas-conformance")
    ci_run = read(".ci/run")
    assert test_command.split(" && ", 2)[2] in ci_run, (
        "the README's test command is the one .ci/run runs")
    for page in ("docs/index.md", "docs/developing.md"):
        shown = re.findall(r"^    (python3\.11 -m venv .*)$", read(page), re.MULTILINE)
        assert set(shown) <= set(commands) and shown, f"{page} shows other commands: {shown}"
