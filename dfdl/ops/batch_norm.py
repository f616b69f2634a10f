"""BatchNormalization, whole and split: its ops, VJP rule and kernel parameters.

``BatchNormalization`` (ONNX opset 15 semantics) and its ``dfdl``-domain companions:

* ``dfdl.BatchNormalizationGrad``: the training-mode backward, ``(dX, dscale, dB)``,
  computed in float64 and rounded once to the output dtype;
* ``dfdl.BatchNormalizationRelu`` / ``dfdl.BatchNormalizationReluGrad``: a training-mode
  normalization whose output only a Relu reads, and the gradient pair behind them, fused
  after differentiation (:mod:`dfdl.training.passes.fuse_norm_relu`): one pass over the
  activation instead of two each way.

In training mode those ops need each channel's statistics over the whole batch and
volume, so one task holds a channel of every sample.
:func:`dfdl.training.passes.split_norm.split_batch_norms` rewrites them into the split
ops below, each of which splits every axis:

* ``dfdl.BatchNormMoments(X) -> M``: per-channel (count, mean, sum of squared
  deviations), float64, ``(C, 3)``; tiles over batch and space combine by Chan's
  parallel formula (the ``"moments"`` tree combine), so no tile sums raw squares;
* ``dfdl.BatchNormApply(X, scale, B, M) -> Y`` and
  ``dfdl.BatchNormRunning(M, input_mean, input_var) -> (running_mean, running_var)``;
* backward: ``dfdl.BatchNormGradSums(dY, X, M) -> G`` (sums of ``dY * xhat`` and ``dY``,
  ``(C, 2)`` float64, tree-summed), ``dfdl.BatchNormGradApply(dY, X, scale, M, G[, dMean,
  dVar]) -> dX`` and ``dfdl.BatchNormGradParams(G, scale) -> (dscale, dB)``.

The split math is the whole op's (batch statistics rounded to X's dtype in the forward,
float64 in the backward); only the order of the sums differs. A normalization followed
by a Relu splits into the same ops with the Relu inside: ``BatchNormApply`` with
``relu=1`` writes ``Relu(Y)``, and the gradient ops take the Relu's output ``Z`` as a last
input and read ``ReluGrad(dZ, Z)`` as they go (``BatchNormGradSums(dZ, X, M, Z)``,
``BatchNormGradApply(dZ, X, scale, M, G, dMean, dVar, Z)``), bit for bit the separate
Relu and ReluGrad passes' values, without those passes.

The CPU kernels are in :mod:`dfdl.ops.cpu.batch_norm`; they receive the parameters the
``*_params`` rules here resolve.

Example:
    >>> from dfdl.ops import REGISTRY
    >>> REGISTRY["dfdl.BatchNormMoments"].forward(np.array([[1.0], [3.0]]))  # count, mean, M2
    array([[2., 2., 2.]])
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from dfdl.errors import ShapeError
from dfdl.ops.common import letters
from dfdl.ops.halo import spatial_letters
from dfdl.ops.norm_common import (
    as_f64,
    channel_view,
    check_channels,
    check_like,
    epsilon_params,
    normalize_grad,
)
from dfdl.ops.registry import DFDL_DOMAIN, TensorType, TileContext, TileSpec, defvjp, register

# ------------------------------------------------------------------ BatchNormalization


def _bn_shape(inputs, consts, *, epsilon=1e-5, momentum=0.9, training_mode=0):
    X = inputs[0]
    check_channels("BatchNormalization", X, inputs[1:5])
    if not training_mode:
        return [X]
    mean, var = inputs[3], inputs[4]
    return [X, TensorType(mean.shape, mean.dtype), TensorType(var.shape, var.dtype)]


def _bn_tile(ctx: TileContext) -> TileSpec:
    rank = ctx.inputs[0].rank
    if ctx.attrs.get("training_mode", 0):
        # batch statistics need every element of a channel: only the channel axis splits
        x = ".c" + "." * (rank - 2)
        return TileSpec(inputs=(x, "c", "c", "c", "c"), outputs=(x, "c", "c")[: len(ctx.outputs)])
    # inference is a per-channel affine map: every axis splits
    x = "nc" + letters(rank - 2, offset=3)
    return TileSpec(inputs=(x, "c", "c", "c", "c"), outputs=(x,))


def batch_norm_stats(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel batch mean and biased variance of an (N, C, ...) tensor.

    Example:
        >>> batch_norm_stats(np.array([[1.0], [3.0]]))
        (array([2.]), array([1.]))
    """
    axes = (0, *range(2, X.ndim))
    return X.mean(axis=axes), X.var(axis=axes)


