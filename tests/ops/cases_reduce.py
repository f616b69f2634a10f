"""OpCases for reductions (dfdl/ops/reduce.py): ReduceMean, ReduceSum, ReduceMax, ArgMax,
ReduceMin, ReduceProd, ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum, ReduceLogSumExp
and dfdl.ReduceProdGrad."""

from __future__ import annotations

import numpy as np

from tests.ops.case import OpCase, rand

F16, F32, F64, I64 = np.float16, np.float32, np.float64, np.int64
#: float16 sums round at every step in the reference, in float32 here
F16_TOL = {"rtol": 5e-3, "atol": 2e-3}


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


def _more(op: str, *, low=-2.0, ints=(np.int64, np.int32), f16=True) -> list[OpCase]:
    """The newer reductions: the axes/keepdims/noop combinations that matter, float16,
    integers and an empty reduced axis."""
    x = rand(5, 7, 4, low=low)
    cases = [
        OpCase(op, [x, _axes(1)], consts=(1,), id="axis1_keep"),
        OpCase(op, [x, _axes(0, 2)], {"keepdims": 0}, consts=(1,), id="axes02_nokeep"),
        OpCase(op, [x, _axes(-1, -3)], consts=(1,), id="neg_axes"),
        OpCase(op, [x], {"keepdims": 0}, id="all_nokeep"),
        OpCase(op, [x, _axes()], {"noop_with_empty_axes": 1}, consts=(1,), id="empty_axes_noop"),
        OpCase(
            op,
            [rand(5, 7, 3, 3, dtype=F64, low=low), _axes(2, 3)],
            {"keepdims": 0},
            consts=(1,),
            id="f64_spatial",
        ),
        OpCase(op, [np.zeros((3, 0, 4), F32), _axes(1)], consts=(1,), id="empty_set"),
    ]
    if f16:
        cases.append(
            OpCase(
                op, [rand(5, 7, 4, dtype=F16, low=low), _axes(1)], consts=(1,), id="f16", **F16_TOL
            )
        )
    for dt in ints:
        cases.append(
            OpCase(
                op,
                [_ints(5, 7, 3, dtype=dt, low=-3, high=4), _axes(1)],
                {"keepdims": 0},
                consts=(1,),
                id=np.dtype(dt).name,
            )
        )
    return cases


def _with_zeros() -> np.ndarray:
    """Data whose axis-1 groups hold no, one or two zeros."""
    x = rand(5, 7, 4, seed=3)
    x[1, 2, :] = 0
    x[3, 1:3, 0] = 0
    x[4, :, 1] = 0
    return x


def _prod_grad_ref(axes):
    def ref(dY, X):
        # the product of the other factors, multiplied out one element at a time
        x = X.astype(np.float64)
        out = np.empty_like(x)
        for idx in np.ndindex(x.shape):
            group = tuple(slice(None) if a in axes else i for a, i in enumerate(idx))
            mask = np.zeros(x.shape, bool)
            mask[group] = True
            mask[idx] = False
            dy = dY[tuple(0 if a in axes else i for a, i in enumerate(idx))]
            out[idx] = dy * np.prod(x[mask])
        return [out.astype(X.dtype)]

    return ref


_MIN_EXTRA = [
    OpCase(
        "ReduceMin",
        [_ints(4, 5, seed=2, low=0, high=2).astype(bool), _axes(1)],
        consts=(1,),
        id="bool",
    ),
    OpCase("ReduceMin", [_ints(4, 5, 3, dtype=np.int8), _axes(0, 2)], consts=(1,), id="int8"),
    OpCase(
        "ReduceMin",
        [_ints(4, 5, 3, dtype=np.uint8, low=0, high=200), _axes(2)],
        consts=(1,),
        id="uint8",
    ),
]

_ZEROS = [
    OpCase(op, [_with_zeros(), _axes(1)], consts=(1,), id="zeros")
    for op in ("ReduceProd", "ReduceL2", "ReduceL1", "ReduceSumSquare")
]

_PROD_GRAD = [
    OpCase(
        "ReduceProdGrad",
        [rand(5, 1, 4, seed=5), _with_zeros()],
        {"axes": [1]},
        domain="dfdl",
        reference=_prod_grad_ref((1,)),
        id="f32_zeros",
    ),
    OpCase(
        "ReduceProdGrad",
        [rand(1, 7, 1, dtype=F64, seed=6), rand(5, 7, 4, dtype=F64)],
        {"axes": [0, 2]},
        domain="dfdl",
        reference=_prod_grad_ref((0, 2)),
        rtol=1e-10,
        atol=1e-12,
        id="f64_axes02",
    ),
]


CASES = [
    *_reduce("ReduceSum"),
    *_reduce("ReduceMax"),
    *_reduce("ReduceMean", int_data=False),
    *_argmax(),
    *_more("ReduceMin"),
    *_MIN_EXTRA,
    *_more("ReduceProd", low=0.5),
    *_more("ReduceL1"),
    *_more("ReduceL2", ints=(np.int64,)),
    *_more("ReduceSumSquare", ints=(np.int64,)),
    *_more("ReduceLogSum", low=0.5, ints=()),
    *_more("ReduceLogSumExp", ints=()),
    *_ZEROS,
    *_PROD_GRAD,
]
