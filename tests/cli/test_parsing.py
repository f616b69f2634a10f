"""What every ``dfdl`` command shares: help, version, ``--debug``, the flag values, and
imports that keep ``dfdl --help`` fast. Its one-line errors are the command-line rows of
the bad-input table, ``tests/test_bad_input.py``."""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import pytest

import dfdl.cli
from dfdl.cli.common import parse_dims, parse_tiles
from tests.cli.helpers import dfdl_cli

COMMANDS = ("train", "plan", "export-training-graph", "info")

# ---- help, version -------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help(work, command):
    r = dfdl_cli(*([command] if command else []), "--help", cwd=work)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: dfdl {command}".rstrip())
    if not command:
        for sub in COMMANDS:
            assert sub in r.stdout


def test_version(work):
    r = dfdl_cli("--version", cwd=work)
    assert r.returncode == 0
    assert r.stdout.strip() == f"dfdl {dfdl.__version__}"


def test_the_commands_import_the_pipeline_only_when_they_run():
    """Module level of the CLI imports only the standard library and dfdl.cli itself
    (the package docstring's promise): argparse answers ``--help`` before the rest."""
    folder = Path(dfdl.cli.__file__).parent
    for path in sorted(folder.glob("*.py")):
        for stmt in ast.parse(path.read_text()).body:
            if isinstance(stmt, ast.Import):
                names = [a.name for a in stmt.names]
            elif isinstance(stmt, ast.ImportFrom):
                names = [stmt.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or name.startswith(
                    ("dfdl.cli", "__future__")
                ), f"{path.name} imports {name} at module level"


# ---- --debug -------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback(work, where):
    args = ["info", "bad.onnx"]
    args = ["--debug", *args] if where == "before" else [*args, "--debug"]
    r = dfdl_cli(*args, cwd=work)
    assert r.returncode not in (0, 2)
    assert "Traceback (most recent call last)" in r.stderr
    assert "ModelError" in r.stderr


# ---- flag values ---------------------------------------------------------------------------


def test_parse_tiles():
    assert parse_tiles("batch=2,model=1") == {"batch": 2, "model": 1}
    assert parse_tiles("batch=1,space=4") == {"batch": 1, "space": 4}
    assert parse_tiles("uneven") == "uneven"
    assert parse_tiles("auto") is None
    assert parse_tiles("batch=2,split_norms=1") == {"batch": 2, "split_norms": 1}
    with pytest.raises(argparse.ArgumentTypeError, match="expected batch"):
        parse_tiles("rows=3")


def test_parse_dims():
    assert parse_dims("seq=256,height=64") == {"seq": 256, "height": 64}
    with pytest.raises(argparse.ArgumentTypeError, match="'x' is not an integer"):
        parse_dims("seq=x")
    with pytest.raises(argparse.ArgumentTypeError, match="at least 1"):
        parse_dims("seq=0")
