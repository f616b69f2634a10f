"""Normalization, softmax and dropout ops.

BatchNormalization, InstanceNormalization, LayerNormalization, Softmax, LogSoftmax and
Dropout, with ONNX (opset 13+ / latest) semantics. Axes whose result needs statistics over
the whole axis (normalized axes, softmax axis, batch axes in training mode) are never split.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from dfdl.errors import ShapeError, UnsupportedOpError
from dfdl.ops.common import letters, normalize_axis
from dfdl.ops.cpu.norm import (
    cpu_batch_normalization,
    cpu_instance_normalization,
    cpu_layer_normalization,
)
from dfdl.ops.cpu.softmax import cpu_log_softmax, cpu_softmax
from dfdl.ops.registry import TensorType, TileContext, TileSpec, register

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


def dropout_uniform(seed: int, shape, offset=None, full_shape=None) -> np.ndarray:
    """Uniform [0, 1) numbers for a region of a tensor, one per element.

    Element ``i`` (flat index in the whole tensor of ``full_shape``) gets
    ``splitmix64(key + (i + 1) * golden) / 2**64`` with ``key = splitmix64(seed)``: a
    counter-based stream, so any tile computes exactly the whole tensor's numbers.
    """
    shape = tuple(shape)
    offset = tuple(offset) if offset is not None else (0,) * len(shape)
    full_shape = tuple(full_shape) if full_shape is not None else shape
    strides = np.cumprod((1,) + full_shape[::-1][:-1])[::-1] if full_shape else ()
    idx = np.zeros(shape, dtype=np.uint64)
    for a, n in enumerate(shape):
        ix = (np.arange(n, dtype=np.uint64) + np.uint64(offset[a])) * np.uint64(strides[a])
        idx += ix.reshape((n,) + (1,) * (len(shape) - a - 1))
    with np.errstate(over="ignore"):
        key = _splitmix64(np.uint64(int(seed) & _M64))
        z = _splitmix64(key + (idx + np.uint64(1)) * np.uint64(_GOLDEN))
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


@register("Dropout", shape=_dropout_shape, tile=_dropout_tile)
def Dropout(data, ratio=None, training_mode=None, *, seed=None, _offset=None, _full_shape=None):
    """Dropout (opset 22); returns ``(output, mask)``.

    In training mode element ``i`` is kept when its counter-based uniform number (from
    ``seed``, default 0, and its global flat index) is ``>= ratio``; kept elements are
    scaled by ``1 / (1 - ratio)``. ``_offset``/``_full_shape`` locate a tile in the tensor.
    """
    r = 0.5 if ratio is None else float(np.asarray(ratio).item())
    training = training_mode is not None and bool(np.asarray(training_mode).item())
    if not training or r == 0:
        return data.copy(), np.ones(data.shape, dtype=np.bool_)
    if not 0 <= r <= 1:
        raise ValueError(f"Dropout: ratio must be in [0, 1], got {r}")
    u = dropout_uniform(0 if seed is None else seed, data.shape, _offset, _full_shape)
    mask = u >= r
    if r == 1:
        return np.zeros_like(data), mask
    scale = np.asarray(1.0 / (1.0 - r), dtype=data.dtype)
    out = np.where(mask, data * scale, np.zeros((), dtype=data.dtype))
    return out.astype(data.dtype, copy=False), mask


__all__ = [
    "BatchNormalization",
    "Dropout",
    "InstanceNormalization",
    "LayerNormalization",
    "LogSoftmax",
    "Softmax",
]
