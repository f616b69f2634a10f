"""Which initializers train: dfdl.training.graph.build_training_graph."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dfdl
from dfdl.errors import ConfigError
from dfdl.ir.onnx_io import to_ir
from dfdl.ops.registry import TensorType
from dfdl.training.graph import build_training_graph


def _relu6_model(bound_names=("lo", "hi")):
    """x @ w, then Clip(., lo, hi) with the bounds as float initializers (how torch's
    exporter writes ReLU6), then a slope-like ``s`` multiplied in."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(np.asarray(0.0, np.float32), bound_names[0]),
        numpy_helper.from_array(np.asarray(6.0, np.float32), bound_names[1]),
        numpy_helper.from_array(np.asarray([0.5], np.float32), "s"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Clip", ["h", *bound_names], ["c"]),
        helper.make_node("Mul", ["c", "s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "relu6",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 3])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _params(model, **kw):
    tg = build_training_graph(
        to_ir(model),
        {"x": TensorType((8, 4), np.float32)},
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=0.1),
        labels=TensorType((8,), np.int64),
        **kw,
    )
    return tg.params


def test_clip_bounds_are_not_trained():
    # ONNX's schema marks Clip's min and max non-differentiable: PyTorch's ReLU6 keeps 6
    assert _params(_relu6_model()) == ["w", "s"]


def test_a_bound_also_read_as_data_trains():
    model = _relu6_model(bound_names=("lo", "s"))  # s is a bound and a factor
    assert set(_params(model)) == {"w", "s"}


def test_frozen_still_applies():
    assert _params(_relu6_model(), frozen=["s"]) == ["w"]


def test_unknown_frozen_name_is_an_error():
    with pytest.raises(ConfigError, match="not initializers"):
        _params(_relu6_model(), frozen=["nope"])
