"""OpCases for the mask, position and label ops (dfdl/ops/masks.py): Trilu, CumSum,
OneHot."""

from __future__ import annotations

import numpy as np

from tests.ops.case import OpCase, rand

F64, I32, I64 = np.float64, np.int32, np.int64


def _ints(*shape, dtype=I64, low=-9, high=10, seed=0):
    return np.random.default_rng(seed + sum(shape)).integers(low, high, size=shape).astype(dtype)


def _k(v, dtype=I64):
    return np.array(v, dtype=dtype)


def _trilu() -> list[OpCase]:
    T = "Trilu"
    x = rand(5, 7, 6)
    cases = []
    for upper in (0, 1):
        u = {"upper": upper}
        name = "triu" if upper else "tril"
        cases += [
            OpCase(T, [x, _k(0)], u, consts=(1,), id=f"{name}_k0"),
            OpCase(T, [x, _k(2)], u, consts=(1,), id=f"{name}_k2"),
            OpCase(T, [x, _k(-3)], u, consts=(1,), id=f"{name}_kneg"),
            OpCase(T, [x, _k(9)], u, consts=(1,), id=f"{name}_k_past_end"),
            OpCase(T, [x], u, id=f"{name}_no_k"),
            OpCase(T, [rand(3, 2, 7, 5, dtype=F64), _k(1)], u, consts=(1,), id=f"{name}_4d_f64"),
        ]
    return cases + [
        OpCase(T, [rand(7, 7)], id="square_default"),
        OpCase(T, [np.ones((6, 6), np.bool_), _k(1)], consts=(1,), id="causal_mask_bool"),
        OpCase(T, [_ints(6, 8), _k(-1)], {"upper": 0}, consts=(1,), id="i64_lower"),
        OpCase(T, [rand(1, 9), _k(3)], consts=(1,), id="one_row"),
    ]


def _cumsum() -> list[OpCase]:
    C = "CumSum"
    x = rand(5, 7, 4)
    cases = []
    for excl in (0, 1):
        for rev in (0, 1):
            a = {"exclusive": excl, "reverse": rev}
            tag = f"e{excl}r{rev}"
            cases += [
                OpCase(C, [x, _k(1)], a, consts=(1,), id=f"axis1_{tag}"),
                OpCase(C, [rand(11, dtype=F64), _k(0, I32)], a, consts=(1,), id=f"1d_f64_{tag}"),
            ]
    return cases + [
        OpCase(C, [x, _k(0)], consts=(1,), id="batch_axis"),
        OpCase(C, [x, _k(-1)], consts=(1,), id="neg_axis"),
        OpCase(C, [_ints(5, 7), _k(1)], consts=(1,), id="i64_position_ids"),
        OpCase(C, [_ints(5, 7, dtype=I32), _k(-1)], {"exclusive": 1}, consts=(1,), id="i32"),
    ]


def _onehot() -> list[OpCase]:
    O = "OneHot"
    idx = _ints(5, 7, low=-4, high=10)  # some out of [-depth, depth)
    vals = np.array([0.0, 1.0], np.float32)
    return [
        OpCase(O, [idx, _k(6), vals], consts=(1, 2), id="last_axis"),
        OpCase(O, [idx, _k(6), vals], {"axis": 0}, consts=(1, 2), id="axis0"),
        OpCase(O, [idx, _k(6), vals], {"axis": 1}, consts=(1, 2), id="axis1"),
        OpCase(O, [idx, _k(6), vals], {"axis": -2}, consts=(1, 2), id="neg_axis"),
        OpCase(
            O,
            [idx.astype(I32), np.array(7.0, np.float32), np.array([-2.0, 3.5], F64)],
            consts=(1, 2),
            id="i32_float_depth_f64",
        ),
        OpCase(
            O,
            [np.array([1, 0, 2, -1]), _k([3]), _k([5, 9])],
            consts=(1, 2),
            id="i64_values_depth_1d",
            # onnx's reference evaluator takes depth as a scalar only: ask it with one
            reference=lambda i, d, v: OpCase(O, [i, d.reshape(()), v], consts=(1, 2)).expected(),
        ),
        OpCase(O, [np.array(2, I64), _k(4), vals], consts=(1, 2), id="scalar_index"),
    ]


CASES = [*_trilu(), *_cumsum(), *_onehot()]
