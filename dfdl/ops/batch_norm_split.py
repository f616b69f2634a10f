"""Training-mode BatchNormalization split into passes that tile over batch and space.

A training-mode BatchNormalization (and its gradient) needs each channel's statistics
over the whole batch and volume, so as one op it keeps those axes whole: one task holds
a channel of every sample. :func:`dfdl.training.passes.split_norm.split_batch_norms` rewrites it
into these ops, each of which splits every axis:

* ``dfdl.BatchNormMoments(X) -> M``: per-channel (count, mean, sum of squared
  deviations), float64, ``(C, 3)``; tiles over batch and space combine by Chan's
  parallel formula (the ``"moments"`` tree combine), so no tile sums raw squares;
* ``dfdl.BatchNormApply(X, scale, B, M) -> Y`` and
  ``dfdl.BatchNormRunning(M, input_mean, input_var) -> (running_mean, running_var)``;
* backward: ``dfdl.BatchNormGradSums(dY, X, M) -> G`` (sums of ``dY * xhat`` and ``dY``,
  ``(C, 2)`` float64, tree-summed), ``dfdl.BatchNormGradApply(dY, X, scale, M, G[, dMean,
  dVar]) -> dX`` and ``dfdl.BatchNormGradParams(G, scale) -> (dscale, dB)``.

The math is the fused op's (batch statistics rounded to X's dtype in the forward,
float64 in the backward); only the order of the sums differs.

A normalization followed by a Relu (``dfdl.BatchNormalizationRelu``) splits into the
same ops with the Relu inside: ``BatchNormApply`` with ``relu=1`` writes ``Relu(Y)``,
and the gradient ops take the Relu's output ``Z`` as a last input and read
``ReluGrad(dZ, Z)`` as they go (``BatchNormGradSums(dZ, X, M, Z)``,
``BatchNormGradApply(dZ, X, scale, M, G, dMean, dVar, Z)``), bit for bit the separate
Relu and ReluGrad passes' values, without those passes.
"""

from __future__ import annotations

import numpy as np

from dfdl.errors import ShapeError
from dfdl.ops.cpu.batch_norm_split import cpu_apply, cpu_grad_apply, cpu_grad_sums, cpu_moments
from dfdl.ops.halo import spatial_letters
from dfdl.ops.registry import DFDL_DOMAIN, TensorType, TileContext, TileSpec, register

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _x_spec(rank: int) -> str:
    return "nc" + spatial_letters(rank - 2)


def _check_x(op: str, X: TensorType) -> None:
    if X.rank < 2 or X.dtype.kind != "f":
        raise ShapeError(f"{op}: X must be a float tensor (N, C, ...), got {X.shape} {X.dtype}")


def _check_moments(op: str, M: TensorType, c: int, width: int) -> None:
    if tuple(M.shape) != (c, width):
        raise ShapeError(f"{op}: per-channel sums must have shape ({c}, {width}), got {M.shape}")


def _x_channels_view(p: np.ndarray, rank: int) -> np.ndarray:
    return np.asarray(p).reshape((1, -1) + (1,) * (rank - 2))


def _stats(M: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Batch mean and biased variance from the moments, rounded to ``dtype`` as the
    fused forward rounds them."""
    return M[:, 1].astype(dtype), (M[:, 2] / M[:, 0]).astype(dtype)


def _inv(M: np.ndarray, epsilon: float) -> np.ndarray:
    return 1.0 / np.sqrt(M[:, 2] / M[:, 0] + epsilon)


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


def _moments_kernel(X):
    return cpu_moments(X) if X.dtype in _FLOATS else BatchNormMoments(X)


@register(
    "BatchNormMoments",
    domain=DFDL_DOMAIN,
    shape=_moments_shape,
    tile=_moments_tile,
    kernels={"cpu": _moments_kernel},
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


def _apply_kernel(X, scale, B, M, *, epsilon=1e-5, relu=0):
    if X.dtype not in _FLOATS or X.ndim < 2:
        return BatchNormApply(X, scale, B, M, epsilon=epsilon, relu=relu)
    mean, var = _stats(M, X.dtype)
    return cpu_apply(X, scale, B, mean, var, epsilon, bool(relu))


@register(
    "BatchNormApply",
    domain=DFDL_DOMAIN,
    shape=_apply_shape,
    tile=_apply_tile,
    kernels={"cpu": _apply_kernel},
    differentiable=False,
)
def BatchNormApply(X, scale, B, M, *, epsilon=1e-5, relu=0):
    """Y of training-mode BatchNormalization from the batch's moments ``M`` (``relu=1``:
    ``Relu(Y)``)."""
    mean, var = _stats(M, X.dtype)
    r = X.ndim
    y = (X - _x_channels_view(mean, r)) / np.sqrt(_x_channels_view(var, r) + epsilon)
    y = (_x_channels_view(scale, r) * y + _x_channels_view(B, r)).astype(X.dtype)
    return np.where(y < 0, np.zeros_like(y), y) if relu else y


def _relu_grad(dY, Z):
    """``ReluGrad(dY, Z)`` with the ReluGrad kernel's arithmetic (``dY * 0`` where the
    Relu output ``Z`` is not positive); dY itself without Z."""
    return dY if Z is None else np.where(Z > 0, dY, dY * 0)


def _check_z(op: str, Z: TensorType | None, X: TensorType) -> None:
    if Z is not None and tuple(Z.shape) != tuple(X.shape):
        raise ShapeError(f"{op}: the Relu output Z {Z.shape} must have X's shape {X.shape}")


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
    from onnx import helper

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


def _grad_sums_kernel(dY, X, M, Z=None, *, epsilon=1e-5):
    if X.dtype not in _FLOATS or (Z is not None and Z.dtype != dY.dtype):
        return BatchNormGradSums(dY, X, M, Z, epsilon=epsilon)
    return cpu_grad_sums(dY, X, np.ascontiguousarray(M[:, 1]), _inv(M, epsilon), Z)


@register(
    "BatchNormGradSums",
    domain=DFDL_DOMAIN,
    shape=_grad_sums_shape,
    tile=_grad_sums_tile,
    kernels={"cpu": _grad_sums_kernel},
    differentiable=False,
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


def _channel_or_zeros(p, c: int) -> np.ndarray:
    if p is None:
        return np.zeros(c)
    return np.ascontiguousarray(np.asarray(p, dtype=np.float64).reshape(-1))


def _grad_apply_kernel(dY, X, scale, M, G, dMean=None, dVar=None, Z=None, *, epsilon=1e-5):
    if X.dtype not in _FLOATS or (Z is not None and Z.dtype != dY.dtype):
        return BatchNormGradApply(dY, X, scale, M, G, dMean, dVar, Z, epsilon=epsilon)
    c = X.shape[1]
    return cpu_grad_apply(
        dY,
        X,
        np.ascontiguousarray(M[:, 1]),
        _inv(M, epsilon),
        _channel_or_zeros(scale, c),
        np.ascontiguousarray(G),
        M[0, 0],
        _channel_or_zeros(dMean, c),
        _channel_or_zeros(dVar, c),
        Z,
    )


@register(
    "BatchNormGradApply",
    domain=DFDL_DOMAIN,
    shape=_grad_apply_shape,
    tile=_grad_apply_tile,
    kernels={"cpu": _grad_apply_kernel},
    differentiable=False,
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
