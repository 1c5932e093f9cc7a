"""Sphinx configuration of the pytest-pallas documentation site (`tox -e docs`).

The pages are Markdown (MyST), so that each one also reads as it is on GitHub, and
the theme is JAX's (sphinx-book-theme): JAX, pytest and Hypothesis users know a Sphinx
site. The build treats every warning as an error: a broken link between pages, a page
left out of the table of contents or a heading anchor that does not exist fails it.
"""

import pathlib
import tomllib

_ROOT = pathlib.Path(__file__).resolve().parent.parent

project = "pytest-pallas"
release = tomllib.loads((_ROOT / "pyproject.toml").read_text())["project"]["version"]
version = release
author = "the pytest-pallas authors"
copyright = "the pytest-pallas authors"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# `[text](page.md#a-heading)` links resolve as on GitHub, which makes the same anchors.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]
# Indented blocks are shell commands and terminal output: shown as they are.
highlight_language = "none"

html_theme = "sphinx_book_theme"
html_title = f"pytest-pallas {release}"
html_theme_options = {
    "show_toc_level": 2,
    "home_page_in_toc": True,
}
