"""Normalization, softmax and dropout ops, their VJP rules and fused backward ops.

BatchNormalization, InstanceNormalization, LayerNormalization, Softmax, LogSoftmax and
Dropout, with ONNX (opset 13+ / latest) semantics. Axes whose result needs statistics over
the whole axis (normalized axes, softmax axis, batch axes in training mode) are never split.

The backward ops live in the ``dfdl`` domain (``dfdl.SoftmaxGrad``,
``dfdl.LayerNormalizationGrad``, ...). They compute in float64 and round once to the
output dtype; they are not differentiable themselves.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from dfdl.errors import ShapeError, UnsupportedOpError
from dfdl.ops.common import elementwise_tile, letters, normalize_axis
from dfdl.ops.cpu.norm import (
    cpu_batch_normalization,
    cpu_batch_normalization_grad,
    cpu_batch_normalization_relu,
    cpu_batch_normalization_relu_grad,
    cpu_instance_normalization,
    cpu_instance_normalization_grad,
    cpu_layer_normalization,
    cpu_layer_normalization_grad,
    cpu_layer_normalization_param_grad,
    dropout_cpu,
)
from dfdl.ops.cpu.softmax import (
    cpu_log_softmax,
    cpu_log_softmax_grad,
    cpu_softmax,
    cpu_softmax_grad,
)
from dfdl.ops.registry import DFDL_DOMAIN, TensorType, TileContext, TileSpec, defvjp, register

# ---------------------------------------------------------------------------- helpers


def _channel_view(p: np.ndarray, rank: int) -> np.ndarray:
    """A per-channel (C,) parameter reshaped to broadcast against (N, C, D1, ...)."""
    return np.reshape(p, (-1,) + (1,) * (rank - 2))


def _check_axis(axis: int, rank: int, op: str) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"{op}: axis {axis} out of range for rank {rank}", name="axis")
    return normalize_axis(axis, rank)


def _check_channels(op: str, X: TensorType, params) -> None:
    if X.rank < 2:
        raise ShapeError(f"{op}: input must have rank >= 2 (N x C x ...), got {X.shape}")
    for p in params:
        if p is not None and p.shape != (X.shape[1],):
            raise ShapeError(
                f"{op}: per-channel input must have shape ({X.shape[1]},), got {p.shape}",
                expected=(X.shape[1],),
                given=p.shape,
            )


# ------------------------------------------------------------------ BatchNormalization


def _bn_shape(inputs, consts, *, epsilon=1e-5, momentum=0.9, training_mode=0):
    X = inputs[0]
    _check_channels("BatchNormalization", X, inputs[1:5])
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
    """Per-channel batch mean and biased variance of an (N, C, ...) tensor."""
    axes = (0, *range(2, X.ndim))
    return X.mean(axis=axes), X.var(axis=axes)


@register(
    "BatchNormalization",
    shape=_bn_shape,
    tile=_bn_tile,
    kernels={"cpu": cpu_batch_normalization},
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
    s, b = _channel_view(scale, r), _channel_view(B, r)
    m, v = _channel_view(mean, r), _channel_view(var, r)
    Y = (s * (X - m) / np.sqrt(v + epsilon) + b).astype(X.dtype, copy=False)
    if not training_mode:
        return Y
    return (
        Y,
        running_mean.astype(input_mean.dtype, copy=False),
        running_var.astype(input_var.dtype, copy=False),
    )


# --------------------------------------------------------------- InstanceNormalization


def _in_shape(inputs, consts, *, epsilon=1e-5):
    _check_channels("InstanceNormalization", inputs[0], inputs[1:3])
    return [inputs[0]]


def _in_tile(ctx: TileContext) -> TileSpec:
    # statistics are per (n, c) over all spatial axes: those stay whole
    x = "nc" + "." * (ctx.inputs[0].rank - 2)
    return TileSpec(inputs=(x, "c", "c"), outputs=(x,))


@register(
    "InstanceNormalization",
    shape=_in_shape,
    tile=_in_tile,
    kernels={"cpu": cpu_instance_normalization},
)
def InstanceNormalization(input, scale, B, *, epsilon=1e-5):
    """Normalizes each (n, c) slice over its spatial axes, then applies scale and B."""
    r = input.ndim
    axes = tuple(range(2, r))
    mean = input.mean(axis=axes, keepdims=True)
    var = input.var(axis=axes, keepdims=True)
    s, b = _channel_view(scale, r), _channel_view(B, r)
    return (s * (input - mean) / np.sqrt(var + epsilon) + b).astype(input.dtype, copy=False)


# ------------------------------------------------------------------ LayerNormalization


def stash_dtype(stash_type: int) -> np.dtype:
    """The numpy dtype of LayerNormalization's ``stash_type`` (a TensorProto code)."""
    try:
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(stash_type))
    except (KeyError, TypeError, ValueError):
        dt = None
    if dt is None or dt.kind != "f" or dt.itemsize < 2:
        raise UnsupportedOpError(
            f"LayerNormalization: stash_type={stash_type} is not supported "
            "(use 1 = float32 or 11 = float64)",
            op_type="LayerNormalization",
        )
    return dt


