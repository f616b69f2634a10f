"""Indexing ops (dfdl/ops/indexing.py): the errors of their shape rules and forwards, and
the tile specs that keep indexed axes whole. Their values are checked case by case in
tests/ops/cases_indexing.py."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import dfdl
from dfdl.errors import DfdlError, ModelError, ShapeError
from dfdl.ir.bind import bind
from dfdl.ops import REGISTRY
from dfdl.ops.registry import TensorType, TileContext
from tests.ir.helpers import make_model, vi


def _t(*shape, dtype=np.float32) -> TensorType:
    return TensorType(shape, dtype)


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "message"),
    [
        ("GatherElements", [_t(5, 4), _t(5, 4, 1, dtype=np.int64)], {}, "rank 3 != data rank 2"),
        ("GatherElements", [_t(5, 4), _t(3, 6, dtype=np.int64)], {}, r"exceeds .* on axis 1"),
        ("GatherElements", [_t(5, 4), _t(5, 4)], {}, "int32 or int64, not float32"),
        ("GatherElements", [_t(5, 4), _t(5, 4, dtype=np.int64)], {"axis": 2}, "axis 2 is out"),
        ("GatherND", [_t(5, 4), _t(3, 3, dtype=np.int64)], {}, r"last dim 3 must be in \[1, 2\]"),
        ("GatherND", [_t(5, 4), _t(3, 2, dtype=np.int32)], {}, "must be int64, not int32"),
        (
            "GatherND",
            [_t(5, 4, 3), _t(4, 1, dtype=np.int64)],
            {"batch_dims": 1},
            "batch dims of indices",
        ),
        ("GatherND", [_t(5, 4), _t(5, 1, dtype=np.int64)], {"batch_dims": 2}, "batch_dims 2"),
        (
            "ScatterElements",
            [_t(5, 4), _t(2, 4, dtype=np.int64), _t(2, 3)],
            {},
            r"updates shape \[2, 3\] != indices \[2, 4\]",
        ),
        (
            "ScatterElements",
            [_t(5, 4), _t(2, 4, dtype=np.int64), _t(2, 4, dtype=np.float64)],
            {},
            "updates dtype float64 != data dtype float32",
        ),
        (
            "ScatterND",
            [_t(5, 4, 3), _t(2, 1, dtype=np.int64), _t(2, 4)],
            {},
            r"updates shape \[2, 4\] != \[2, 4, 3\]",
        ),
        ("ScatterND", [_t(5, 4), _t(2, 3, dtype=np.int64), _t(2)], {}, "exceeds data rank 2"),
    ],
)
def test_shape_rule_errors(op, inputs, attrs, message):
    # ShapeError for shapes, ModelError for attributes and index dtypes
    with pytest.raises(DfdlError, match=message):
        REGISTRY[op].shape(inputs, [None] * len(inputs), **attrs)


@pytest.mark.parametrize("op", ["ScatterElements", "ScatterND"])
def test_unknown_reduction_is_refused(op):
    data, idx, upd = _t(5, 4), _t(2, 2, dtype=np.int64), _t(2)
    if op == "ScatterElements":
        idx, upd = _t(2, 4, dtype=np.int64), _t(2, 4)
    with pytest.raises(ModelError, match="reduction 'sum' is not one of"):
        REGISTRY[op].shape([data, idx, upd], [None] * 3, reduction="sum")


def test_index_out_of_range_at_run_time():
    data = np.zeros((5, 4), np.float32)
    with pytest.raises(IndexError, match="index 5 is out of range"):
        REGISTRY["GatherElements"].forward(data, np.full((2, 4), 5, np.int64))
    with pytest.raises(IndexError, match="index -6 is out of range"):
        REGISTRY["GatherND"].forward(data, np.array([[-6, 0]], np.int64))
    with pytest.raises(IndexError, match=r"index 4 is out of range for axis size\(s\) \[5, 4\]"):
        REGISTRY["ScatterND"].forward(data, np.array([[0, 4]], np.int64), np.ones(1, np.float32))


def test_constant_indices_out_of_range_fail_at_plan_time():
    """Indices stored in the model are checked when the graph is bound, naming the node."""
    node = helper.make_node("GatherElements", ["x", "idx"], ["y"], name="pick", axis=1)
    model = make_model(
        [node], [vi("x", [5, 4])], [vi("y", [5, 2])], {"idx": np.full((5, 2), 4, np.int64)}
    )
    graph = dfdl.load(model)
    with pytest.raises(ShapeError, match="'pick'.*index 4 is out of range for axis size"):
        bind(graph, {"x": TensorType((5, 4), np.float32)})


def _spec(op, inputs, attrs):
    outs = REGISTRY[op].shape(inputs, [None] * len(inputs), **attrs)
    ctx = TileContext(tuple(inputs), tuple(outs), (None,) * len(inputs), attrs)
    return REGISTRY[op].tile(ctx)


def test_tile_specs_keep_indexed_axes_whole():
    # GatherElements: the gathered axis of data whole; an axis where indices are shorter
    # than data whole too; equal axes tiled alike
    s = _spec("GatherElements", [_t(5, 7, 4), _t(5, 9, 2, dtype=np.int64)], {"axis": 1})
    assert s.inputs == ("a..", "ad.") and s.outputs == ("ad.",)
    # GatherND: batch and trailing axes tiled, indexed axes and index tuples whole
    s = _spec("GatherND", [_t(5, 4, 3, 6), _t(5, 2, 2, dtype=np.int64)], {"batch_dims": 1})
    assert s.inputs == ("a..d", "ae.") and s.outputs == ("aed",)
    # ScatterND: only data's trailing axes are tiled
    s = _spec("ScatterND", [_t(6, 5, 4), _t(3, 1, dtype=np.int64), _t(3, 5, 4)], {})
    assert s.inputs == (".bc", "..", ".bc") and s.outputs == (".bc",)
    # gradients: the index axes are contracted (summed)
    s = _spec(
        "dfdl.GatherNDGrad",
        [_t(5, 2, 6), _t(5, 2, 2, dtype=np.int64)],
        {"batch_dims": 1, "data_shape": [5, 4, 3, 6]},
    )
    assert s.outputs == ("a..d",) and dict(s.reduce) == {"e": "sum"}
