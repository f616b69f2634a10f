"""OpCases for LRN and dfdl.LRNGrad (dfdl/ops/lrn.py).

The oracle is the spec's formula written as loops (onnx's ReferenceEvaluator takes 4-D
inputs only, and sums the windows of the first N channels only: its loop runs over the
batch axis), differentiated by the complex step for the backward op
(:func:`tests.ops.cases_norm.cs_vjp`).
"""

from __future__ import annotations

import math

import numpy as np

from tests.ops.case import OpCase, rand
from tests.ops.cases_norm import cs_vjp

F16, F32, F64 = np.float16, np.float32, np.float64


def _lrn_loops(x, alpha=1e-4, beta=0.75, bias=1.0, size=1):
    """The spec, channel by channel (real or complex ``x``)."""
    c = x.shape[1]
    y = np.empty_like(x)
    for i in range(c):
        lo, hi = max(0, i - (size - 1) // 2), min(c - 1, i + math.ceil((size - 1) / 2))
        s = (x[:, lo : hi + 1] ** 2).sum(axis=1)
        y[:, i] = x[:, i] / (bias + alpha / size * s) ** beta
    return y


def _reference(**attrs):
    return lambda X: [_lrn_loops(X.astype(np.float64), **attrs).astype(X.dtype)]


def _grad_reference(**attrs):
    def ref(dY, X):
        return [cs_vjp(lambda x: [_lrn_loops(x, **attrs)], [X], 0, [dY]).astype(X.dtype)]

    return ref


# exact in float32, as ONNX stores float attributes
_STRONG = {"alpha": 0.5, "beta": 0.625, "bias": 2.0}


def _lrn(x, tag, **attrs) -> OpCase:
    tol = {"rtol": 2e-3, "atol": 2e-3} if x.dtype == F16 else {}
    return OpCase("LRN", [x], attrs, id=tag, reference=_reference(**attrs), **tol)


CASES = [
    _lrn(rand(5, 7, 3, 4), "f32_size3_defaults", size=3),
    _lrn(rand(5, 7, 3, 4), "f32_size4_even", size=4, **_STRONG),
    _lrn(rand(2, 7, 3, 4), "f32_size5_alexnet", size=5, alpha=2e-4),
    _lrn(rand(3, 4, 5, 2), "f32_size1", size=1, **_STRONG),
    _lrn(rand(3, 5, 3, 4), "f32_size_over_c", size=9, **_STRONG),
    _lrn(rand(4, 7, 3, 5, dtype=F64), "f64", size=3, **_STRONG),
    _lrn(rand(4, 7, 3, 5, dtype=F16), "f16", size=3, **_STRONG),
    _lrn(rand(5, 7, 6), "f32_3d", size=3, **_STRONG),
    OpCase(
        "LRNGrad",
        [rand(5, 7, 3, 4, seed=3), rand(5, 7, 3, 4)],
        {"size": 3, **_STRONG},
        domain="dfdl",
        reference=_grad_reference(size=3, **_STRONG),
        id="f32_size3",
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "LRNGrad",
        [rand(3, 6, 5, dtype=F64, seed=3), rand(3, 6, 5, dtype=F64)],
        {"size": 4, **_STRONG},
        domain="dfdl",
        reference=_grad_reference(size=4, **_STRONG),
        id="f64_size4_3d",
        rtol=1e-9,
        atol=1e-12,
    ),
    OpCase(
        "LRNGrad",
        [rand(2, 3, 2, 2, dtype=F64, seed=3), rand(2, 3, 2, 2, dtype=F64)],
        {"size": 7, "alpha": 1e-4},
        domain="dfdl",
        reference=_grad_reference(size=7, alpha=1e-4),
        id="f64_size_over_c_defaults",
        rtol=1e-9,
        atol=1e-12,
    ),
]
