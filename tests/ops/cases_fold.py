"""OpCases for constant-path ops (dfdl/ops/fold.py): Shape, Size, Constant,
ConstantOfShape, Range. They are fold-only: checked against the reference, never tiled."""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from tests.ops.case import OpCase, rand

I64 = np.int64


def _i(*v):
    return np.array(v, dtype=I64)


def _tensor(x):
    return numpy_helper.from_array(np.asarray(x), "value")


def _s(v, dtype):
    return np.array(v, dtype=dtype)


_SHAPE = [
    OpCase("Shape", [rand(5, 7, 4)], id="full"),
    OpCase("Shape", [rand(5, 7, 4)], {"start": 1}, id="start1"),
    OpCase("Shape", [rand(5, 7, 4)], {"end": -1}, id="end_neg"),
    OpCase("Shape", [rand(5, 7, 4)], {"start": -10, "end": 10}, id="clamped"),
    OpCase("Shape", [rand(5, 7, 4)], {"start": 2, "end": 1}, id="empty"),
    OpCase("Shape", [np.array(1.0, np.float32)], id="scalar"),
    OpCase("Size", [rand(5, 7, 4)], id="3d"),
    OpCase("Size", [_i(5, 7)], id="i64_1d"),
    OpCase("Size", [np.array(1.0, np.float32)], id="scalar"),
]

_CONSTANT = [
    OpCase("Constant", [], {"value": _tensor(rand(5, 7))}, id="tensor_f32"),
    OpCase("Constant", [], {"value": _tensor(_i(5, -1))}, id="tensor_i64"),
    OpCase("Constant", [], {"value": _tensor(np.array(3.0))}, id="tensor_f64_scalar"),
    OpCase("Constant", [], {"value_float": 0.5}, id="value_float"),
    OpCase("Constant", [], {"value_floats": [0.5, -1.0, 2.0]}, id="value_floats"),
    OpCase("Constant", [], {"value_int": 7}, id="value_int"),
    OpCase("Constant", [], {"value_ints": [5, 7, -1]}, id="value_ints"),
    OpCase("ConstantOfShape", [_i(5, 7)], consts=(0,), id="default_zero"),
    OpCase(
        "ConstantOfShape",
        [_i(5, 7, 4)],
        {"value": _tensor(np.array([1.5], np.float32))},
        consts=(0,),
        id="f32",
    ),
    OpCase("ConstantOfShape", [_i(3)], {"value": _tensor(_i(-4))}, consts=(0,), id="i64"),
    OpCase(
        "ConstantOfShape",
        [np.zeros(0, I64)],
        {"value": _tensor(np.array([2], np.int32))},
        consts=(0,),
        id="scalar_i32",
    ),
]

_RANGE = [
    OpCase("Range", [_s(0, I64), _s(7, I64), _s(1, I64)], consts=(0, 1, 2), id="i64"),
    OpCase("Range", [_s(10, I64), _s(4, I64), _s(-2, I64)], consts=(0, 1, 2), id="i64_neg"),
    OpCase(
        "Range",
        [_s(10, np.int32), _s(-3, np.int32), _s(-4, np.int32)],
        consts=(0, 1, 2),
        id="i32_uneven",
    ),
    OpCase(
        "Range",
        [_s(1.0, np.float32), _s(5.0, np.float32), _s(0.75, np.float32)],
        consts=(0, 1, 2),
        id="f32",
    ),
    OpCase(
        "Range",
        [_s(0.5, np.float64), _s(-2.0, np.float64), _s(-0.3, np.float64)],
        consts=(0, 1, 2),
        id="f64_neg",
    ),
    OpCase("Range", [_s(3, I64), _s(3, I64), _s(1, I64)], consts=(0, 1, 2), id="empty"),
]

CASES = [*_SHAPE, *_CONSTANT, *_RANGE]
