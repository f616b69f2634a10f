"""``dfdl tune``: a YAML space searched on a running cluster (``--scheduler``), the best
model written and runnable by onnxruntime, the study in the SQLite file; bad spaces and
flags are one line with exit status 2, before the (unreachable) scheduler is contacted."""

from __future__ import annotations

import numpy as np
import pytest

from tests.cli.helpers import dfdl_cli

optuna = pytest.importorskip("optuna")
ort = pytest.importorskip("onnxruntime")

SPACE = "lr: {loguniform: [1e-2, 0.5]}\nbatch_size: {choice: [4, 8]}\nmomentum: 0.9\n"
UNREACHABLE = ("--scheduler", "tcp://127.0.0.1:9")


def _args(space: str = "space.yaml", *extra: str) -> tuple[str, ...]:
    return ("tune", "mlp.onnx", "--data", "data.npz", "--validation", "data.npz",
            "--space", space, *extra)  # fmt: skip


def test_tune_writes_the_best_model(work, client):
    (work / "space.yaml").write_text(SPACE)
    r = dfdl_cli(
        *_args("space.yaml", "--trials", "3", "--epochs", "2", "--storage", "sqlite:///s.db",
               "--scheduler", client.scheduler.address, "-o", "best.onnx"),
        cwd=work,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "3 trials in" in r.stdout and "best: trial " in r.stdout
    s = optuna.load_study(study_name="dfdl-tune", storage=f"sqlite:///{work / 's.db'}")
    assert len(s.trials) == 3 and f"best: trial {s.best_trial.number}," in r.stdout
    X = np.load(work / "data.npz")["X"]
    logits = ort.InferenceSession(str(work / "best.onnx")).run(None, {"x": X})[0]
    assert logits.shape == (len(X), 3) and np.isfinite(logits).all()


@pytest.mark.parametrize(
    "space, extra, words",
    [
        ("lr: [1, 2", (), "is not valid YAML"),
        ("lr: {normal: [0, 1]}\n", (), "lr: unknown distribution 'normal'"),
        ("lr: {loguniform: [0, 1]}\n", (), "lr: loguniform: low must be > 0"),
        ("rate: {uniform: [0.1, 1]}\n", (), "space key 'rate' is not a dfdl.train argument"),
        (SPACE, ("--storage", "nope"), "storage must be a database URL"),
        (SPACE, ("--lr", "0.1"), "unrecognized arguments: --lr"),
    ],
    ids=["yaml", "distribution", "bounds", "key", "storage", "flag"],
)  # fmt: skip
def test_bad_space_and_flags_are_one_line(work, space, extra, words):
    (work / "bad.yaml").write_text(space)
    r = dfdl_cli(*_args("bad.yaml", *extra, *UNREACHABLE, "-o", "x.onnx"), cwd=work)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dfdl: error: ") and words in lines[0], lines
    assert not (work / "x.onnx").exists() and not (work / "dfdl-tune.db").exists()
