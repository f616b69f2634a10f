"""OpCases for the loss ops (dfdl/ops/loss.py)."""

from __future__ import annotations

import numpy as np

from tests.ops.case import OpCase, rand

F32, F64 = np.float32, np.float64


def _labels(*shape, classes=7, dtype=np.int64, seed=0, ignore=None) -> np.ndarray:
    """Random class labels; every third one is ``ignore`` when given."""
    t = np.random.default_rng(seed + sum(shape)).integers(0, classes, size=shape).astype(dtype)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore
    return t


def _cases(op: str) -> list[OpCase]:
    n_out = 2 if op == "SoftmaxCrossEntropyLoss" else 1
    w = rand(7, low=0.2, high=2.0, seed=5)
    return [
        OpCase(op, [rand(5, 7), _labels(5)], id="f32_2d_mean"),
        OpCase(
            op,
            [rand(5, 7, 6, dtype=F64), _labels(5, 6, dtype=np.int32)],
            attrs={"reduction": "none"},
            n_outputs=n_out,
            id="f64_3d_none_i32",
        ),
        OpCase(
            op,
            [rand(5, 7, 3, 4), _labels(5, 3, 4), w],
            attrs={"reduction": "sum"},
            n_outputs=n_out,
            id="f32_4d_sum_weight",
        ),
        OpCase(
            op,
            [rand(5, 7, 3, 4), _labels(5, 3, 4, ignore=2), w],
            attrs={"reduction": "mean", "ignore_index": 2},
            n_outputs=n_out,
            id="f32_4d_mean_weight_ii",
        ),
        OpCase(
            op,
            [rand(5, 7, 6), _labels(5, 6, ignore=4)],
            attrs={"ignore_index": 4},
            id="f32_3d_mean_ii",
        ),
        OpCase(
            op,
            [rand(5, 7, 6, dtype=F64), _labels(5, 6, ignore=-1), rand(7, dtype=F64, seed=6)],
            attrs={"reduction": "none", "ignore_index": -1},
            n_outputs=n_out,
            id="f64_3d_none_weight_negative_ii",
        ),
        OpCase(
            op,
            [rand(5, 7, 6), _labels(5, 6, ignore=10, dtype=np.int32)],
            attrs={"reduction": "sum", "ignore_index": 10},
            id="f32_3d_sum_high_ii",
        ),
    ]


CASES = _cases("SoftmaxCrossEntropyLoss") + _cases("NegativeLogLikelihoodLoss")


# ---------------------------------------------------- backward ops (dfdl domain)
# References differentiate an independent complex-valued loss by the complex step.


def _cs_loss(x, labels, weight, reduction, ignore_index, log_softmax):
    if log_softmax:
        m = x.real.max(axis=1, keepdims=True)
        x = x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    ignored = np.zeros(labels.shape, bool) if ignore_index is None else labels == ignore_index
    safe = np.where(ignored, 0, labels).astype(np.intp)
    w = np.ones(labels.shape, np.complex128) if weight is None else weight[safe]
    w = np.where(ignored, 0, w)
    loss = -np.take_along_axis(x, safe[:, None], axis=1)[:, 0] * w
    if reduction == "none":
        return [loss]
    return [loss.sum() if reduction == "sum" else loss.sum() / w.sum()]


def _grad_ref(log_softmax: bool, wrt: int, reduction="mean", ignore_index=None):
    from tests.ops.cases_norm import cs_vjp

    def ref(dloss, x, labels, weight=None):
        def f(x_, w_):
            return _cs_loss(x_, labels, w_, reduction, ignore_index, log_softmax)

        if wrt == 0:
            return [cs_vjp(lambda x_: f(x_, weight), [x], 0, [dloss]).astype(x.dtype)]
        return [cs_vjp(lambda w_: f(x, w_), [weight], 0, [dloss]).astype(weight.dtype)]

    return ref


def _dl(shape, dtype, reduction, seed=9):
    return rand(*shape, dtype=dtype, seed=seed) if reduction == "none" else rand(dtype=dtype)


def _grad_cases(op: str) -> list[OpCase]:
    log_softmax = op == "SoftmaxCrossEntropyLossGrad"
    wrt = 1 if op == "NegativeLogLikelihoodLossWeightGrad" else 0
    w = rand(7, low=0.2, high=2.0, seed=5)
    w64 = rand(7, dtype=F64, low=0.2, high=2.0, seed=6)
    specs = [
        ("f32_2d_mean", [rand(5, 7), _labels(5)], None, "mean", None),
        (
            "f64_3d_none_i32",
            [rand(5, 7, 6, dtype=F64), _labels(5, 6, dtype=np.int32)],
            None,
            "none",
            None,
        ),
        ("f32_4d_sum_weight", [rand(5, 7, 3, 4), _labels(5, 3, 4)], w, "sum", None),
        ("f32_4d_mean_weight_ii", [rand(5, 7, 3, 4), _labels(5, 3, 4, ignore=2)], w, "mean", 2),
        (
            "f64_3d_none_weight_ii",
            [rand(5, 7, 6, dtype=F64), _labels(5, 6, ignore=-1)],
            w64,
            "none",
            -1,
        ),
        ("f32_3d_sum_high_ii", [rand(5, 7, 6), _labels(5, 6, ignore=10)], None, "sum", 10),
    ]
    out = []
    for tag, (x, t), weight, red, ii in specs:
        if wrt == 1 and weight is None:
            continue
        attrs = {"reduction": red}
        if ii is not None:
            attrs["ignore_index"] = ii
        dt = x.dtype
        tol = {"rtol": 1e-4, "atol": 1e-5} if dt == F32 else {"rtol": 1e-7, "atol": 1e-9}
        ins = [_dl(t.shape, dt, red), x, t] + ([] if weight is None else [weight])
        out.append(
            OpCase(
                op,
                ins,
                attrs=attrs,
                domain="dfdl",
                reference=_grad_ref(log_softmax, wrt, red, ii),
                id=tag,
                **tol,
            )
        )
    return out


CASES += (
    _grad_cases("SoftmaxCrossEntropyLossGrad")
    + _grad_cases("NegativeLogLikelihoodLossGrad")
    + _grad_cases("NegativeLogLikelihoodLossWeightGrad")
)
