"""``bench/train_large.py`` at a small size: the Gemm chain trains on the embedded
cluster in step with its numpy reference, saves, and runs in onnxruntime (the benchmark
runs it at 2.5 GiB; its figures are in ``bench/reference/train-large-*.json``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "train_large.py"


def test_train_large_small_agrees_with_numpy(tmp_path):
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--gib", "0.02", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = json.loads(out.read_text())
    assert figures["ok"] is True
    assert len(figures["losses"]) == 2  # 8 samples, batch 4, one epoch
    assert figures["loss_rel_err"] < 1e-4 and figures["weight_rel_err"] < 1e-5
    assert figures["ort_rel_err"] < 1e-4 and figures["saved_vs_result"] == 0.0
    # training moved the loss: the two steps' losses differ from each other
    assert figures["losses"][0] != figures["losses"][1]


def test_train_large_from_the_file_with_weights_dir_agrees_with_numpy(tmp_path):
    """``--weights-dir``: the model written by a child process, trained from the file on
    two workers with ``weights_dir``, checked by another child process."""
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--gib", "0.03", "--weights-dir", "--worker-memory",
         "600MiB", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = json.loads(out.read_text())
    assert figures["ok"] is True and figures["mode"] == "weights_dir"
    assert len(figures["losses"]) == 2 and figures["losses"][0] != figures["losses"][1]
    assert figures["loss_rel_err"] < 1e-4 and figures["weight_rel_err"] < 1e-5
    assert figures["ort_rel_err"] < 1e-4 and figures["saved_vs_result"] == 0.0
    assert figures["files"]["trained.onnx.data"] == figures["weights_bytes"]
