"""dfdl.ir.canonical.untie_running_statistics: BatchNorm running statistics that an
exporter aliased to other initializers get their own copies at load; and
tied_initializers, the float initializers read under other names (which train as one)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dfdl
from dfdl.errors import ModelError
from dfdl.ir.canonical import tied_initializers
from dfdl.ir.graph import Graph, Node
from dfdl.ir.onnx_io import to_ir
from dfdl.ops.registry import TensorType
from dfdl.training.graph import build_training_graph


def _batch_norm_model(mean_from: str) -> object:
    """x -> BatchNormalization(scale s, bias b, mean m, var v) -> y, where ``m`` is
    ``mean_from``: "Identity" of the bias (what TorchScript's exporter writes for a fresh
    BatchNorm) or "Add" of the bias to itself (computed)."""
    inits = [
        numpy_helper.from_array(np.ones(3, np.float32), "s"),
        numpy_helper.from_array(np.zeros(3, np.float32), "b"),
        numpy_helper.from_array(np.ones(3, np.float32), "v"),
    ]
    make_mean = (
        helper.make_node("Identity", ["b"], ["m"], name="alias")
        if mean_from == "Identity"
        else helper.make_node("Add", ["b", "b"], ["m"], name="computed")
    )
    nodes = [
        make_mean,
        helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn"),
    ]
    graph = helper.make_graph(
        nodes,
        "bn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _train_graph(model):
    return build_training_graph(
        to_ir(model),
        {"x": TensorType((4, 3), np.float32)},
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=0.1),
        labels=TensorType((4,), np.int64),
    )


def test_an_aliased_running_mean_becomes_its_own_initializer():
    g = to_ir(_batch_norm_model("Identity"))
    assert [n.op_type for n in g.nodes] == ["BatchNormalization"]
    np.testing.assert_array_equal(g.initializers["m"], np.zeros(3, np.float32))
    assert not np.shares_memory(g.initializers["m"], g.initializers["b"])
    tg = _train_graph(_batch_norm_model("Identity"))
    assert tg.params == ["s", "b"]  # the bias trains; the running mean is a statistic


def test_a_computed_running_mean_cannot_train_and_the_error_names_the_node():
    g = to_ir(_batch_norm_model("Add"))
    assert [n.op_type for n in g.nodes] == ["Add", "BatchNormalization"]  # inference runs
    with pytest.raises(ModelError, match="'bn'.*running statistic 'm'"):
        _train_graph(_batch_norm_model("Add"))


def test_tied_initializers_follow_identity_chains_to_float_initializers():
    g = Graph(
        name="g",
        inputs=["x"],
        outputs=["b", "c", "s", "z"],
        nodes=[
            Node("i1", "Identity", ["a"], ["b"]),
            Node("i2", "Identity", ["b"], ["c"]),
            Node("i3", "Identity", ["shape"], ["s"]),  # an integer initializer: no tie
            Node("i4", "Identity", ["x"], ["z"]),  # data
        ],
    )
    g.initializers.update(a=np.ones(2, np.float32), shape=np.array([2], np.int64))
    assert tied_initializers(g) == {"b": "a", "c": "a"}
    g.constants = frozenset({"a"})  # a constant the exporter marked: it does not train
    assert tied_initializers(g) == {}
