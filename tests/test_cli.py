"""The ``dfdl`` command line, run as a real subprocess (``python -m dfdl``).

Each training case starts its own embedded cluster (a few seconds); every other case
fails or finishes before any cluster starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import dfdl.models
from dfdl.cli import parse_tiles, summarize_losses
from dfdl.ops import lookup

SIZES = (8, 16, 3)
N = 24


def dfdl_cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m dfdl ARGS`` in ``cwd``; returns the finished process."""
    return subprocess.run(
        [sys.executable, "-m", "dfdl", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def _unsupported_model() -> onnx.ModelProto:
    """x -> Relu -> Unique: a checker-valid model with an op dfdl does not have."""
    assert lookup("Unique") is None, "pick another unsupported op for this test"
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n"])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Unique", ["r"], ["y"], name="unique"),
    ]
    graph = helper.make_graph(nodes, "unsupported", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A folder with mlp.onnx, data.npz (X, y), X.npy, y.npy, bad.onnx, bad.npz, unique.onnx."""
    d = tmp_path_factory.mktemp("cli")
    onnx.save(dfdl.models.mlp(SIZES, seed=1), str(d / "mlp.onnx"))
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N, SIZES[0])).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0.5)
    np.savez(d / "data.npz", X=X, y=y)
    np.save(d / "X.npy", X)
    np.save(d / "y.npy", y)
    (d / "bad.onnx").write_bytes(b"\x08\x07garbage, not an ONNX model\xff\xfe" * 4)
    (d / "bad.npz").write_bytes(b"PK\x03\x04 not a zip archive" * 4)
    onnx.save(_unsupported_model(), str(d / "unique.onnx"))
    return d


def _params(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


# ---- train ---------------------------------------------------------------------------------


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
    before, after = _params(work / "mlp.onnx"), _params(work / "out.onnx")
    assert set(before) == set(after)
    assert all(not np.array_equal(before[k], after[k]) for k in before)


def test_train_npy_data_with_labels_checkpoints_and_resumes(work):
    common = ("--data", "X.npy", "--labels", "y.npy", "--batch-size", "8", "--optimizer", "adam")
    ckpt = ("--checkpoint-dir", "ckpt", "--checkpoint-every", "1")
    r = dfdl_cli("train", "mlp.onnx", *common, *ckpt, "--steps", "2", "-o", "a.onnx", cwd=work)
    assert r.returncode == 0, r.stderr
    assert (work / "ckpt" / "latest").is_file()
    r = dfdl_cli(
        "train", "mlp.onnx", *common, *ckpt, "--steps", "3", "--resume", "-o", "b.onnx", cwd=work
    )
    assert r.returncode == 0, r.stderr
    assert "epoch 1: steps 3-3" in r.stdout  # only the step after the checkpoint ran
    assert "trained 1 steps" in r.stdout


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
    latest = work / "ckpt-kill" / "latest"
    try:
        deadline = time.monotonic() + 120
        while not latest.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert latest.is_file(), "no checkpoint was written before the kill"
    assert proc.returncode == -signal.SIGKILL, "the run finished before it was killed"
    assert not (work / "killed.onnx").exists()
    r = dfdl_cli("train", *common, "--resume", "-o", "resumed.onnx", cwd=work)
    assert r.returncode == 0, r.stderr
    assert "steps 1-" not in r.stdout  # it started from the checkpoint, not from step 1
    whole, resumed = _params(work / "whole.onnx"), _params(work / "resumed.onnx")
    assert whole.keys() == resumed.keys()
    for k in whole:
        np.testing.assert_array_equal(resumed[k], whole[k], err_msg=k)


# ---- help, version -------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["", "train", "plan", "export-training-graph", "info"])
def test_help(work, command):
    r = dfdl_cli(*([command] if command else []), "--help", cwd=work)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: dfdl {command}".rstrip())
    if not command:
        for sub in ("train", "plan", "export-training-graph", "info"):
            assert sub in r.stdout


def test_version(work):
    r = dfdl_cli("--version", cwd=work)
    assert r.returncode == 0
    assert r.stdout.strip() == f"dfdl {dfdl.__version__}"


# ---- info, plan, export --------------------------------------------------------------------


def test_info_lists_supported_ops_and_parameters(work):
    r = dfdl_cli("info", "mlp.onnx", cwd=work)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    gemm = next(line for line in lines if line.split()[:1] == ["Gemm"])
    relu = next(line for line in lines if line.split()[:1] == ["Relu"])
    assert gemm.split()[1:] == ["2", "supported"]
    assert relu.split()[1:] == ["1", "supported"]
    assert "x  float32  [batch, 8]" in r.stdout
    assert "logits  float32  [batch, 3]" in r.stdout
    n_params = 8 * 16 + 16 + 16 * 3 + 3
    assert f"parameters: {n_params} values in 4 initializers, {n_params * 4} B" in r.stdout
    assert lines[-1] == "every op is supported"


def test_info_flags_an_unsupported_op(work):
    r = dfdl_cli("info", "unique.onnx", cwd=work)
    assert r.returncode == 0, r.stderr
    unique = next(line for line in r.stdout.splitlines() if line.split()[:1] == ["Unique"])
    assert "NOT SUPPORTED" in unique
    assert r.stdout.splitlines()[-1] == "unsupported ops: Unique"


@pytest.mark.parametrize("training", [False, True])
def test_plan_prints_the_tensors(work, training):
    r = dfdl_cli(
        "plan", "mlp.onnx", "--batch-size", "16", "--workers", "2",
        *(["--training", "--optimizer", "adamw"] if training else []),
        cwd=work,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "tasks" in r.stdout.splitlines()[1 if training else 0]
    table = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.strip()}
    assert table["x"][1:3] == ["[16,", "8]"]
    for name in ("layers.0.weight", "layers.1.bias", "logits"):
        assert name in table
    assert ("labels" in table) == training
    assert ("layers.0.weight.exp_avg" in table) == training


def test_plan_under_a_memory_limit_names_it(work):
    r = dfdl_cli(
        "plan", "mlp.onnx", "--batch-size", "16", "--training", "--memory-limit", "1GiB",
        "--workers", "2",
        cwd=work,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "worker memory limit 1.0 GiB" in r.stdout
    # Dask's process thresholds are on by default: the worker's own footprint counts
    assert "with the worker process's own 224.0 MiB" in r.stdout


def test_a_limit_below_the_worker_footprint_names_the_smallest(work):
    r = dfdl_cli(
        "plan", "mlp.onnx", "--batch-size", "16", "--training", "--memory-limit", "256MiB",
        cwd=work,
    )  # fmt: skip
    assert r.returncode == 2
    assert "a worker process takes about 224.0 MiB of its own" in r.stderr
    assert "Give each worker at least 449.0 MiB" in r.stderr
    # with the footprint set to an idle worker's measured memory, 256 MiB plans
    env = {**os.environ, "DASK_DFDL__MEMORY__WORKER_FOOTPRINT": "64MiB"}
    r = dfdl_cli(
        "plan", "mlp.onnx", "--batch-size", "16", "--training", "--memory-limit", "256MiB",
        cwd=work, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr


def test_plan_with_recompute_estimates_less_memory(work):
    onnx.save(dfdl.models.mlp((8, *[64] * 8, 3)), str(work / "deep.onnx"))
    common = ("plan", "deep.onnx", "--batch-size", "64", "--training", "--workers", "2")
    plain = dfdl_cli(*common, cwd=work)
    rc = dfdl_cli(*common, "--recompute", cwd=work)
    assert plain.returncode == 0 and rc.returncode == 0, (plain.stderr, rc.stderr)
    assert "recompute: 3 segment(s), 11 forward node(s) run again" in rc.stdout

    def working_set_kib(out: str) -> float:
        (line,) = [x for x in out.splitlines() if x.startswith("working set: ")]
        number, unit = line.split()[2:4]
        assert unit == "KiB", line
        return float(number)

    # activations are 64 x 64 float32 (16 KiB): some are no longer kept through the step
    saved = working_set_kib(plain.stdout) - working_set_kib(rc.stdout)
    assert saved > 0 and saved % 16 == 0
    assert "layers.0.recompute" in rc.stdout and "layers.0.recompute" not in plain.stdout


def test_export_training_graph(work):
    r = dfdl_cli(
        "export-training-graph", "mlp.onnx", "-o", "train.onnx", "--batch-size", "4",
        "--optimizer", "sgd", "--momentum", "0.9",
        cwd=work,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    m = onnx.load(str(work / "train.onnx"))
    onnx.checker.check_model(m)
    ops = {(n.domain, n.op_type) for n in m.graph.node}
    assert ("dfdl", "SGDUpdate") in ops
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in m.graph.input}
    assert shapes["x"] == [4, SIZES[0]]
    assert shapes["labels"] == [4]


# ---- errors --------------------------------------------------------------------------------

ERRORS = {
    "missing model": ("info", "missing.onnx"),
    "missing model (train)": ("train", "missing.onnx", "--data", "data.npz", "-o", "o.onnx"),
    "missing data": ("train", "mlp.onnx", "--data", "missing.npz", "-o", "o.onnx"),
    "garbage model": ("info", "bad.onnx"),
    "garbage model (train)": ("train", "bad.onnx", "--data", "data.npz", "-o", "o.onnx"),
    "garbage data": ("train", "mlp.onnx", "--data", "bad.npz", "-o", "o.onnx"),
    "unsupported op (plan)": ("plan", "unique.onnx", "--batch-size", "2"),
    "symbolic batch without --batch-size": ("plan", "mlp.onnx"),
    "unknown flag": ("train", "mlp.onnx", "--data", "data.npz", "-o", "o.onnx", "--bogus"),
    "missing flag": ("train", "mlp.onnx", "-o", "o.onnx"),
    "bad flag value": ("plan", "mlp.onnx", "--tiles", "rows=3"),
    "bad number": ("train", "mlp.onnx", "--data", "data.npz", "-o", "o.onnx", "--lr", "fast"),
    "bad hyperparameter": ("train", "mlp.onnx", "--data", "data.npz", "-o", "o.onnx", "--lr=-1"),
    "unknown command": ("fit", "mlp.onnx"),
    "output folder missing": ("train", "mlp.onnx", "--data", "data.npz", "-o", "no/o.onnx"),
    "unknown loss": ("export-training-graph", "mlp.onnx", "-o", "t.onnx", "--loss", "hinge"),
    "bad memory limit": ("plan", "mlp.onnx", "--batch-size", "4", "--memory-limit", "lots"),
    "recompute without training": ("plan", "mlp.onnx", "--batch-size", "4", "--recompute"),
    "bad memory mode": ("train", "mlp.onnx", "--data", "data.npz", "-o", "o.onnx", "--memory", "x"),
    "memory limit too small": (
        "plan",
        "mlp.onnx",
        "--batch-size",
        "4",
        "--training",
        "--memory-limit",
        "16B",
    ),
}


@pytest.mark.parametrize("args", list(ERRORS.values()), ids=list(ERRORS))
def test_errors_are_one_line(work, args):
    r = dfdl_cli(*args, cwd=work)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("dfdl: error: ")
    assert not (work / "o.onnx").exists()


def test_error_messages_name_the_problem(work):
    r = dfdl_cli("info", "missing.onnx", cwd=work)
    assert "missing.onnx does not exist" in r.stderr
    r = dfdl_cli("plan", "unique.onnx", "--batch-size", "2", cwd=work)
    assert "Unique" in r.stderr
    r = dfdl_cli("train", "mlp.onnx", "--data", "data.npz", "-o", "o.onnx", "--bogus", cwd=work)
    assert "--bogus" in r.stderr
    r = dfdl_cli("plan", "mlp.onnx", cwd=work)
    assert "give --batch-size N" in r.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback(work, where):
    args = ["info", "bad.onnx"]
    args = ["--debug", *args] if where == "before" else [*args, "--debug"]
    r = dfdl_cli(*args, cwd=work)
    assert r.returncode not in (0, 2)
    assert "Traceback (most recent call last)" in r.stderr
    assert "ModelError" in r.stderr


# ---- helpers, in process -------------------------------------------------------------------


def test_parse_tiles():
    assert parse_tiles("batch=2,model=1") == {"batch": 2, "model": 1}
    assert parse_tiles("batch=1,space=4") == {"batch": 1, "space": 4}
    assert parse_tiles("uneven") == "uneven"
    assert parse_tiles("auto") is None


def test_summarize_losses_after_resume():
    text = summarize_losses([3.0, 2.0, 1.0], first_step=2, per_epoch=2)
    assert text.splitlines() == [
        "epoch 2: steps 3-4, mean loss 2.5, last 2",
        "epoch 3: steps 5-5, mean loss 1, last 1",
        "final loss 1 (first 3)",
    ]
