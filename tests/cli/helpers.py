"""What the ``dfdl`` command-line tests share: running ``python -m dfdl`` and the files
of the ``work`` fixture (``conftest.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

import dfdl.models
from dfdl.ops import lookup

#: the MLP's layer sizes: 8 features in, 16 hidden, 3 classes
SIZES = (8, 16, 3)
#: samples in data.npz and X.npy
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


def unsupported_model() -> onnx.ModelProto:
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


def write_work_files(d: Path) -> Path:
    """Write mlp.onnx, data.npz (X, y), X.npy, y.npy, bad.onnx, bad.npz and unique.onnx
    into ``d``; returns ``d``."""
    onnx.save(dfdl.models.mlp(SIZES, seed=1), str(d / "mlp.onnx"))
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N, SIZES[0])).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0.5)
    np.savez(d / "data.npz", X=X, y=y)
    np.save(d / "X.npy", X)
    np.save(d / "y.npy", y)
    (d / "bad.onnx").write_bytes(b"\x08\x07garbage, not an ONNX model\xff\xfe" * 4)
    (d / "bad.npz").write_bytes(b"PK\x03\x04 not a zip archive" * 4)
    onnx.save(unsupported_model(), str(d / "unique.onnx"))
    return d


def params(path: Path) -> dict[str, np.ndarray]:
    """The initializers of the ONNX file at ``path``, by name."""
    model = onnx.load(str(path))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