def batch_norm_params(
    X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9, training_mode=0
) -> dict:
    """The BatchNormalization kernels' parameters: ``epsilon`` and ``momentum`` as
    floats, ``training_mode`` as a bool.

    Example:
        >>> batch_norm_params(*[None] * 5, training_mode=1)["training_mode"]
        True
    """
    return {
        "epsilon": float(epsilon),
        "momentum": float(momentum),
        "training_mode": bool(training_mode),
    }


@register(
    "BatchNormalization",
    shape=_bn_shape,
    tile=_bn_tile,
    params=batch_norm_params,
)
def BatchNormalization(
    X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9, training_mode=0
):
    """Batch normalization (opset 15).

    Inference mode returns Y. Training mode normalizes with the batch statistics
    (biased variance, as ONNX's reference) and returns ``(Y, running_mean, running_var)``
    with ``running = input * momentum + batch * (1 - momentum)``.
    """
    r = X.ndim
    if training_mode:
        mean, var = batch_norm_stats(X)
        running_mean = input_mean * momentum + mean * (1 - momentum)
        running_var = input_var * momentum + var * (1 - momentum)
    else:
        mean, var = input_mean, input_var
    s, b = channel_view(scale, r), channel_view(B, r)
    m, v = channel_view(mean, r), channel_view(var, r)
    Y = (s * (X - m) / np.sqrt(v + epsilon) + b).astype(X.dtype, copy=False)
    if not training_mode:
        return Y
    return (
        Y,
        running_mean.astype(input_mean.dtype, copy=False),
        running_var.astype(input_var.dtype, copy=False),
    )


# ----------------------------------------------------- dfdl.BatchNormalizationGrad


def _bn_grad_shape(inputs, consts, *, epsilon=1e-5):
    dY, X, scale = inputs[0], inputs[1], inputs[2]
    check_channels("dfdl.BatchNormalizationGrad", X, inputs[2:5])
    check_like("dfdl.BatchNormalizationGrad", "dY", dY, X.shape)
    return [X, scale, scale]


def _bn_grad_tile(ctx: TileContext) -> TileSpec:
    # batch statistics: the batch and spatial axes stay whole, channels split
    x = ".c" + "." * (ctx.inputs[1].rank - 2)
    return TileSpec(inputs=(x, x, "c", "c", "c")[: len(ctx.inputs)], outputs=(x, "c", "c"))


@register(
    "BatchNormalizationGrad",
    domain=DFDL_DOMAIN,
    shape=_bn_grad_shape,
    tile=_bn_grad_tile,
    differentiable=False,
    params=epsilon_params,
)
def BatchNormalizationGrad(dY, X, scale, dMean=None, dVar=None, *, epsilon=1e-5):
    """Training-mode BatchNormalization backward; returns ``(dX, dscale, dB)``.

    Statistics are recomputed from ``X``. ``dMean``/``dVar`` (optional, per channel) are
    gradients reaching the batch mean and biased variance (through the running stats).
    A missing ``dY`` counts as zeros.
    """
    r = X.ndim
    axes = (0, *range(2, r))
    cv = None if dMean is None else channel_view(as_f64(dMean), r)
    vv = None if dVar is None else channel_view(as_f64(dVar), r)
    dx, ds, db = normalize_grad(dY, X, scale, cv, vv, epsilon, axes)
    return (
        dx.astype(X.dtype),
        ds.reshape(-1).astype(scale.dtype),
        db.reshape(-1).astype(scale.dtype),
    )


# ------------------------------- dfdl.BatchNormalizationRelu / BatchNormalizationReluGrad


def _bn_relu_shape(inputs, consts, *, epsilon=1e-5, momentum=0.9):
    return _bn_shape(inputs, consts, epsilon=epsilon, momentum=momentum, training_mode=1)