def _ln_shape(inputs, consts, *, axis=-1, epsilon=1e-5, stash_type=1):
    X = inputs[0]
    ax = _check_axis(axis, X.rank, "LayerNormalization")
    dt = stash_dtype(stash_type)
    for p in inputs[1:3]:
        if p is not None and p.rank > X.rank:
            raise ShapeError("LayerNormalization: Scale/B rank exceeds X rank")
    stat = X.shape[:ax] + (1,) * (X.rank - ax)
    return [X, TensorType(stat, dt), TensorType(stat, dt)]


def _ln_tile(ctx: TileContext) -> TileSpec:
    X = ctx.inputs[0]
    ax = normalize_axis(ctx.attrs.get("axis", -1), X.rank)
    x = letters(ax) + "." * (X.rank - ax)
    ins = [x]
    for p in ctx.inputs[1:]:
        # Scale/B are right-aligned to X; axes before `axis` broadcast (size 1)
        ins.append(None if p is None else x[X.rank - p.rank :])
    return TileSpec(inputs=tuple(ins), outputs=(x, x, x)[: len(ctx.outputs)])


@register(
    "LayerNormalization",
    shape=_ln_shape,
    tile=_ln_tile,
    kernels={"cpu": cpu_layer_normalization},
)
def LayerNormalization(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    """Layer normalization over axes ``axis..rank-1``; returns (Y, Mean, InvStdDev).

    Statistics are computed in the ``stash_type`` precision (float32 by default), and Mean
    and InvStdDev have that dtype; the affine stage runs in X's dtype.
    """
    dt = stash_dtype(stash_type)
    ax = normalize_axis(axis, X.ndim)
    axes = tuple(range(ax, X.ndim))
    xs = X.astype(dt, copy=False)
    mean = xs.mean(axis=axes, keepdims=True)
    d = xs - mean
    var = (d * d).mean(axis=axes, keepdims=True)
    inv = np.reciprocal(np.sqrt(var + epsilon))
    Y = (d * inv).astype(X.dtype, copy=False) * Scale
    if B is not None:
        Y = Y + B
    return Y.astype(X.dtype, copy=False), mean, inv


# -------------------------------------------------------------- Softmax / LogSoftmax


def _softmax_shape(inputs, consts, *, axis=-1):
    _check_axis(axis, inputs[0].rank, "Softmax")
    return [inputs[0]]


def _softmax_tile(ctx: TileContext) -> TileSpec:
    rank = ctx.inputs[0].rank
    ax = normalize_axis(ctx.attrs.get("axis", -1), rank)
    x = letters(rank)
    x = x[:ax] + "." + x[ax + 1 :]
    return TileSpec(inputs=(x,), outputs=(x,))


@register("Softmax", shape=_softmax_shape, tile=_softmax_tile, kernels={"cpu": cpu_softmax})
def Softmax(input, *, axis=-1):
    """Softmax along one axis (opset 13)."""
    if input.size == 0:
        return input.copy()
    e = np.exp(input - input.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(input.dtype, copy=False)


@register("LogSoftmax", shape=_softmax_shape, tile=_softmax_tile, kernels={"cpu": cpu_log_softmax})
def LogSoftmax(input, *, axis=-1):
    """Log of softmax along one axis (opset 13), computed as ``x - max - log(sum(exp))``."""
    if input.size == 0:
        return input.copy()
    d = input - input.max(axis=axis, keepdims=True)
    return (d - np.log(np.exp(d).sum(axis=axis, keepdims=True))).astype(input.dtype, copy=False)


# ----------------------------------------------------------------------------- Dropout

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def global_flat_index(shape, offset=None, full_shape=None) -> np.ndarray:
    """uint64 flat index in the whole tensor (``full_shape``) of each element of the
    region of ``shape`` starting at ``offset``."""
    shape = tuple(shape)
    offset = tuple(offset) if offset is not None else (0,) * len(shape)
    full_shape = tuple(full_shape) if full_shape is not None else shape
    strides = np.cumprod((1,) + full_shape[::-1][:-1])[::-1] if full_shape else ()
    idx = np.zeros(shape, dtype=np.uint64)
    for a, n in enumerate(shape):
        ix = (np.arange(n, dtype=np.uint64) + np.uint64(offset[a])) * np.uint64(strides[a])
        idx += ix.reshape((n,) + (1,) * (len(shape) - a - 1))
    return idx


def dropout_key(seed) -> np.uint64:
    """The stream key of a Dropout seed: ``splitmix64(seed)``."""
    with np.errstate(over="ignore"):
        return _splitmix64(np.uint64(int(seed) & _M64))


def dropout_uniform(seed: int, shape, offset=None, full_shape=None) -> np.ndarray:
    """Uniform [0, 1) numbers for a region of a tensor, one per element.

    Element ``i`` (flat index in the whole tensor of ``full_shape``) gets
    ``splitmix64(key + (i + 1) * golden) / 2**64`` with ``key = splitmix64(seed)``: a
    counter-based stream, so any tile computes exactly the whole tensor's numbers.
    """
    idx = global_flat_index(shape, offset, full_shape)
    with np.errstate(over="ignore"):
        z = _splitmix64(dropout_key(seed) + (idx + np.uint64(1)) * np.uint64(_GOLDEN))
    # top 53 bits -> a double in [0, 1)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _dropout_shape(inputs, consts, *, seed=None):
    X = inputs[0]
    return [X, TensorType(X.shape, np.bool_)]


def _dropout_tile(ctx: TileContext) -> TileSpec:
    rank = ctx.inputs[0].rank
    x = letters(rank)
    full = tuple(ctx.inputs[0].shape)

    def adjust(attrs, consts, out_regions):
        # each tile hashes global element indices, so it needs its offset in the tensor
        region = out_regions[0]
        attrs = {**attrs, "_offset": tuple(s.start for s in region), "_full_shape": full}
        return attrs, consts

    ins = (x,) + tuple(None for _ in ctx.inputs[1:])
    return TileSpec(inputs=ins, outputs=(x, x)[: len(ctx.outputs)], adjust=adjust)


@register("Dropout", shape=_dropout_shape, tile=_dropout_tile, kernels={"cpu": dropout_cpu})
def Dropout(data, ratio=None, training_mode=None, *, seed=None, _offset=None, _full_shape=None):
    """Dropout (opset 22); returns ``(output, mask)``.

    In training mode element ``i`` is kept when its counter-based uniform number (from
    ``seed``, default 0, and its global flat index) is ``>= ratio``; kept elements are
    scaled by ``1 / (1 - ratio)``. ``_offset``/``_full_shape`` locate a tile in the tensor.
    """
    r = 0.5 if ratio is None else float(np.asarray(ratio).item())
    training = training_mode is not None and bool(np.asarray(training_mode).item())
    if not training or r == 0:
        # the input itself, not a copy: tiles are never written after they are made
        return data, np.ones(data.shape, dtype=np.bool_)
    if not 0 <= r <= 1:
        raise ValueError(f"Dropout: ratio must be in [0, 1], got {r}")
    u = dropout_uniform(0 if seed is None else seed, data.shape, _offset, _full_shape)
    mask = u >= r
    if r == 1:
        return np.zeros_like(data), mask
    scale = np.asarray(1.0 / (1.0 - r), dtype=data.dtype)
    out = np.where(mask, data * scale, np.zeros((), dtype=data.dtype))
    return out.astype(data.dtype, copy=False), mask


def _dropout_grad_shape(inputs, consts):
    dY, mask = inputs[0], inputs[1]
    if mask.shape != dY.shape or mask.dtype != np.bool_:
        raise ShapeError(f"dfdl.DropoutGrad: mask must be bool of shape {dY.shape}")
    return [dY]


@register(
    "DropoutGrad",
    domain=DFDL_DOMAIN,
    shape=_dropout_grad_shape,
    tile=elementwise_tile,
    differentiable=False,
)
def DropoutGrad(dY, mask, ratio=None, training_mode=None):
    """Dropout backward from the forward's mask: ``dY * mask / (1 - ratio)`` in training."""
    r = 0.5 if ratio is None else float(np.asarray(ratio).item())
    training = training_mode is not None and bool(np.asarray(training_mode).item())
    if not training or r == 0:
        return dY
    if r == 1:
        return np.zeros_like(dY)
    scale = np.asarray(1.0 / (1.0 - r), dtype=dY.dtype)
    return np.where(mask, dY * scale, np.zeros((), dtype=dY.dtype)).astype(dY.dtype, copy=False)


# ============================================================= backward ops (dfdl domain)


def _f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


def _check_like(op: str, what: str, t: TensorType | None, shape: tuple) -> None:
    if t is not None and t.shape != shape:
        raise ShapeError(f"{op}: {what} must have shape {shape}, got {t.shape}", name=what)


# ----------------------------------------------------- dfdl.BatchNormalizationGrad


def _bn_grad_shape(inputs, consts, *, epsilon=1e-5):
    dY, X, scale = inputs[0], inputs[1], inputs[2]
    _check_channels("dfdl.BatchNormalizationGrad", X, inputs[2:5])
    _check_like("dfdl.BatchNormalizationGrad", "dY", dY, X.shape)
    return [X, scale, scale]


def _bn_grad_tile(ctx: TileContext) -> TileSpec:
    # batch statistics: the batch and spatial axes stay whole, channels split
    x = ".c" + "." * (ctx.inputs[1].rank - 2)
    return TileSpec(inputs=(x, x, "c", "c", "c")[: len(ctx.inputs)], outputs=(x, "c", "c"))


def _bn_grad_compute(dY, X, scale, dMean, dVar, epsilon, axes):
    """Shared float64 math of training-mode batch- and instance-norm gradients.

    ``axes`` are the statistics axes; per-channel parameters broadcast along axis 1.
    Returns (dX, sum(dY * xhat), sum(dY)) with the sums keeping dims.
    """
    r = X.ndim
    x = _f64(X)
    cnt = int(np.prod([X.shape[a] for a in axes], dtype=np.int64))
    xc = x - x.mean(axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt((xc * xc).mean(axis=axes, keepdims=True) + epsilon)
    xhat = xc * inv
    dy = np.zeros_like(x) if dY is None else _f64(dY)
    db = dy.sum(axis=axes, keepdims=True)
    ds = (dy * xhat).sum(axis=axes, keepdims=True)
    # d/dx of scale * xhat through the batch mean and variance
    dx = _channel_view(_f64(scale), r) * inv * (dy - db / cnt - xhat * (ds / cnt))
    if dMean is not None:
        dx = dx + dMean / cnt
    if dVar is not None:
        dx = dx + dVar * (2.0 / cnt) * xc
    return dx, ds, db


@register(
    "BatchNormalizationGrad",
    domain=DFDL_DOMAIN,
    shape=_bn_grad_shape,
    tile=_bn_grad_tile,
    kernels={"cpu": cpu_batch_normalization_grad},
    differentiable=False,
)
def BatchNormalizationGrad(dY, X, scale, dMean=None, dVar=None, *, epsilon=1e-5):
    """Training-mode BatchNormalization backward; returns ``(dX, dscale, dB)``.

    Statistics are recomputed from ``X``. ``dMean``/``dVar`` (optional, per channel) are
    gradients reaching the batch mean and biased variance (through the running stats).
    A missing ``dY`` counts as zeros.
    """
    r = X.ndim
    axes = (0, *range(2, r))
    cv = None if dMean is None else _channel_view(_f64(dMean), r)
    vv = None if dVar is None else _channel_view(_f64(dVar), r)
    dx, ds, db = _bn_grad_compute(dY, X, scale, cv, vv, epsilon, axes)
    return (
        dx.astype(X.dtype),
        ds.reshape(-1).astype(scale.dtype),
        db.reshape(-1).astype(scale.dtype),
    )


# ------------------------------- dfdl.BatchNormalizationRelu / BatchNormalizationReluGrad
# A training-mode BatchNormalization whose output only a Relu reads, and the gradient
# pair behind them, fused after differentiation (dfdl/graph/fuse_norm_relu.py): one pass
# over the activation instead of two each way.


def _bn_relu_shape(inputs, consts, *, epsilon=1e-5, momentum=0.9):
    return _bn_shape(inputs, consts, epsilon=epsilon, momentum=momentum, training_mode=1)


def _bn_relu_tile(ctx: TileContext) -> TileSpec:
    x = ".c" + "." * (ctx.inputs[0].rank - 2)  # batch statistics: channels split only
    return TileSpec(inputs=(x, "c", "c", "c", "c"), outputs=(x, "c", "c")[: len(ctx.outputs)])


@register(
    "BatchNormalizationRelu",
    domain=DFDL_DOMAIN,
    shape=_bn_relu_shape,
    tile=_bn_relu_tile,
    kernels={"cpu": cpu_batch_normalization_relu},
    differentiable=False,
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
    _check_like("dfdl.BatchNormalizationReluGrad", "Z", Z, dZ.shape)
    return _bn_grad_shape([dZ, *inputs[2:]], consts, epsilon=epsilon)


def _bn_relu_grad_tile(ctx: TileContext) -> TileSpec:
    x = ".c" + "." * (ctx.inputs[2].rank - 2)
    return TileSpec(inputs=(x, x, x, "c", "c", "c")[: len(ctx.inputs)], outputs=(x, "c", "c"))


@register(
    "BatchNormalizationReluGrad",
    domain=DFDL_DOMAIN,
    shape=_bn_relu_grad_shape,
    tile=_bn_relu_grad_tile,
    kernels={"cpu": cpu_batch_normalization_relu_grad},
    differentiable=False,
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


# -------------------------------------------------- dfdl.InstanceNormalizationGrad


def _in_grad_shape(inputs, consts, *, epsilon=1e-5):
    dY, X, scale = inputs[:3]
    _check_channels("dfdl.InstanceNormalizationGrad", X, [scale])
    _check_like("dfdl.InstanceNormalizationGrad", "dY", dY, X.shape)
    nc = TensorType(X.shape[:2], scale.dtype)
    return [X, nc, nc]


def _in_grad_tile(ctx: TileContext) -> TileSpec:
    x = "nc" + "." * (ctx.inputs[1].rank - 2)
    return TileSpec(inputs=(x, x, "c"), outputs=(x, "nc", "nc"))


@register(
    "InstanceNormalizationGrad",
    domain=DFDL_DOMAIN,
    shape=_in_grad_shape,
    tile=_in_grad_tile,
    kernels={"cpu": cpu_instance_normalization_grad},
    differentiable=False,
)
def InstanceNormalizationGrad(dY, X, scale, *, epsilon=1e-5):
    """InstanceNormalization backward; returns ``(dX, dscale, dB)``.

    ``dscale``/``dB`` are per (n, c), shape (N, C): summing over n (left to the autodiff
    driver) gives the (C,) parameter gradients, and keeps the op tiled on n.
    """
    axes = tuple(range(2, X.ndim))
    dx, ds, db = _bn_grad_compute(dY, X, scale, None, None, epsilon, axes)
    nc = X.shape[:2]
    return (
        dx.astype(X.dtype),
        ds.reshape(nc).astype(scale.dtype),
        db.reshape(nc).astype(scale.dtype),
    )


# -------------------------------------------------- dfdl.LayerNormalizationGrad


def _ln_grad_shape(inputs, consts, *, axis=-1, epsilon=1e-5, stash_type=1):
    dY, X = inputs[0], inputs[1]
    ax = _check_axis(axis, X.rank, "dfdl.LayerNormalizationGrad")
    stash_dtype(stash_type)
    _check_like("dfdl.LayerNormalizationGrad", "dY", dY, X.shape)
    stat = X.shape[:ax] + (1,) * (X.rank - ax)
    for what, t in zip(("dMean", "dInvStdDev"), inputs[3:5]):
        _check_like("dfdl.LayerNormalizationGrad", what, t, stat)
    return [X]


def _ln_grad_tile(ctx: TileContext) -> TileSpec:
    X = ctx.inputs[1]
    ax = normalize_axis(ctx.attrs.get("axis", -1), X.rank)
    x = letters(ax) + "." * (X.rank - ax)
    ins = [x, x, x[X.rank - ctx.inputs[2].rank :]] + [x for _ in ctx.inputs[3:]]
    return TileSpec(inputs=tuple(ins), outputs=(x,))


@register(
    "LayerNormalizationGrad",
    domain=DFDL_DOMAIN,
    shape=_ln_grad_shape,
    tile=_ln_grad_tile,
    kernels={"cpu": cpu_layer_normalization_grad},
    differentiable=False,
)
def LayerNormalizationGrad(
    dY, X, Scale, dMean=None, dInvStdDev=None, *, axis=-1, epsilon=1e-5, stash_type=1
):
    """LayerNormalization backward for X; returns dX.

    ``dY`` (may be None) is the gradient of Y; ``dMean``/``dInvStdDev`` (optional) those
    of the Mean and InvStdDev outputs. Statistics are recomputed in float64.
    """
    ax = normalize_axis(axis, X.ndim)
    x = _f64(X)
    axes = tuple(range(ax, X.ndim))
    k = int(np.prod(X.shape[ax:], dtype=np.int64))
    xc = x - x.mean(axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt((xc * xc).mean(axis=axes, keepdims=True) + epsilon)
    dx = np.zeros_like(x)
    if dY is not None:
        g = _f64(dY) * _f64(Scale)
        xhat = xc * inv
        mg = g.mean(axis=axes, keepdims=True)
        mgx = (g * xhat).mean(axis=axes, keepdims=True)
        dx = inv * (g - mg - xhat * mgx)
    if dMean is not None:
        dx = dx + _f64(dMean) / k
    if dInvStdDev is not None:
        # d inv / dx = -inv^3 (x - mean) / k
        dx = dx - _f64(dInvStdDev) * inv**3 * xc / k
    return dx.astype(X.dtype)


def _ln_param_shape(inputs, consts, *, axis=-1, epsilon=1e-5, stash_type=1, param_axis=None):
    dY, X = inputs
    ax = _check_axis(axis, X.rank, "dfdl.LayerNormalizationParamGrad")
    pa = ax if param_axis is None else normalize_axis(param_axis, X.rank)
    if not 0 <= pa <= ax:
        raise ShapeError(f"dfdl.LayerNormalizationParamGrad: param_axis {param_axis} > axis")
    _check_like("dfdl.LayerNormalizationParamGrad", "dY", dY, X.shape)
    return [TensorType((2, *X.shape[pa:]), X.dtype)]


def _ln_param_tile(ctx: TileContext) -> TileSpec:
    X = ctx.inputs[1]
    ax = normalize_axis(ctx.attrs.get("axis", -1), X.rank)
    pa = ctx.attrs.get("param_axis")
    pa = ax if pa is None else normalize_axis(pa, X.rank)
    x = letters(ax) + "." * (X.rank - ax)
    # the axes before param_axis are summed over: partial sums per tile, tree-added
    return TileSpec(inputs=(x, x), outputs=("." + x[pa:],), reduce={c: "sum" for c in x[:pa]})


@register(
    "LayerNormalizationParamGrad",
    domain=DFDL_DOMAIN,
    shape=_ln_param_shape,
    tile=_ln_param_tile,
    kernels={"cpu": cpu_layer_normalization_param_grad},
    differentiable=False,
)
def LayerNormalizationParamGrad(dY, X, *, axis=-1, epsilon=1e-5, stash_type=1, param_axis=None):
    """Scale and bias gradients of LayerNormalization, stacked: shape (2, *X.shape[p:]).

    ``[0] = sum(dY * xhat)`` and ``[1] = sum(dY)``, both summed over the axes before
    ``p = param_axis`` (default ``axis``; smaller when Scale/B cover leading axes too).
    """
    ax = normalize_axis(axis, X.ndim)
    pa = ax if param_axis is None else normalize_axis(param_axis, X.ndim)
    x = _f64(X)
    axes = tuple(range(ax, X.ndim))
    xc = x - x.mean(axis=axes, keepdims=True)
    xhat = xc / np.sqrt((xc * xc).mean(axis=axes, keepdims=True) + epsilon)
    dy = _f64(dY)
    lead = tuple(range(pa))
    return np.stack([(dy * xhat).sum(axis=lead), dy.sum(axis=lead)]).astype(X.dtype)


# ------------------------------------------------ dfdl.SoftmaxGrad / LogSoftmaxGrad


def _softmax_grad_shape(inputs, consts, *, axis=-1):
    dY, Y = inputs
    _check_axis(axis, Y.rank, "dfdl.SoftmaxGrad")
    _check_like("dfdl.SoftmaxGrad", "dY", dY, Y.shape)
    return [Y]


def _softmax_grad_tile(ctx: TileContext) -> TileSpec:
    spec = _softmax_tile(TileContext(ctx.inputs[1:], ctx.outputs, ctx.consts[1:], ctx.attrs))
    return TileSpec(inputs=(spec.inputs[0], spec.inputs[0]), outputs=spec.outputs)


@register(
    "SoftmaxGrad",
    domain=DFDL_DOMAIN,
    shape=_softmax_grad_shape,
    tile=_softmax_grad_tile,
    kernels={"cpu": cpu_softmax_grad},
    differentiable=False,
)
def SoftmaxGrad(dY, Y, *, axis=-1):
    """Softmax backward from its output: ``dX = Y * (dY - sum(dY * Y, axis))``."""
    y, dy = _f64(Y), _f64(dY)
    return (y * (dy - (dy * y).sum(axis=axis, keepdims=True))).astype(Y.dtype)


@register(
    "LogSoftmaxGrad",
    domain=DFDL_DOMAIN,
    shape=_softmax_grad_shape,
    tile=_softmax_grad_tile,
    kernels={"cpu": cpu_log_softmax_grad},
    differentiable=False,
)
def LogSoftmaxGrad(dY, Y, *, axis=-1):
    """LogSoftmax backward from its output: ``dX = dY - exp(Y) * sum(dY, axis)``."""
    dy = _f64(dY)
    return (dy - np.exp(_f64(Y)) * dy.sum(axis=axis, keepdims=True)).astype(Y.dtype)


# ============================================================================ VJP rules


def _axes_const(b, axes) -> str:
    return b.const(list(axes), np.int64, "axes")


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
    red = _axes_const(b, (0, *range(2, r)))
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


@defvjp("InstanceNormalization")
def _in_vjp(b, node, dys):
    X, scale, _B = node.inputs
    eps = node.attrs.get("epsilon", 1e-5)
    dx, ds, db = b.op(
        "InstanceNormalizationGrad",
        [dys[0], X, scale],
        {"epsilon": eps},
        domain=DFDL_DOMAIN,
        n_outputs=3,
    )
    # ds, db are (N, C): the driver sums them over N
    return [dx, ds, db]


@defvjp("LayerNormalization")
def _ln_vjp(b, node, dys):
    ins = list(node.inputs) + [""] * (3 - len(node.inputs))
    X, scale, B = ins[:3]
    dys = list(dys) + [None] * (3 - len(dys))
    dy, dmean, dinv = dys
    keys = ("axis", "epsilon", "stash_type")
    attrs = {k: node.attrs[k] for k in keys if k in node.attrs}
    dx = b.op("LayerNormalizationGrad", [dy, X, scale, dmean, dinv], attrs, domain=DFDL_DOMAIN)
    if dy is None:
        return [dx, None, None]
    xr = b.type(X).rank
    ax = normalize_axis(attrs.get("axis", -1), xr)
    prank = max(b.type(p).rank for p in (scale, B) if p)
    both = b.op(
        "LayerNormalizationParamGrad",
        [dy, X],
        {**attrs, "param_axis": min(ax, xr - prank)},
        domain=DFDL_DOMAIN,
    )
    dscale = b.op("Gather", [both, b.const(0, np.int64, "idx")], {"axis": 0})
    db = b.op("Gather", [both, b.const(1, np.int64, "idx")], {"axis": 0}) if B else None
    return [dx, dscale, db]


@defvjp("Softmax")
def _softmax_vjp(b, node, dys):
    axis = node.attrs.get("axis", -1)
    return [b.op("SoftmaxGrad", [dys[0], node.outputs[0]], {"axis": axis}, domain=DFDL_DOMAIN)]


@defvjp("LogSoftmax")
def _log_softmax_vjp(b, node, dys):
    axis = node.attrs.get("axis", -1)
    return [b.op("LogSoftmaxGrad", [dys[0], node.outputs[0]], {"axis": axis}, domain=DFDL_DOMAIN)]


def _dropout_mask(b, node) -> str:
    """The forward Dropout node's mask output, added to the node when it lacks one.

    The backward pass must see the mask of the step's seed, which the trainer sets per
    step on the forward node only: reading its mask (rather than re-running Dropout in
    the backward graph) stays right whatever the seed.
    """
    if len(node.outputs) > 1 and node.outputs[1]:
        return node.outputs[1]
    name, k = f"{node.outputs[0]}.mask", 0
    while name in b.graph.types:
        k += 1
        name = f"{node.outputs[0]}.mask_{k}"
    node.outputs = [node.outputs[0], name, *node.outputs[2:]]
    b.graph.types[name] = TensorType(b.type(node.outputs[0]).shape, np.bool_)
    return name


@defvjp("Dropout")
def _dropout_vjp(b, node, dys):
    ins = list(node.inputs) + [""] * (3 - len(node.inputs))
    _data, ratio, tm = ins
    dy = dys[0]
    n_in = len(node.inputs)
    if dy is None:
        return [None] * n_in
    tm_value = b.graph.initializers.get(tm) if tm else np.asarray(False)
    if tm_value is not None and not bool(np.asarray(tm_value).item()):
        return [dy] + [None] * (n_in - 1)  # inference: identity
    dx = b.op("DropoutGrad", [dy, _dropout_mask(b, node), ratio, tm], domain=DFDL_DOMAIN)
    if not ratio:
        return [dx] + [None] * (n_in - 1)
    # out = mask * x / (1 - ratio)  =>  d out / d ratio = out / (1 - ratio)
    rt = b.type(ratio).dtype
    one_minus = b.op("Sub", [b.const(1.0, rt, "one"), ratio])
    dratio = b.op("Div", [b.op("Mul", [dy, node.outputs[0]]), one_minus])
    if tm_value is None:  # training_mode known only at run time
        dratio = b.op("Mul", [dratio, b.op("Cast", [tm], {"to": _onnx_type(rt)})])
    return [dx, dratio, None][:n_in]


def _onnx_type(dtype) -> int:
    return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


__all__ = [
    "BatchNormalization",
    "BatchNormalizationGrad",
    "Dropout",
    "DropoutGrad",
    "InstanceNormalization",
    "InstanceNormalizationGrad",
    "LayerNormalization",
    "LayerNormalizationGrad",
    "LayerNormalizationParamGrad",
    "LogSoftmax",
    "LogSoftmaxGrad",
    "Softmax",
    "SoftmaxGrad",
]
