"""OpCases for reductions (dfdl/ops/reduce.py): ReduceMean, ReduceSum, ReduceMax, ArgMax."""

from __future__ import annotations

import numpy as np

from tests.ops.case import OpCase, rand

F64, I64 = np.float64, np.int64


def _ints(*shape, dtype=np.int64, low=-9, high=10, seed=0):
    return np.random.default_rng(seed + sum(shape)).integers(low, high, size=shape).astype(dtype)


def _axes(*a):
    return np.array(a, dtype=I64)


def _reduce(op: str, int_data: bool = True) -> list[OpCase]:
    """Axes/keepdims/noop combinations shared by ReduceMean, ReduceSum, ReduceMax."""
    x = rand(5, 7, 4)
    cases = [
        OpCase(op, [x, _axes(1)], consts=(1,), id="axis1_keep"),
        OpCase(op, [x, _axes(1)], {"keepdims": 0}, consts=(1,), id="axis1_nokeep"),
        OpCase(op, [x, _axes(0)], consts=(1,), id="batch_keep"),
        OpCase(op, [x, _axes(0, 2)], {"keepdims": 0}, consts=(1,), id="axes02_nokeep"),
        OpCase(op, [x, _axes(-1, -3)], consts=(1,), id="neg_axes"),
        OpCase(op, [x], id="all_keep"),
        OpCase(op, [x], {"keepdims": 0}, id="all_nokeep"),
        OpCase(op, [x, _axes()], consts=(1,), id="empty_axes_all"),
        OpCase(op, [x, _axes()], {"noop_with_empty_axes": 1}, consts=(1,), id="empty_axes_noop"),
        OpCase(op, [x], {"noop_with_empty_axes": 1, "keepdims": 0}, id="no_axes_noop"),
        OpCase(op, [rand(5, 7, 3, 3, dtype=F64), _axes(2, 3)], consts=(1,), id="f64_spatial"),
        OpCase(op, [rand(11), _axes(0)], {"keepdims": 0}, consts=(1,), id="1d"),
    ]
    if int_data:
        cases += [
            OpCase(op, [_ints(5, 7), _axes(1)], consts=(1,), id="i64"),
            OpCase(
                op,
                [_ints(5, 7, 3, dtype=np.int32), _axes(0, 1)],
                {"keepdims": 0},
                consts=(1,),
                id="i32",
            ),
        ]
    return cases


def _argmax() -> list[OpCase]:
    ties = _ints(5, 7, 3, low=0, high=3)  # many repeated maxima
    x = rand(5, 7, 4)
    cases = []
    for keep in (0, 1):
        for last in (0, 1):
            tag = f"k{keep}_l{last}"
            attrs = {"keepdims": keep, "select_last_index": last}
            cases += [
                OpCase("ArgMax", [ties], {"axis": 1, **attrs}, id=f"ties_axis1_{tag}"),
                OpCase("ArgMax", [ties], {"axis": -1, **attrs}, id=f"ties_neg_{tag}"),
                OpCase("ArgMax", [x], attrs, id=f"f32_default_{tag}"),
            ]
    cases += [
        OpCase("ArgMax", [rand(5, 7, dtype=F64)], {"axis": 1}, id="f64"),
        OpCase("ArgMax", [rand(11)], {"keepdims": 0}, id="1d"),
    ]
    return cases


CASES = [
    *_reduce("ReduceSum"),
    *_reduce("ReduceMax"),
    *_reduce("ReduceMean", int_data=False),
    *_argmax(),
]