def _bn_relu_tile(ctx: TileContext) -> TileSpec:
    x = ".c" + "." * (ctx.inputs[0].rank - 2)  # batch statistics: channels split only
    return TileSpec(inputs=(x, "c", "c", "c", "c"), outputs=(x, "c", "c")[: len(ctx.outputs)])


def batch_norm_relu_params(X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9):
    """The BatchNormalizationRelu kernels' parameters: ``epsilon`` and ``momentum`` as
    floats.

    Example:
        >>> batch_norm_relu_params(*[None] * 5, momentum=0.5)
        {'epsilon': 1e-05, 'momentum': 0.5}
    """
    return {"epsilon": float(epsilon), "momentum": float(momentum)}


@register(
    "BatchNormalizationRelu",
    domain=DFDL_DOMAIN,
    shape=_bn_relu_shape,
    tile=_bn_relu_tile,
    differentiable=False,
    params=batch_norm_relu_params,
)
def BatchNormalizationRelu(X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9):
    """``Relu`` of a training-mode BatchNormalization's Y; returns ``(Z, running_mean,
    running_var)``.

    Example:
        >>> x = np.array([[-1.0], [1.0]], np.float32); one = np.ones(1, np.float32)
        >>> BatchNormalizationRelu(x, one, 0 * one, 0 * one, one)[0].ravel().round(2)
        array([0., 1.], dtype=float32)
    """
    y, running_mean, running_var = BatchNormalization(
        X, scale, B, input_mean, input_var, epsilon=epsilon, momentum=momentum, training_mode=1
    )
    return np.maximum(y, y.dtype.type(0)), running_mean, running_var


def _bn_relu_grad_shape(inputs, consts, *, epsilon=1e-5):
    dZ, Z = inputs[:2]
    check_like("dfdl.BatchNormalizationReluGrad", "Z", Z, dZ.shape)
    return _bn_grad_shape([dZ, *inputs[2:]], consts, epsilon=epsilon)


def _bn_relu_grad_tile(ctx: TileContext) -> TileSpec:
    x = ".c" + "." * (ctx.inputs[2].rank - 2)
    return TileSpec(inputs=(x, x, x, "c", "c", "c")[: len(ctx.inputs)], outputs=(x, "c", "c"))


@register(
    "BatchNormalizationReluGrad",
    domain=DFDL_DOMAIN,
    shape=_bn_relu_grad_shape,
    tile=_bn_relu_grad_tile,
    differentiable=False,
    params=epsilon_params,
)
def BatchNormalizationReluGrad(dZ, Z, X, scale, dMean=None, dVar=None, *, epsilon=1e-5):
    """:func:`BatchNormalizationGrad` of ``ReluGrad(dZ, Z)``: the gradient through a
    fused :func:`BatchNormalizationRelu` with output ``Z``; returns ``(dX, dscale, dB)``.

    Example:
        >>> x = np.array([[-1.0], [1.0]], np.float32); one = np.ones(1, np.float32)
        >>> z = np.array([[0.0], [1.0]], np.float32)
        >>> BatchNormalizationReluGrad(one.reshape(1, 1) + 0 * x, z, x, one)[2]
        array([1.], dtype=float32)
    """
    dy = None if dZ is None else np.where(Z > 0, dZ, dZ * dZ.dtype.type(0))
    return BatchNormalizationGrad(dy, X, scale, dMean, dVar, epsilon=epsilon)


# =========================================================================== split ops


def _x_spec(rank: int) -> str:
    return "nc" + spatial_letters(rank - 2)


def _check_x(op: str, X: TensorType) -> None:
    if X.rank < 2 or X.dtype.kind != "f":
        raise ShapeError(f"{op}: X must be a float tensor (N, C, ...), got {X.shape} {X.dtype}")


def _check_moments(op: str, M: TensorType, c: int, width: int) -> None:
    if tuple(M.shape) != (c, width):
        raise ShapeError(f"{op}: per-channel sums must have shape ({c}, {width}), got {M.shape}")


def _check_z(op: str, Z: TensorType | None, X: TensorType) -> None:
    if Z is not None and tuple(Z.shape) != tuple(X.shape):
        raise ShapeError(f"{op}: the Relu output Z {Z.shape} must have X's shape {X.shape}")


