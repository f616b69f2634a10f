"""OpCases for BatchNormalization, whole and split (dfdl/ops/batch_norm.py).

The whole op and its fused Relu pair are checked against complex-step references;
the split ops' references are the textbook formulas in float64, written here from
np.mean / np.var, not from dfdl. Inputs M and G of the split ops are the moments and
gradient sums of real tensors, so the cases run the ops as the split graph does.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from tests.ops.case import OpCase, rand
from tests.ops.cases_norm import _chan, _cs_batch_norm, _tol, cs_vjp
from tests.ops.cases_optim import _group

F32, F64 = np.float32, np.float64


def _bn_inputs(*shape, dtype=F32):
    c = shape[1]
    return [
        rand(*shape, dtype=dtype),
        _chan(c, dtype, 1),
        _chan(c, dtype, 2),
        _chan(c, dtype, 3),
        _chan(c, dtype, 4, positive=True),
    ]


_BN = [
    OpCase("BatchNormalization", _bn_inputs(5, 7, 3, 4), id="f32_4d"),
    OpCase("BatchNormalization", _bn_inputs(5, 7, dtype=F64), id="f64_2d"),
    OpCase(
        "BatchNormalization",
        _bn_inputs(5, 7, 6, dtype=F64),
        attrs={"epsilon": 1e-2},
        id="f64_3d_eps",
    ),
    OpCase(
        "BatchNormalization",
        _bn_inputs(5, 7, 3, 4),
        attrs={"training_mode": 1},
        n_outputs=3,
        id="train_f32_4d",
    ),
    OpCase(
        "BatchNormalization",
        _bn_inputs(5, 7, 6, dtype=F64),
        attrs={"training_mode": 1, "momentum": 0.7, "epsilon": 1e-3},
        n_outputs=3,
        id="train_f64_3d_momentum",
    ),
    OpCase(
        "BatchNormalization",
        _bn_inputs(5, 7),
        attrs={"training_mode": 1},
        n_outputs=3,
        id="train_f32_2d",
    ),
    OpCase(
        "BatchNormalization",
        _bn_inputs(5, 7, 6, dtype=F64),
        attrs={"training_mode": 1},
        id="train_f64_y_only",
    ),
]


def _bn_grad_ref(epsilon=1e-5):
    def ref(dY, X, scale, dMean=None, dVar=None):
        axes = (0, *range(2, X.ndim))
        b = np.zeros_like(scale)
        f = lambda x, s, b_: _cs_batch_norm(x, s, b_, epsilon, axes)  # noqa: E731
        dys = [dY, dMean, dVar]
        return [
            cs_vjp(f, [X, scale, b], 0, dys).astype(X.dtype),
            cs_vjp(f, [X, scale, b], 1, dys).astype(scale.dtype),
            cs_vjp(f, [X, scale, b], 2, dys).astype(scale.dtype),
        ]

    return ref


_BN_GRAD = [
    OpCase(
        "BatchNormalizationGrad",
        [rand(5, 7, 3, 4, seed=3), rand(5, 7, 3, 4), _chan(7, seed=1)],
        n_outputs=3,
        domain="dfdl",
        reference=_bn_grad_ref(),
        id="f32_4d",
        **_tol(F32),
    ),
    OpCase(
        "BatchNormalizationGrad",
        [
            rand(5, 7, 6, dtype=F64, seed=3),
            rand(5, 7, 6, dtype=F64),
            _chan(7, F64, 1),
            _chan(7, F64, 2),
            _chan(7, F64, 3),
        ],
        attrs={"epsilon": 1e-3},
        n_outputs=3,
        domain="dfdl",
        reference=_bn_grad_ref(1e-3),
        id="f64_3d_stats_grads",
        **_tol(F64),
    ),
    OpCase(
        "BatchNormalizationGrad",
        [rand(5, 7, seed=3), rand(5, 7), _chan(7, seed=1), None, _chan(7, seed=3)],
        n_outputs=3,
        domain="dfdl",
        reference=_bn_grad_ref(),
        id="f32_2d_var_grad",
        **_tol(F32),
    ),
]


def _bn_relu_ref(epsilon=1e-5, momentum=0.9):
    """Independent of dfdl: the normalization written out, then max(., 0)."""

    def ref(X, scale, B, input_mean, input_var):
        axes = (0, *range(2, X.ndim))
        y, mean, var = _cs_batch_norm(X.astype(F64), scale, B, epsilon, axes)
        running = [input_mean * momentum + mean * (1 - momentum), input_var * momentum]
        running[1] = running[1] + var * (1 - momentum)
        return [np.maximum(y, 0).astype(X.dtype), *(r.astype(scale.dtype) for r in running)]

    return ref


def _bn_relu_grad_ref(epsilon=1e-5):
    grad = _bn_grad_ref(epsilon)

    def ref(dZ, Z, X, scale, dMean=None, dVar=None):
        return grad(np.where(Z > 0, dZ, 0), X, scale, dMean, dVar)

    return ref


def _relu_of_bn(*shape, dtype=F32):
    """A (dZ, Z) pair where Z has zeros (Relu's cut) and positive values."""
    z = np.maximum(rand(*shape, dtype=dtype, seed=8), 0).astype(dtype)
    return [rand(*shape, dtype=dtype, seed=9), z]


_BN_RELU = [
    OpCase(
        "BatchNormalizationRelu",
        _bn_inputs(5, 7, 3, 4),
        n_outputs=3,
        domain="dfdl",
        reference=_bn_relu_ref(),
        id="f32_4d",
        **_tol(F32),
    ),
    OpCase(
        "BatchNormalizationRelu",
        _bn_inputs(5, 7, 6, dtype=F64),
        attrs={"momentum": 0.7, "epsilon": 1e-3},
        n_outputs=3,
        domain="dfdl",
        reference=_bn_relu_ref(1e-3, 0.7),
        id="f64_3d_momentum",
        **_tol(F64),
    ),
] + [
    # the BatchNormalizationGrad cases, with dY replaced by a Relu's (dZ, Z)
    OpCase(
        "BatchNormalizationReluGrad",
        [*_relu_of_bn(*c.inputs[0].shape, dtype=c.inputs[0].dtype), *c.inputs[1:]],
        attrs=c.attrs,
        n_outputs=3,
        domain="dfdl",
        reference=_bn_relu_grad_ref(c.attrs.get("epsilon", 1e-5)),
        id=c.id,
        **_tol(c.inputs[0].dtype.type),
    )
    for c in _BN_GRAD
]

CASES = _BN + _BN_GRAD + _BN_RELU


# ---------------------------------------------------------------------- split ops


def _axes(x):
    return (0, *range(2, x.ndim))


def _view(p, rank):
    return np.asarray(p, np.float64).reshape((1, -1) + (1,) * (rank - 2))


def _moments(x):
    x = np.asarray(x, np.float64)
    ax = _axes(x)
    cnt = x.size // x.shape[1]
    return np.stack([np.full(x.shape[1], cnt), x.mean(axis=ax), x.var(axis=ax) * cnt], 1)


def _xhat(x, eps):
    x = np.asarray(x, np.float64)
    ax = _axes(x)
    m, v = x.mean(axis=ax), x.var(axis=ax)
    return (x - _view(m, x.ndim)) / np.sqrt(_view(v, x.ndim) + eps)


def _grad_sums(dy, x, eps):
    ax = _axes(x)
    dy = np.asarray(dy, np.float64)
    return np.stack([(dy * _xhat(x, eps)).sum(axis=ax), dy.sum(axis=ax)], 1)


def _apply_ref(eps, relu=False):
    def ref(x, scale, b, m):
        mean, var = m[:, 1].astype(x.dtype), (m[:, 2] / m[:, 0]).astype(x.dtype)
        r = x.ndim
        y = (x - _view(mean, r)) / np.sqrt(_view(var, r) + eps)
        y = (_view(scale, r) * y + _view(b, r)).astype(x.dtype)
        return [np.maximum(y, 0) if relu else y]

    return ref


def _relu_grad(dy, z):
    """The gradient through a Relu whose output is ``z``."""
    return dy * (np.asarray(z) > 0)


def _running_ref(momentum):
    def ref(m, mean, var):
        bm, bv = m[:, 1].astype(F32), (m[:, 2] / m[:, 0]).astype(F32)
        return [
            (mean * momentum + bm * (1 - momentum)).astype(mean.dtype),
            (var * momentum + bv * (1 - momentum)).astype(var.dtype),
        ]

    return ref


def _grad_apply_ref(eps):
    def ref(dy, x, scale, m, g, dmean=None, dvar=None, z=None):
        if z is not None:
            dy = _relu_grad(dy, z)
        r = x.ndim
        cnt = x.size // x.shape[1]
        xhat = _xhat(x, eps)
        inv = 1 / np.sqrt(_view(np.asarray(x, F64).var(axis=_axes(x)), r) + eps)
        dx = _view(scale, r) * inv * (dy - _view(g[:, 1], r) / cnt - xhat * _view(g[:, 0], r) / cnt)
        if dmean is not None:
            dx = dx + _view(dmean, r) / cnt
        if dvar is not None:
            xc = np.asarray(x, F64) - _view(np.asarray(x, F64).mean(axis=_axes(x)), r)
            dx = dx + _view(dvar, r) * 2 / cnt * xc
        return [dx.astype(x.dtype)]

    return ref


X4 = rand(5, 7, 3, 4, seed=1)
DY4 = rand(5, 7, 3, 4, seed=2)
X5 = rand(3, 4, 5, 3, 6, dtype=F64, seed=3) + 10.0  # a large mean: no cancellation
DY5 = rand(3, 4, 5, 3, 6, dtype=F64, seed=4)
X2 = rand(9, 6, seed=5)
DY2 = rand(9, 6, seed=6)
# Relu outputs (about half zero) for the gradient ops that mask dY themselves
Z4 = np.maximum(rand(5, 7, 3, 4, seed=13), 0).astype(F32)
Z5 = np.maximum(rand(3, 4, 5, 3, 6, dtype=F64, seed=14), 0)


def _grad_apply_5d(z=None) -> OpCase:
    """BatchNormGradApply on a float64 5-D tile with gradients reaching the batch mean
    and variance (and, given the Relu output ``z``, dY masked by it)."""
    dy = DY5 if z is None else _relu_grad(DY5, z)
    return OpCase(
        "BatchNormGradApply",
        [
            DY5,
            X5,
            rand(4, dtype=F64, seed=7),
            _moments(X5),
            _grad_sums(dy, X5, 1e-3),
            rand(4, dtype=F64, seed=11),
            rand(4, dtype=F64, seed=12),
            *([] if z is None else [z]),
        ],
        attrs={"epsilon": 1e-3},
        domain="dfdl",
        reference=_grad_apply_ref(1e-3),
        id="f64_5d_stats_grads" + ("" if z is None else "_relu"),
        rtol=1e-9,
        atol=1e-10,
    )


CASES += [
    OpCase(
        "BatchNormMoments",
        [X4],
        domain="dfdl",
        reference=lambda x: [_moments(x)],
        id="f32_4d",
        rtol=1e-9,
        atol=1e-9,
    ),
    OpCase(
        "BatchNormMoments",
        [X5],
        domain="dfdl",
        reference=lambda x: [_moments(x)],
        id="f64_5d_offset",
        rtol=1e-10,
        atol=1e-9,
    ),
    OpCase(
        "BatchNormMoments",
        [X2],
        domain="dfdl",
        reference=lambda x: [_moments(x)],
        id="f32_2d",
        rtol=1e-9,
        atol=1e-9,
    ),
    OpCase(
        "BatchNormApply",
        [X4, rand(7, seed=7), rand(7, seed=8), _moments(X4)],
        domain="dfdl",
        reference=_apply_ref(1e-5),
        id="f32_4d",
    ),
    OpCase(
        "BatchNormApply",
        [X5, rand(4, dtype=F64, seed=7), rand(4, dtype=F64, seed=8), _moments(X5)],
        attrs={"epsilon": 1e-3},
        domain="dfdl",
        reference=_apply_ref(1e-3),
        id="f64_5d_eps",
        rtol=1e-10,
        atol=1e-10,
    ),
    OpCase(
        "BatchNormApply",
        [X4, rand(7, seed=7), rand(7, seed=8), _moments(X4)],
        attrs={"relu": 1},
        domain="dfdl",
        reference=_apply_ref(1e-5, relu=True),
        id="f32_4d_relu",
    ),
    OpCase(
        "BatchNormApply",
        [X5, rand(4, dtype=F64, seed=7), rand(4, dtype=F64, seed=8), _moments(X5)],
        attrs={"epsilon": 1e-3, "relu": 1},
        domain="dfdl",
        reference=_apply_ref(1e-3, relu=True),
        id="f64_5d_relu",
        rtol=1e-10,
        atol=1e-10,
    ),
    OpCase(
        "BatchNormRunning",
        [_moments(X4), rand(7, seed=9), rand(7, seed=10, low=0.5, high=2.0)],
        attrs={"momentum": 0.7, "x_dtype": TensorProto.FLOAT},
        n_outputs=2,
        domain="dfdl",
        reference=_running_ref(0.7),
        id="f32",
    ),
    OpCase(
        "BatchNormGradSums",
        [DY4, X4, _moments(X4)],
        domain="dfdl",
        reference=lambda dy, x, m: [_grad_sums(dy, x, 1e-5)],
        id="f32_4d",
        rtol=1e-9,
        atol=1e-9,
    ),
    OpCase(
        "BatchNormGradSums",
        [DY5, X5, _moments(X5)],
        attrs={"epsilon": 1e-3},
        domain="dfdl",
        reference=lambda dy, x, m: [_grad_sums(dy, x, 1e-3)],
        id="f64_5d_eps",
        rtol=1e-9,
        atol=1e-9,
    ),
    OpCase(
        "BatchNormGradSums",
        [DY4, X4, _moments(X4), Z4],
        domain="dfdl",
        reference=lambda dy, x, m, z: [_grad_sums(_relu_grad(dy, z), x, 1e-5)],
        id="f32_4d_relu",
        rtol=1e-9,
        atol=1e-9,
    ),
    OpCase(
        "BatchNormGradSums",
        [DY5, X5, _moments(X5), Z5],
        attrs={"epsilon": 1e-3},
        domain="dfdl",
        reference=lambda dy, x, m, z: [_grad_sums(_relu_grad(dy, z), x, 1e-3)],
        id="f64_5d_relu",
        rtol=1e-9,
        atol=1e-9,
    ),
    OpCase(
        "BatchNormGradApply",
        [DY4, X4, rand(7, seed=7), _moments(X4), _grad_sums(DY4, X4, 1e-5)],
        domain="dfdl",
        reference=_grad_apply_ref(1e-5),
        id="f32_4d",
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "BatchNormGradApply",
        [
            DY4,
            X4,
            rand(7, seed=7),
            _moments(X4),
            _grad_sums(_relu_grad(DY4, Z4), X4, 1e-5),
            None,
            None,
            Z4,
        ],
        domain="dfdl",
        reference=_grad_apply_ref(1e-5),
        id="f32_4d_relu",
        rtol=1e-4,
        atol=1e-5,
    ),
    _grad_apply_5d(Z5),
    _grad_apply_5d(),
    OpCase(
        "BatchNormGradApply",
        [DY2, X2, rand(6, seed=7), _moments(X2), _grad_sums(DY2, X2, 1e-5)],
        domain="dfdl",
        reference=_grad_apply_ref(1e-5),
        id="f32_2d",
        rtol=1e-4,
        atol=1e-5,
    ),
    OpCase(
        "BatchNormGradParams",
        [_grad_sums(DY4, X4, 1e-5), rand(7, seed=7)],
        n_outputs=2,
        domain="dfdl",
        reference=lambda g, s: [g[:, 0].astype(s.dtype), g[:, 1].astype(s.dtype)],
        id="f32",
    ),
]


def _running(x, seed: int, id: str) -> OpCase:
    c = x.shape[1]
    return OpCase(
        "BatchNormRunning",
        [_moments(x), rand(c, seed=seed), rand(c, seed=seed + 1, low=0.5, high=2.0)],
        attrs={"momentum": 0.7, "x_dtype": TensorProto.FLOAT},
        n_outputs=2,
        domain="dfdl",
        reference=_running_ref(0.7),
        id=id,
    )


# the running statistics of several split BatchNorms, one task (dfdl.training.passes.group_updates)
CASES.append(
    _group([_running(X4, 9, "a"), _running(rand(2, 3, 5, seed=4), 11, "b")], id="group_running")
)
