"""Sphinx configuration of dfdl's documentation (Markdown pages through MyST).

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html``. The supported-ops
table and the command-line reference are generated at every build (``_ext/generate.py``)
into ``docs/generated/``, which is not committed.
"""

from __future__ import annotations

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "_ext"))
sys.path.append(os.path.dirname(HERE))  # where dfdl is not installed

project = "dfdl"
author = "dfdl developers"
copyright = "2026, dfdl developers"  # noqa: A001  (Sphinx's name)

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "generate",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "generated"]  # generated/ pages are included by others

myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

# API reference: Google-style docstrings; no cross-reference checking of every name the
# docstrings mention (nitpicky stays off)
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"show-inheritance": False}

html_theme = "furo" if importlib.util.find_spec("furo") else "alabaster"
html_title = "dfdl"
html_static_path: list[str] = []