def _x_channels_view(p: np.ndarray, rank: int) -> np.ndarray:
    return np.asarray(p).reshape((1, -1) + (1,) * (rank - 2))


def _stats(M: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Batch mean and biased variance from the moments, rounded to ``dtype`` as the
    whole op's forward rounds them."""
    return M[:, 1].astype(dtype), (M[:, 2] / M[:, 0]).astype(dtype)


def _inv(M: np.ndarray, epsilon: float) -> np.ndarray:
    return 1.0 / np.sqrt(M[:, 2] / M[:, 0] + epsilon)


def _relu_grad(dY, Z):
    """``ReluGrad(dY, Z)`` with the ReluGrad kernel's arithmetic (``dY * 0`` where the
    Relu output ``Z`` is not positive); dY itself without Z."""
    return dY if Z is None else np.where(Z > 0, dY, dY * 0)


# ---------------------------------------------------------------- dfdl.BatchNormMoments


def _moments_shape(inputs, consts):
    _check_x("dfdl.BatchNormMoments", inputs[0])
    return [TensorType((inputs[0].shape[1], 3), np.float64)]


def _moments_tile(ctx: TileContext) -> TileSpec:
    x = _x_spec(ctx.inputs[0].rank)
    reduced = x.replace("c", "")
    return TileSpec(
        inputs=(x,),
        outputs=("c.",),
        reduce={ch: "moments" for ch in reduced},
        spatial=x[2:],
    )


@register(
    "BatchNormMoments",
    domain=DFDL_DOMAIN,
    shape=_moments_shape,
    tile=_moments_tile,
    differentiable=False,
)
def BatchNormMoments(X):
    """Per-channel (count, mean, sum of squared deviations) of X, float64 ``(C, 3)``."""
    axes = (0, *range(2, X.ndim))
    x = X.astype(np.float64)
    cnt = np.prod([X.shape[a] for a in axes])
    mean = x.mean(axis=axes)
    m2 = ((x - _x_channels_view(mean, X.ndim)) ** 2).sum(axis=axes)
    return np.stack([np.full_like(mean, cnt), mean, m2], axis=1)


# ------------------------------------------------------------------ dfdl.BatchNormApply


def _apply_shape(inputs, consts, *, epsilon=1e-5, relu=0):
    X, M = inputs[0], inputs[3]
    _check_x("dfdl.BatchNormApply", X)
    _check_moments("dfdl.BatchNormApply", M, X.shape[1], 3)
    return [X]


def _apply_tile(ctx: TileContext) -> TileSpec:
    x = _x_spec(ctx.inputs[0].rank)
    return TileSpec(inputs=(x, "c", "c", "c."), outputs=(x,), spatial=x[2:])


def apply_params(X, scale, B, M, *, epsilon=1e-5, relu=0) -> dict:
    """The BatchNormApply kernels' parameters: ``epsilon`` as a float, ``relu`` as a
    bool.

    Example:
        >>> apply_params(*[None] * 4, relu=1)
        {'epsilon': 1e-05, 'relu': True}
    """
    return {"epsilon": float(epsilon), "relu": bool(relu)}


@register(
    "BatchNormApply",
    domain=DFDL_DOMAIN,
    shape=_apply_shape,
    tile=_apply_tile,
    differentiable=False,
    params=apply_params,
)
def BatchNormApply(X, scale, B, M, *, epsilon=1e-5, relu=0):
    """Y of training-mode BatchNormalization from the batch's moments ``M`` (``relu=1``:
    ``Relu(Y)``)."""
    mean, var = _stats(M, X.dtype)
    r = X.ndim
    y = (X - _x_channels_view(mean, r)) / np.sqrt(_x_channels_view(var, r) + epsilon)
    y = (_x_channels_view(scale, r) * y + _x_channels_view(B, r)).astype(X.dtype)
    return np.where(y < 0, np.zeros_like(y), y) if relu else y


# ---------------------------------------------------------------- dfdl.BatchNormRunning


def _running_shape(inputs, consts, *, momentum=0.9, x_dtype=1):
    M, mean, var = inputs
    _check_moments("dfdl.BatchNormRunning", M, mean.shape[0], 3)
    return [mean, var]


def _running_tile(ctx: TileContext) -> TileSpec:
    return TileSpec(inputs=("c.", "c", "c"), outputs=("c", "c"))


@register(
    "BatchNormRunning",
    domain=DFDL_DOMAIN,
    shape=_running_shape,
    tile=_running_tile,
    differentiable=False,
)
def BatchNormRunning(M, input_mean, input_var, *, momentum=0.9, x_dtype=1):
    """Running statistics ``input * momentum + batch * (1 - momentum)``; ``x_dtype`` (an
    ONNX element type) is X's, to which the batch statistics are rounded first."""
    mean, var = _stats(M, helper.tensor_dtype_to_np_dtype(x_dtype))
    return (
        (input_mean * momentum + mean * (1 - momentum)).astype(input_mean.dtype),
        (input_var * momentum + var * (1 - momentum)).astype(input_var.dtype),
    )


# --------------------------------------------------------------- dfdl.BatchNormGradSums


def _grad_sums_shape(inputs, consts, *, epsilon=1e-5):
    dY, X, M = inputs[:3]
    _check_x("dfdl.BatchNormGradSums", X)
    _check_z("dfdl.BatchNormGradSums", (inputs[3:] or [None])[0], X)
    _check_moments("dfdl.BatchNormGradSums", M, X.shape[1], 3)
    if tuple(dY.shape) != tuple(X.shape):
        raise ShapeError(f"dfdl.BatchNormGradSums: dY {dY.shape} must have X's shape {X.shape}")
    return [TensorType((X.shape[1], 2), np.float64)]


def _grad_sums_tile(ctx: TileContext) -> TileSpec:
    x = _x_spec(ctx.inputs[1].rank)
    return TileSpec(
        inputs=(x, x, "c.", x)[: len(ctx.inputs)],
        outputs=("c.",),
        reduce={ch: "sum" for ch in x.replace("c", "")},
        spatial=x[2:],
    )


@register(
    "BatchNormGradSums",
    domain=DFDL_DOMAIN,
    shape=_grad_sums_shape,
    tile=_grad_sums_tile,
    differentiable=False,
    params=epsilon_params,
)
def BatchNormGradSums(dY, X, M, Z=None, *, epsilon=1e-5):
    """Per-channel ``(sum dY * xhat, sum dY)``, float64 ``(C, 2)``; with the Relu output
    ``Z``, of ``ReluGrad(dY, Z)``."""
    dY = _relu_grad(dY, Z)
    r = X.ndim
    axes = (0, *range(2, r))
    xhat = (X.astype(np.float64) - _x_channels_view(M[:, 1], r)) * _x_channels_view(
        _inv(M, epsilon), r
    )
    dy = dY.astype(np.float64)
    return np.stack([(dy * xhat).sum(axis=axes), dy.sum(axis=axes)], axis=1)


# -------------------------------------------------------------- dfdl.BatchNormGradApply


def _grad_apply_shape(inputs, consts, *, epsilon=1e-5):
    X, M, G = inputs[1], inputs[3], inputs[4]
    _check_x("dfdl.BatchNormGradApply", X)
    _check_moments("dfdl.BatchNormGradApply", M, X.shape[1], 3)
    _check_moments("dfdl.BatchNormGradApply", G, X.shape[1], 2)
    _check_z("dfdl.BatchNormGradApply", (inputs[7:] or [None])[0], X)
    return [X]


def _grad_apply_tile(ctx: TileContext) -> TileSpec:
    x = _x_spec(ctx.inputs[1].rank)
    specs = (x, x, "c", "c.", "c.", "c", "c", x)[: len(ctx.inputs)]
    return TileSpec(inputs=specs, outputs=(x,), spatial=x[2:])


@register(
    "BatchNormGradApply",
    domain=DFDL_DOMAIN,
    shape=_grad_apply_shape,
    tile=_grad_apply_tile,
    differentiable=False,
    params=epsilon_params,
)
def BatchNormGradApply(dY, X, scale, M, G, dMean=None, dVar=None, Z=None, *, epsilon=1e-5):
    """dX of training-mode BatchNormalization from the moments and the gradient sums;
    ``dMean``/``dVar`` are gradients reaching the batch mean and biased variance; with
    the Relu output ``Z``, of ``ReluGrad(dY, Z)``."""
    dY = _relu_grad(dY, Z)
    r = X.ndim
    cnt = M[0, 0]
    mean = _x_channels_view(M[:, 1], r)
    inv = _x_channels_view(_inv(M, epsilon), r)
    xc = X.astype(np.float64) - mean
    a = _x_channels_view(np.asarray(scale, np.float64), r) * inv
    dx = a * (
        dY - _x_channels_view(G[:, 1], r) / cnt - xc * inv * _x_channels_view(G[:, 0], r) / cnt
    )
    if dMean is not None:
        dx = dx + _x_channels_view(dMean, r) / cnt
    if dVar is not None:
        dx = dx + _x_channels_view(dVar, r) * (2.0 / cnt) * xc
    return dx.astype(X.dtype)


# ------------------------------------------------------------- dfdl.BatchNormGradParams


def _grad_params_shape(inputs, consts):
    G, scale = inputs
    _check_moments("dfdl.BatchNormGradParams", G, scale.shape[0], 2)
    return [scale, scale]


def _grad_params_tile(ctx: TileContext) -> TileSpec:
    return TileSpec(inputs=("c.", "c"), outputs=("c", "c"))


@register(
    "BatchNormGradParams",
    domain=DFDL_DOMAIN,
    shape=_grad_params_shape,
    tile=_grad_params_tile,
    differentiable=False,
)
def BatchNormGradParams(G, scale):
    """``(dscale, dB)`` from the gradient sums, in ``scale``'s dtype."""
    return G[:, 0].astype(scale.dtype), G[:, 1].astype(scale.dtype)


# ============================================================================ VJP rule


def _as_channels(b, name: str, rank: int) -> str:
    """A (C,) value reshaped to (C, 1, ...) so it broadcasts against (N, C, D...)."""
    c = b.type(name).shape[0]
    return b.op("Reshape", [name, b.const((c,) + (1,) * (rank - 2), np.int64, "cshape")])


@defvjp("BatchNormalization")
def _bn_vjp(b, node, dys):
    X, scale, _B, mean, var = node.inputs
    eps = node.attrs.get("epsilon", 1e-5)
    if node.attrs.get("training_mode", 0):
        m = node.attrs.get("momentum", 0.9)
        dys = list(dys) + [None] * (3 - len(dys))
        # running = input * m + batch_stat * (1 - m)
        bstat, gin = [], []
        for d in dys[1:3]:
            if d is None:
                bstat.append(None)
                gin.append(None)
                continue
            dt = b.type(d).dtype
            bstat.append(b.op("Mul", [d, b.const(1 - m, dt, "one_minus_momentum")]))
            gin.append(b.op("Mul", [d, b.const(m, dt, "momentum")]))
        dx, ds, db = b.op(
            "BatchNormalizationGrad",
            [dys[0], X, scale, *bstat],
            {"epsilon": eps},
            domain=DFDL_DOMAIN,
            n_outputs=3,
        )
        if dys[0] is None:
            ds = db = None
        return [dx, ds, db, *gin]
    # inference: Y = a * (X - mean) + B with a = scale * inv, inv = 1 / sqrt(var + eps)
    dy = dys[0]
    r = b.type(X).rank
    red = b.const([0, *range(2, r)], np.int64, "axes")
    vt = b.type(var).dtype
    inv = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [var, b.const(eps, vt, "eps")])])])
    a = b.op("Mul", [scale, inv])
    dx = b.op("Mul", [dy, _as_channels(b, a, r)])
    sdy = b.op("ReduceSum", [dy, red], {"keepdims": 0})
    xc = b.op("Sub", [X, _as_channels(b, mean, r)])
    sdyx = b.op("ReduceSum", [b.op("Mul", [dy, xc]), red], {"keepdims": 0})
    dscale = b.op("Mul", [sdyx, inv])
    dmean = b.op("Neg", [b.op("Mul", [sdy, a])])
    # d inv / d var = -inv^3 / 2
    dinv = b.op("Mul", [b.op("Mul", [sdyx, scale]), b.const(-0.5, vt, "neg_half")])
    dvar = b.op("Mul", [dinv, b.op("Mul", [inv, b.op("Mul", [inv, inv])])])
    return [dx, dscale, sdy, dmean, dvar]
