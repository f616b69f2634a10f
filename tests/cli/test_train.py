"""``dfdl train``, run as a real subprocess (``python -m dfdl``): each case starts its
own embedded cluster (a few seconds)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np

from dfdl.cli.train import summarize_losses
from dfdl.runtime import checkpoint
from tests.cli.helpers import SIZES, dfdl_cli, params


def test_train_writes_a_model_onnxruntime_runs(work):
    import onnxruntime as ort

    r = dfdl_cli(
        "train", "mlp.onnx", "--data", "data.npz", "--batch-size", "8", "--steps", "3",
        "--optimizer", "sgd", "--lr", "0.5", "--momentum", "0.9", "-o", "out.onnx",
        cwd=work,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "epoch 1: steps 1-3" in r.stdout
    assert "final loss" in r.stdout and "wrote out.onnx" in r.stdout
    session = ort.InferenceSession(str(work / "out.onnx"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((5, SIZES[0])).astype(np.float32)
    (logits,) = session.run(None, {"x": x})
    assert logits.shape == (5, SIZES[-1])
    assert np.all(np.isfinite(logits))
    before, after = params(work / "mlp.onnx"), params(work / "out.onnx")
    assert set(before) == set(after)
    assert all(not np.array_equal(before[k], after[k]) for k in before)


def test_train_with_weights_dir_writes_the_same_model(work):
    common = ("mlp.onnx", "--data", "data.npz", "--batch-size", "8", "--steps", "3",
              "--optimizer", "adam")  # fmt: skip
    plain = dfdl_cli("train", *common, "-o", "plain.onnx", cwd=work)
    assert plain.returncode == 0, plain.stderr
    r = dfdl_cli("train", *common, "--weights-dir", "w", "-o", "out.onnx", cwd=work)
    assert r.returncode == 0, r.stderr
    want, got = params(work / "plain.onnx"), params(work / "out.onnx")
    assert want.keys() == got.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    (run,) = (work / "w").iterdir()
    assert [p.name for p in run.iterdir()] == ["step-3"]


#: a scheduler nobody listens on: a run that fails with another error never reached it
UNREACHABLE = ("--scheduler", "tcp://127.0.0.1:9")


def fails(work, *args: str) -> str:
    """``dfdl train ARGS`` exits with status 2 and one line; returns the line."""
    r = dfdl_cli("train", *args, cwd=work)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dfdl: error: "), r.stderr
    assert "scheduler" not in lines[0]
    return lines[0]


def test_train_npy_data_with_labels_checkpoints_and_resumes(work):
    common = ("--data", "X.npy", "--labels", "y.npy", "--batch-size", "8", "--optimizer", "adam")
    ckpt = ("--checkpoint-dir", "ckpt", "--checkpoint-every", "1")
    r = dfdl_cli(
        "train", "mlp.onnx", *common, *ckpt, "--steps", "2", "--resume-if-any", "-o", "a.onnx",
        cwd=work,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "epoch 1: steps 1-2" in r.stdout  # no checkpoint yet: from step 1
    assert (work / "ckpt" / "latest").is_file()
    r = dfdl_cli(
        "train", "mlp.onnx", *common, *ckpt, "--steps", "3", "--resume", "-o", "b.onnx", cwd=work
    )
    assert r.returncode == 0, r.stderr
    assert "epoch 1: steps 3-3" in r.stdout  # only the step after the checkpoint ran
    assert "trained 1 steps" in r.stdout
    r = dfdl_cli(
        "train", "mlp.onnx", *common, *ckpt, "--steps", "4", "--resume-if-any", "-o", "c.onnx",
        cwd=work,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "epoch 2: steps 4-4" in r.stdout and "trained 1 steps" in r.stdout
    # another batch size: refused before the (unreachable) scheduler is contacted
    other = [*common[:5], "4", *common[6:]]
    line = fails(work, "mlp.onnx", *other, *ckpt, "--resume", *UNREACHABLE, "-o", "d.onnx")
    assert "ckpt/step-000000004.npz was written with batch_size 8; this run has 4" in line
    assert "(--batch-size 8)" in line
    assert not (work / "d.onnx").exists()


def test_checkpoint_flags_and_folders_are_checked_before_any_cluster(work):
    base = ("mlp.onnx", "--data", "data.npz", "-o", "o.onnx", *UNREACHABLE)
    for every in ("0", "-2", "x"):
        line = fails(work, *base, "--checkpoint-dir", "c", "--checkpoint-every", every)
        assert "argument --checkpoint-every:" in line and every in line
    line = fails(work, *base, "--checkpoint-dir", "c", "--resume", "--resume-if-any")
    assert "--resume-if-any: not allowed with argument --resume" in line
    (work / "empty").mkdir()
    line = fails(work, *base, "--checkpoint-dir", "empty", "--resume")
    assert "checkpoint_dir empty holds no checkpoint" in line and "--resume-if-any" in line
    line = fails(work, *base, "--checkpoint-dir", "mlp.onnx", "--checkpoint-every", "1")
    assert "checkpoint_dir mlp.onnx is a file, not a folder" in line
    (work / "escape").mkdir()
    (work / "escape" / "latest").write_text("../data.npz")
    line = fails(work, *base, "--checkpoint-dir", "escape", "--resume-if-any")
    assert "escape/latest names '../data.npz', not a file in escape" in line
    assert not (work / "o.onnx").exists() and not (work / "c").exists()


def test_killed_client_resumes_from_the_latest_checkpoint(work):
    """The client process, its embedded scheduler and workers killed (SIGKILL, the whole
    process group, as when the client's node dies) after a checkpoint: ``--resume``
    finishes the run, with the weights of a run that was never interrupted."""
    common = (
        "mlp.onnx", "--data", "data.npz", "--batch-size", "4", "--optimizer", "adam",
        "--epochs", "40", "--checkpoint-dir", "ckpt-kill", "--checkpoint-every", "5",
    )  # fmt: skip
    r = dfdl_cli("train", *common[:-4], "-o", "whole.onnx", cwd=work)
    assert r.returncode == 0, r.stderr
    proc = subprocess.Popen(
        [sys.executable, "-m", "dfdl", "train", *common, "-o", "killed.onnx"],
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    ckpt = work / "ckpt-kill"
    try:
        deadline = time.monotonic() + 120
        while not checkpoint.find(ckpt) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert checkpoint.find(ckpt), "no checkpoint was written before the kill"
    assert proc.returncode == -signal.SIGKILL, "the run finished before it was killed"
    assert not (work / "killed.onnx").exists()
    r = dfdl_cli("train", *common, "--resume", "-o", "resumed.onnx", cwd=work)
    assert r.returncode == 0, r.stderr
    assert "steps 1-" not in r.stdout  # it started from the checkpoint, not from step 1
    whole, resumed = params(work / "whole.onnx"), params(work / "resumed.onnx")
    assert whole.keys() == resumed.keys()
    for k in whole:
        np.testing.assert_array_equal(resumed[k], whole[k], err_msg=k)


def test_summarize_losses_after_resume():
    text = summarize_losses([3.0, 2.0, 1.0], first_step=2, per_epoch=2)
    assert text.splitlines() == [
        "epoch 2: steps 3-4, mean loss 2.5, last 2",
        "epoch 3: steps 5-5, mean loss 1, last 1",
        "final loss 1 (first 3)",
    ]
