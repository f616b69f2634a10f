"""Upsample (opsets 7 and 9) and Resize-10 keep onnxruntime's meaning through the opset
conversion at load (:func:`dfdl.ir.canonical.complete_conversion`): samples at
``i / scale``, nearest rounded down when upsampling and up when downsampling."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dfdl
from dfdl.errors import ModelError

ort = pytest.importorskip("onnxruntime")


def _model(op: str, opset: int, mode: str, scales: list[float], shape, *, attr=False):
    if attr:  # Upsample-7: scales as an attribute
        node, inits = helper.make_node(op, ["x"], ["y"], mode=mode, scales=scales), []
    else:
        node = helper.make_node(op, ["x", "s"], ["y"], mode=mode)
        inits = [helper.make_tensor("s", TensorProto.FLOAT, [len(scales)], scales)]
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 3 if opset < 9 else 7
    return onnx.shape_inference.infer_shapes(model)


@pytest.mark.parametrize(
    "op, opset, mode, scales, attr",
    [
        ("Upsample", 9, "linear", [1, 1, 2, 2.5], False),
        ("Upsample", 9, "nearest", [1, 1, 2, 2.5], False),
        ("Upsample", 7, "linear", [1, 1, 1.5, 3], True),
        ("Upsample", 7, "nearest", [1, 1, 1.5, 3], True),
        ("Resize", 10, "linear", [1, 1, 2, 0.8], False),
        ("Resize", 10, "nearest", [1, 1, 1.7, 2], False),
        ("Resize", 10, "nearest", [1, 1, 0.6, 0.8], False),
    ],
)
def test_old_resizes_match_onnxruntime(op, opset, mode, scales, attr, client):
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5) ** 1.5
    model = _model(op, opset, mode, scales, list(x.shape), attr=attr)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x})[0]
    for tiles in (None, "uneven"):
        got = dfdl.run(model, {"x": x}, client=client, tiles=tiles)["y"]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


def test_resize10_nearest_up_and_down_is_refused():
    model = _model("Resize", 10, "nearest", [1, 1, 2, 0.5], [1, 1, 4, 4])
    with pytest.raises(ModelError, match="up along some axes and down along others"):
        dfdl.load(model)
