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
