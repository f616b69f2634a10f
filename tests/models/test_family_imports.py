"""Why ``tests/models/conftest.py`` imports torchvision its own way, shown in fresh interpreters.

PyPI's torchvision 0.28.0 beside a CPU-only torch 2.13.0+cpu fails at ``import
torchvision`` (its compiled ops did not load, and registering their fake kernels raises
``operator torchvision::nms does not exist``); ``transformers`` imports torchvision when
it is installed, so building a GPT-2 fails the same way. With a matching torch build
(CI's ``torch==2.13.0``) the plain import works and the workaround does nothing. Each
case runs in a new interpreter: this process has imported torchvision already.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.models.conftest import META_REGISTRATIONS, MISSING_OPS_ERROR

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("torch", reason="torch not installed")
if importlib.util.find_spec("torchvision") is None:  # not imported here: it may fail
    pytest.skip("torchvision not installed", allow_module_level=True)

WORKAROUND = (
    "import sys; from tests.models.conftest import import_torchvision; "
    "tv = import_torchvision(); "
    f"print(type(sys.modules[{META_REGISTRATIONS!r}].__spec__).__name__); "
)


def python(code: str) -> subprocess.CompletedProcess:
    """``python -c code`` from the repository root."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


def test_plain_import_fails_only_with_the_missing_ops_error():
    plain = python("import torchvision.models; print('ok')")
    fixed = python(WORKAROUND + "print(tv.models.resnet18(num_classes=5).fc.out_features)")
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    if plain.returncode == 0:
        # torchvision's compiled ops load: the workaround imports the real module
        assert fixed.stdout.split() == ["ModuleSpec", "5"], fixed.stdout
    else:
        assert f"RuntimeError: {MISSING_OPS_ERROR}" in plain.stderr, plain.stderr[-2000:]
        # the stand-in module has no spec: the fake-kernel registrations were skipped
        assert fixed.stdout.split() == ["NoneType", "5"], fixed.stdout


def test_transformers_needs_the_same_workaround():
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers not installed")
    config = "n_layer=1, n_embd=8, n_head=2, vocab_size=16, bos_token_id=0, eos_token_id=0"
    build = f"import transformers as tr; print(tr.GPT2LMHeadModel(tr.GPT2Config({config})).lm_head)"
    plain = python(build)
    fixed = python(WORKAROUND + build)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert "Linear" in fixed.stdout
    if plain.returncode != 0:
        assert MISSING_OPS_ERROR in plain.stderr, plain.stderr[-2000:]
