"""``dfdl train --gpus N``: refused in one line, before anything is loaded, where it cannot
start (no such GPUs here, another cluster given, N < 1). Training on GPUs runs in
tests/gpu."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dfdl.runtime.cluster import visible_gpus


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--gpus", "0"], "--gpus 0: give at least 1"),
        (["--gpus", "1", "--scheduler", "tcp://127.0.0.1:9"], "--gpus starts a cluster"),
        (["--gpus", "1", "--slurm", "jobs=1,cores=1,memory=1GiB"], "(gpus=N)"),
        (["--device-memory-limit", "2GiB"], "give --gpus N too"),
        (["--gpus", "1", "--device-memory-limit", "lots"], "--device-memory-limit must be"),
        pytest.param(
            ["--gpus", "1"],
            "this machine has 0 NVIDIA GPU",
            marks=pytest.mark.skipif(bool(visible_gpus()), reason="this machine has a GPU"),
        ),
    ],
)
def test_gpus_that_cannot_be_had_are_one_line_before_loading(work, extra, fragment):
    # the data file does not exist: a check made after loading would name it instead
    args = ["train", "mlp.onnx", "--data", "missing.npz", "-o", "o.onnx", *extra]
    done = subprocess.run(
        [sys.executable, "-m", "dfdl", *args], cwd=work, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and fragment in lines[0], done.stderr
    assert not (work / "o.onnx").exists()
