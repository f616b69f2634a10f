"""Bad input to ``dfdl train``, as one table: every case exits with status 2 and one
line naming the problem, before any cluster is reached, and leaves nothing behind.

Each case runs ``python -m dfdl train`` in a process group of its own with
``--scheduler`` pointing at a port nothing listens on: a check made only after
connecting would fail with "cannot connect to the scheduler" instead of its own line.
Afterwards the folder holds what it held before (no partial model, checkpoint or
temporary file) and no process of the group is left.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import dfdl.models
from tests.cli.helpers import SIZES, N
from tests.ir.helpers import set_location

UNREACHABLE = ("--scheduler", "tcp://127.0.0.1:9")
#: (id, arguments after "train", a fragment the error line must contain)
CASES = [
    # models
    ("missing model", ["missing.onnx", "--data", "data.npz"], "missing.onnx"),
    ("garbage model", ["bad.onnx", "--data", "data.npz"], "bad.onnx"),
    ("unsupported op", ["unique.onnx", "--data", "data.npz"], "Unique"),
    ("external data outside the folder", ["escape.onnx", "--data", "data.npz"], "escape"),
    # data
    ("missing data", ["mlp.onnx", "--data", "missing.npz"], "missing.npz"),
    ("garbage data", ["mlp.onnx", "--data", "bad.npz"], "bad.npz"),
    ("too many features", ["mlp.onnx", "--data", "wide.npz"], "shape"),
    ("labels out of range", ["mlp.onnx", "--data", "classes.npz"], "out of range"),
    ("fewer labels than samples", ["mlp.onnx", "--data", "short.npz"], "y has 21"),
    ("npy data without labels", ["mlp.onnx", "--data", "X.npy"], "labels"),
    # hyperparameters and flags
    ("batch size 0", ["mlp.onnx", "--data", "data.npz", "--batch-size", "0"], "batch_size"),
    ("epochs 0", ["mlp.onnx", "--data", "data.npz", "--epochs", "0"], "epochs"),
    ("negative lr", ["mlp.onnx", "--data", "data.npz", "--lr=-1"], "lr"),
    ("nan lr", ["mlp.onnx", "--data", "data.npz", "--lr", "nan"], "lr"),
    ("unknown loss", ["mlp.onnx", "--data", "data.npz", "--loss", "hinge"], "hinge"),
    ("bad tiles", ["mlp.onnx", "--data", "data.npz", "--tiles", "rows=3"], "rows"),
    # checkpoints
    (
        "checkpoint every 0",
        ["mlp.onnx", "--data", "data.npz", "--checkpoint-dir", "c", "--checkpoint-every", "0"],
        "--checkpoint-every",
    ),
    (
        "resume without a checkpoint",
        ["mlp.onnx", "--data", "data.npz", "--checkpoint-dir", "empty", "--resume"],
        "no checkpoint",
    ),
    (
        "checkpoint folder is a file",
        ["mlp.onnx", "--data", "data.npz", "--checkpoint-dir", "mlp.onnx", "--resume"],
        "mlp.onnx",
    ),
    (
        "latest pointer out of the folder",
        ["mlp.onnx", "--data", "data.npz", "--checkpoint-dir", "escape_ckpt", "--resume"],
        "escape_ckpt/latest",
    ),
    (
        "a new run over another run's checkpoints",
        ["mlp.onnx", "--data", "data.npz", "--checkpoint-dir", "used_ckpt", "--checkpoint-every=1"],
        "holds another run's checkpoints",
    ),
    # outputs
    ("output folder missing", ["mlp.onnx", "--data", "data.npz", "-o", "no/o.onnx"], "no"),
    ("output is a folder", ["mlp.onnx", "--data", "data.npz", "-o", "."], "folder"),
    ("output under /proc", ["mlp.onnx", "--data", "data.npz", "-o", "/proc/o.onnx"], "/proc"),
    ("output empty", ["mlp.onnx", "--data", "data.npz", "-o", ""], "-o"),
]


@pytest.fixture(scope="module")
def bad(work) -> Path:
    """The ``work`` files plus the bad ones of this table."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], N)
    np.savez(work / "wide.npz", X=np.concatenate([X, X[:, :1]], axis=1), y=y)
    np.savez(work / "classes.npz", X=X, y=np.full(N, SIZES[-1] + 4))
    np.savez(work / "short.npz", X=X, y=y[:-3])
    model = dfdl.models.mlp(SIZES, seed=1)
    onnx.save(
        model,
        str(work / "escape.onnx"),
        save_as_external_data=True,
        location="escape.data",
        size_threshold=0,
    )
    shell = onnx.load(str(work / "escape.onnx"), load_external_data=False)
    onnx.save(set_location(shell, "../escape.data"), str(work / "escape.onnx"))
    (work / "empty").mkdir(exist_ok=True)
    (work / "escape_ckpt").mkdir(exist_ok=True)
    (work / "escape_ckpt" / "latest").write_text("../data.npz")
    (work / "used_ckpt").mkdir(exist_ok=True)
    (work / "used_ckpt" / "step-000000004.npz").write_bytes(b"another run's")
    (work / "used_ckpt" / "latest").write_text("step-000000004.npz")
    return work


def _listing(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


@pytest.mark.parametrize("case, args, fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_before_the_cluster_and_leaves_nothing(bad, case, args, fragment):
    if "-o" not in args:
        args = [*args, "-o", "o.onnx"]
    before = _listing(bad)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dfdl", "train", *args, *UNREACHABLE],
        cwd=bad,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, (out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dfdl: error: "), err
    assert "scheduler" not in lines[0], "checked only after reaching for the cluster"
    assert fragment in lines[0], lines[0]
    assert out == ""
    assert _listing(bad) == before
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)
