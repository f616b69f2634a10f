"""OpCases for Softmax, LogSoftmax and their gradients (dfdl/ops/softmax.py)."""

from __future__ import annotations

import numpy as np

from tests.ops.case import OpCase, rand
from tests.ops.cases_norm import cs_vjp

F32, F64 = np.float32, np.float64


def _softmax(op: str) -> list[OpCase]:
    return [
        OpCase(op, [rand(5, 7)], id="f32_2d"),
        OpCase(op, [rand(5, 7, 6, high=40.0)], attrs={"axis": 1}, id="f32_3d_axis1_large"),
        OpCase(op, [rand(5, 7, 6, dtype=F64)], attrs={"axis": 0}, id="f64_3d_axis0"),
        OpCase(op, [rand(5, 7, 3, 4)], attrs={"axis": -2}, id="f32_4d_axis-2"),
        OpCase(op, [rand(11, dtype=F64)], id="f64_1d"),
    ]


CASES = _softmax("Softmax") + _softmax("LogSoftmax")


def _cs_softmax(x, axis):
    # the shift is a constant (real max): softmax does not depend on it
    e = np.exp(x - x.real.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _softmax_grad_ref(axis, log):
    def ref(dY, Y):
        # the logits of Y: log(Y) for softmax (sums to 1), Y itself for log-softmax
        x = Y.astype(np.float64) if log else np.log(Y.astype(np.float64))
        f = (
            (lambda z: [np.log(_cs_softmax(z, axis))])
            if log
            else (lambda z: [_cs_softmax(z, axis)])
        )
        return [cs_vjp(f, [x], 0, [dY]).astype(Y.dtype)]

    return ref


def _softmax_out(shape, axis, dtype, log=False, seed=0):
    x = rand(*shape, dtype=np.float64, seed=seed)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    y = e / e.sum(axis=axis, keepdims=True)
    return (np.log(y) if log else y).astype(dtype)


def _softmax_grad_cases(op: str) -> list[OpCase]:
    log = op == "LogSoftmaxGrad"
    out = []
    for shape, axis, dt, tag in [
        ((5, 7), -1, F32, "f32_2d"),
        ((5, 7, 6), 1, F64, "f64_3d_axis1"),
        ((5, 7, 3), 0, F32, "f32_3d_axis0"),
        ((11,), 0, F64, "f64_1d"),
    ]:
        out.append(
            OpCase(
                op,
                [rand(*shape, dtype=dt, seed=3), _softmax_out(shape, axis, dt, log)],
                attrs={"axis": axis},
                domain="dfdl",
                reference=_softmax_grad_ref(axis, log),
                rtol=1e-4 if dt == F32 else 1e-7,
                atol=1e-5 if dt == F32 else 1e-9,
                id=tag,
            )
        )
    return out


CASES += _softmax_grad_cases("SoftmaxGrad") + _softmax_grad_cases("LogSoftmaxGrad")
