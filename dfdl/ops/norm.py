"""Instance-, Layer-, Group-, RMS- and LpNormalization, their VJP rules and fused
backward ops.

ONNX semantics at the latest opset (GroupNormalization 21 with per-channel scale and
bias, RMSNormalization 23, LpNormalization 22). The axes a result needs statistics over
(an instance's spatial axes, a group's channels and spatial axes, Layer- and
RMSNormalization's axes from ``axis`` on, LpNormalization's ``axis``) are never split;
the other axes are tiled. The backward ops live in the ``dfdl`` domain
(``dfdl.InstanceNormalizationGrad``, ``dfdl.LayerNormalizationGrad``,
``dfdl.LayerNormalizationParamGrad``, ``dfdl.GroupNormalizationGrad``,
``dfdl.RMSNormalizationGrad``, ``dfdl.RMSNormalizationParamGrad``,
``dfdl.LpNormalizationGrad``); they compute in float64 and round once to the output
dtype, and are not differentiable themselves. Parameter gradients either come per
(n, c) (summed over n by the autodiff driver) or as partial sums over tiles of the
leading axes, combined by the tree reduction.

BatchNormalization is in :mod:`dfdl.ops.batch_norm`, Softmax in :mod:`dfdl.ops.softmax`,
LRN in :mod:`dfdl.ops.lrn`. The CPU kernels are in :mod:`dfdl.ops.cpu.norm`; they receive
the parameters the ``*_params`` rules here resolve (the axis made non-negative, epsilon
as a float, the stash dtype).

Example:
    >>> from dfdl.ops import REGISTRY
    >>> layer_norm = REGISTRY["LayerNormalization"].forward
    >>> y, mean, inv_std = layer_norm(np.array([[1.0, 3.0]]), np.ones(2))
    >>> y.round(3), mean
    (array([[-1.,  1.]]), array([[2.]], dtype=float32))
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from dfdl.errors import ShapeError, UnsupportedOpError
from dfdl.ops.common import letters, normalize_axis
from dfdl.ops.norm_common import (
    as_f64,
    channel_view,
    check_axis,
    check_channels,
    check_like,
    epsilon_params,
    normalize_grad,
)
from dfdl.ops.registry import DFDL_DOMAIN, TensorType, TileContext, TileSpec, defvjp, register

# --------------------------------------------------------------- InstanceNormalization


def _in_shape(inputs, consts, *, epsilon=1e-5):
    check_channels("InstanceNormalization", inputs[0], inputs[1:3])
    return [inputs[0]]


def _in_tile(ctx: TileContext) -> TileSpec:
    # statistics are per (n, c) over all spatial axes: those stay whole
    x = "nc" + "." * (ctx.inputs[0].rank - 2)
    return TileSpec(inputs=(x, "c", "c"), outputs=(x,))


@register(
    "InstanceNormalization",
    shape=_in_shape,
    tile=_in_tile,
    params=epsilon_params,
)
def InstanceNormalization(input, scale, B, *, epsilon=1e-5):
    """Normalizes each (n, c) slice over its spatial axes, then applies scale and B."""
    r = input.ndim
    axes = tuple(range(2, r))
    mean = input.mean(axis=axes, keepdims=True)
    var = input.var(axis=axes, keepdims=True)
    s, b = channel_view(scale, r), channel_view(B, r)
    return (s * (input - mean) / np.sqrt(var + epsilon) + b).astype(input.dtype, copy=False)


# ------------------------------------------------------------------ LayerNormalization


def stash_dtype(stash_type: int, op: str = "LayerNormalization") -> np.dtype:
    """The numpy dtype of a normalization's ``stash_type`` (a TensorProto code).

    Example:
        >>> stash_dtype(1), stash_dtype(11, "RMSNormalization")
        (dtype('float32'), dtype('float64'))
    """
    try:
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(stash_type))
    except (KeyError, TypeError, ValueError):
        dt = None
    if dt is None or dt.kind != "f" or dt.itemsize < 2:
        raise UnsupportedOpError(
            f"{op}: stash_type={stash_type} is not supported (use 1 = float32 or 11 = float64)",
            op_type=op,
        )
    return dt


def _ln_shape(inputs, consts, *, axis=-1, epsilon=1e-5, stash_type=1):
    X = inputs[0]
    ax = check_axis(axis, X.rank, "LayerNormalization")
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


def layer_norm_params(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1) -> dict:
    """The LayerNormalization kernels' parameters: ``axis`` made non-negative,
    ``epsilon`` as a float and ``stash``, the numpy dtype of ``stash_type``.

    Example:
        >>> p = layer_norm_params(np.ones((2, 3)), np.ones(3), stash_type=11)
        >>> p["axis"], p["stash"]
        (1, dtype('float64'))
    """
    return {
        "axis": normalize_axis(axis, X.ndim),
        "epsilon": float(epsilon),
        "stash": stash_dtype(stash_type),
    }


@register(
    "LayerNormalization",
    shape=_ln_shape,
    tile=_ln_tile,
    params=layer_norm_params,
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


# ------------------------------------------------------------------ GroupNormalization


def _group_count(X: TensorType, num_groups, op: str) -> int:
    """``num_groups`` checked against X's channels (it must divide them)."""
    if num_groups is None:
        raise ShapeError(f"{op}: attribute num_groups is required", name="num_groups")
    g = int(num_groups)
    if g < 1 or X.shape[1] % g:
        raise ShapeError(
            f"{op}: num_groups={g} must be a positive divisor of the {X.shape[1]} channels",
            name="num_groups",
        )
    return g


def _gn_shape(inputs, consts, *, epsilon=1e-5, num_groups=None, stash_type=1):
    X = inputs[0]
    check_channels("GroupNormalization", X, inputs[1:3])
    _group_count(X, num_groups, "GroupNormalization")
    stash_dtype(stash_type, "GroupNormalization")
    if X.dtype.kind != "f":
        raise UnsupportedOpError(
            f"GroupNormalization: dtype {X.dtype} is not supported", op_type="GroupNormalization"
        )
    return [X]


def _gn_tile(ctx: TileContext) -> TileSpec:
    # statistics are per (n, group) over the group's channels and all spatial axes
    x = "n" + "." * (ctx.inputs[0].rank - 1)
    return TileSpec(inputs=(x, ".", "."), outputs=(x,))


@register("GroupNormalization", shape=_gn_shape, tile=_gn_tile)
def GroupNormalization(X, scale, bias, *, epsilon=1e-5, num_groups=None, stash_type=1):
    """Normalizes each (n, group of C/num_groups channels) over its channels and spatial
    axes in the ``stash_type`` precision, then applies the per-channel scale and bias in
    X's dtype (the opset-21 form)."""
    dt = stash_dtype(stash_type, "GroupNormalization")
    n, g = X.shape[0], int(num_groups)
    xs = X.astype(dt, copy=False).reshape(n, g, -1)
    mean = xs.mean(axis=2, keepdims=True)
    d = xs - mean
    var = (d * d).mean(axis=2, keepdims=True)
    xhat = (d / np.sqrt(var + epsilon)).reshape(X.shape).astype(X.dtype, copy=False)
    r = X.ndim
    return (channel_view(scale, r) * xhat + channel_view(bias, r)).astype(X.dtype, copy=False)


# ------------------------------------------------------------------- RMSNormalization


def _rms_shape(inputs, consts, *, axis=-1, epsilon=1e-5, stash_type=1):
    X, scale = inputs[:2]
    check_axis(axis, X.rank, "RMSNormalization")
    stash_dtype(stash_type, "RMSNormalization")
    if X.dtype.kind != "f" or scale.dtype != X.dtype:
        raise UnsupportedOpError(
            f"RMSNormalization: X ({X.dtype}) and scale ({scale.dtype}) must have one float dtype",
            op_type="RMSNormalization",
        )
    try:
        ok = scale.rank <= X.rank and np.broadcast_shapes(scale.shape, X.shape) == X.shape
    except ValueError:
        ok = False
    if not ok:
        raise ShapeError(
            f"RMSNormalization: scale {scale.shape} does not broadcast to X {X.shape}",
            name="scale",
        )
    return [X]


def _trailing_tile(ctx: TileContext, x: str) -> TileSpec:
    """X spec ``x``; the other inputs right-aligned to X (Scale-like parameters)."""
    X = ctx.inputs[0]
    ins = [x] + [None if p is None else x[X.rank - p.rank :] for p in ctx.inputs[1:]]
    return TileSpec(inputs=tuple(ins), outputs=(x,))


def _rms_tile(ctx: TileContext) -> TileSpec:
    X = ctx.inputs[0]
    ax = normalize_axis(ctx.attrs.get("axis", -1), X.rank)
    return _trailing_tile(ctx, letters(ax) + "." * (X.rank - ax))


@register("RMSNormalization", shape=_rms_shape, tile=_rms_tile)
def RMSNormalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """``X / sqrt(mean(X^2) + epsilon)`` over axes ``axis..``, in the ``stash_type``
    precision and rounded to X's dtype, times ``scale`` (opset 23)."""
    dt = stash_dtype(stash_type, "RMSNormalization")
    ax = normalize_axis(axis, X.ndim)
    xs = X.astype(dt, copy=False)
    ms = (xs * xs).mean(axis=tuple(range(ax, X.ndim)), keepdims=True)
    normalized = (xs / np.sqrt(ms + epsilon)).astype(X.dtype, copy=False)
    return (normalized * scale).astype(X.dtype, copy=False)


# -------------------------------------------------------------------- LpNormalization


def _lp_check(X: TensorType, axis, p) -> int:
    if p not in (1, 2):
        raise UnsupportedOpError(
            f"LpNormalization: p={p} is not supported (the spec allows 1 and 2)",
            op_type="LpNormalization",
        )
    if X.dtype.kind != "f":
        raise UnsupportedOpError(
            f"LpNormalization: dtype {X.dtype} is not supported", op_type="LpNormalization"
        )
    return check_axis(axis, X.rank, "LpNormalization")


def _lp_shape(inputs, consts, *, axis=-1, p=2):
    _lp_check(inputs[0], axis, p)
    return [inputs[0]]


def _lp_tile(ctx: TileContext) -> TileSpec:
    X = ctx.inputs[0]
    ax = normalize_axis(ctx.attrs.get("axis", -1), X.rank)
    x = letters(ax) + "." + letters(X.rank - ax - 1, ax + 1)
    return TileSpec(inputs=(x,) * len(ctx.inputs), outputs=(x,))


def _lp_norm(x: np.ndarray, ax: int, p: int) -> np.ndarray:
    if p == 1:
        return np.abs(x).sum(axis=ax, keepdims=True)
    return np.sqrt((x * x).sum(axis=ax, keepdims=True))


@register("LpNormalization", shape=_lp_shape, tile=_lp_tile)
def LpNormalization(input, *, axis=-1, p=2):
    """``input / ||input||_p`` along ``axis`` (p 1 or 2); 0 where the norm is 0."""
    ax = normalize_axis(axis, input.ndim)
    norm = _lp_norm(input, ax, p)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.where(norm == 0, 0, input / norm)
    return y.astype(input.dtype, copy=False)


# -------------------------------------------------- dfdl.InstanceNormalizationGrad


def _in_grad_shape(inputs, consts, *, epsilon=1e-5):
    dY, X, scale = inputs[:3]
    check_channels("dfdl.InstanceNormalizationGrad", X, [scale])
    check_like("dfdl.InstanceNormalizationGrad", "dY", dY, X.shape)
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
    params=epsilon_params,
    differentiable=False,
)
def InstanceNormalizationGrad(dY, X, scale, *, epsilon=1e-5):
    """InstanceNormalization backward; returns ``(dX, dscale, dB)``.

    ``dscale``/``dB`` are per (n, c), shape (N, C): summing over n (left to the autodiff
    driver) gives the (C,) parameter gradients, and keeps the op tiled on n.
    """
    axes = tuple(range(2, X.ndim))
    dx, ds, db = normalize_grad(dY, X, scale, None, None, epsilon, axes)
    nc = X.shape[:2]
    return (
        dx.astype(X.dtype),
        ds.reshape(nc).astype(scale.dtype),
        db.reshape(nc).astype(scale.dtype),
    )


# -------------------------------------------------- dfdl.LayerNormalizationGrad


def _ln_grad_shape(inputs, consts, *, axis=-1, epsilon=1e-5, stash_type=1):
    dY, X = inputs[0], inputs[1]
    ax = check_axis(axis, X.rank, "dfdl.LayerNormalizationGrad")
    stash_dtype(stash_type)
    check_like("dfdl.LayerNormalizationGrad", "dY", dY, X.shape)
    stat = X.shape[:ax] + (1,) * (X.rank - ax)
    for what, t in zip(("dMean", "dInvStdDev"), inputs[3:5]):
        check_like("dfdl.LayerNormalizationGrad", what, t, stat)
    return [X]


def _ln_grad_tile(ctx: TileContext) -> TileSpec:
    X = ctx.inputs[1]
    ax = normalize_axis(ctx.attrs.get("axis", -1), X.rank)
    x = letters(ax) + "." * (X.rank - ax)
    ins = [x, x, x[X.rank - ctx.inputs[2].rank :]] + [x for _ in ctx.inputs[3:]]
    return TileSpec(inputs=tuple(ins), outputs=(x,))


def layer_norm_grad_params(
    dY, X, Scale, dMean=None, dInvStdDev=None, *, axis=-1, epsilon=1e-5, stash_type=1
) -> dict:
    """The LayerNormalizationGrad kernels' parameters: ``axis`` made non-negative and
    ``epsilon`` as a float (the backward recomputes its statistics in float64).

    Example:
        >>> layer_norm_grad_params(None, np.ones((2, 3)), np.ones(3))
        {'axis': 1, 'epsilon': 1e-05}
    """
    return {"axis": normalize_axis(axis, X.ndim), "epsilon": float(epsilon)}


@register(
    "LayerNormalizationGrad",
    domain=DFDL_DOMAIN,
    shape=_ln_grad_shape,
    tile=_ln_grad_tile,
    params=layer_norm_grad_params,
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
    x = as_f64(X)
    axes = tuple(range(ax, X.ndim))
    k = int(np.prod(X.shape[ax:], dtype=np.int64))
    xc = x - x.mean(axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt((xc * xc).mean(axis=axes, keepdims=True) + epsilon)
    dx = np.zeros_like(x)
    if dY is not None:
        g = as_f64(dY) * as_f64(Scale)
        xhat = xc * inv
        mg = g.mean(axis=axes, keepdims=True)
        mgx = (g * xhat).mean(axis=axes, keepdims=True)
        dx = inv * (g - mg - xhat * mgx)
    if dMean is not None:
        dx = dx + as_f64(dMean) / k
    if dInvStdDev is not None:
        # d inv / dx = -inv^3 (x - mean) / k
        dx = dx - as_f64(dInvStdDev) * inv**3 * xc / k
    return dx.astype(X.dtype)


def _ln_param_shape(inputs, consts, *, axis=-1, epsilon=1e-5, stash_type=1, param_axis=None):
    dY, X = inputs
    ax = check_axis(axis, X.rank, "dfdl.LayerNormalizationParamGrad")
    pa = ax if param_axis is None else normalize_axis(param_axis, X.rank)
    if not 0 <= pa <= ax:
        raise ShapeError(f"dfdl.LayerNormalizationParamGrad: param_axis {param_axis} > axis")
    check_like("dfdl.LayerNormalizationParamGrad", "dY", dY, X.shape)
    return [TensorType((2, *X.shape[pa:]), X.dtype)]


def _ln_param_tile(ctx: TileContext) -> TileSpec:
    X = ctx.inputs[1]
    ax = normalize_axis(ctx.attrs.get("axis", -1), X.rank)
    pa = ctx.attrs.get("param_axis")
    pa = ax if pa is None else normalize_axis(pa, X.rank)
    x = letters(ax) + "." * (X.rank - ax)
    # the axes before param_axis are summed over: partial sums per tile, tree-added
    return TileSpec(inputs=(x, x), outputs=("." + x[pa:],), reduce={c: "sum" for c in x[:pa]})


def layer_norm_param_grad_params(
    dY, X, *, axis=-1, epsilon=1e-5, stash_type=1, param_axis=None
) -> dict:
    """The LayerNormalizationParamGrad kernels' parameters: ``axis`` and ``param_axis``
    (default ``axis``) made non-negative, ``epsilon`` as a float.

    Example:
        >>> layer_norm_param_grad_params(None, np.ones((2, 3, 4)), param_axis=-2)
        {'axis': 2, 'param_axis': 1, 'epsilon': 1e-05}
    """
    ax = normalize_axis(axis, X.ndim)
    pa = ax if param_axis is None else normalize_axis(param_axis, X.ndim)
    return {"axis": ax, "param_axis": pa, "epsilon": float(epsilon)}


@register(
    "LayerNormalizationParamGrad",
    domain=DFDL_DOMAIN,
    shape=_ln_param_shape,
    tile=_ln_param_tile,
    params=layer_norm_param_grad_params,
    differentiable=False,
)
def LayerNormalizationParamGrad(dY, X, *, axis=-1, epsilon=1e-5, stash_type=1, param_axis=None):
    """Scale and bias gradients of LayerNormalization, stacked: shape (2, *X.shape[p:]).

    ``[0] = sum(dY * xhat)`` and ``[1] = sum(dY)``, both summed over the axes before
    ``p = param_axis`` (default ``axis``; smaller when Scale/B cover leading axes too).
    """
    ax = normalize_axis(axis, X.ndim)
    pa = ax if param_axis is None else normalize_axis(param_axis, X.ndim)
    x = as_f64(X)
    axes = tuple(range(ax, X.ndim))
    xc = x - x.mean(axis=axes, keepdims=True)
    xhat = xc / np.sqrt((xc * xc).mean(axis=axes, keepdims=True) + epsilon)
    dy = as_f64(dY)
    lead = tuple(range(pa))
    return np.stack([(dy * xhat).sum(axis=lead), dy.sum(axis=lead)]).astype(X.dtype)


# -------------------------------------------------- dfdl.GroupNormalizationGrad


def _gn_grad_shape(inputs, consts, *, epsilon=1e-5, num_groups=None, stash_type=1):
    dY, X, scale = inputs[:3]
    check_channels("dfdl.GroupNormalizationGrad", X, [scale])
    _group_count(X, num_groups, "dfdl.GroupNormalizationGrad")
    check_like("dfdl.GroupNormalizationGrad", "dY", dY, X.shape)
    nc = TensorType(X.shape[:2], scale.dtype)
    return [X, nc, nc]


def _gn_grad_tile(ctx: TileContext) -> TileSpec:
    x = "n" + "." * (ctx.inputs[1].rank - 1)
    return TileSpec(inputs=(x, x, "."), outputs=(x, "n.", "n."))


@register(
    "GroupNormalizationGrad",
    domain=DFDL_DOMAIN,
    shape=_gn_grad_shape,
    tile=_gn_grad_tile,
    differentiable=False,
)
def GroupNormalizationGrad(dY, X, scale, *, epsilon=1e-5, num_groups=None, stash_type=1):
    """GroupNormalization backward in float64; returns ``(dX, dscale, dB)``, the
    parameter gradients per (n, c) (the autodiff driver sums them over n)."""
    n, c, g = X.shape[0], X.shape[1], int(num_groups)
    x = as_f64(X).reshape(n, g, -1)
    dy = as_f64(dY).reshape(n, c, -1)
    xc = x - x.mean(axis=2, keepdims=True)
    inv = 1.0 / np.sqrt((xc * xc).mean(axis=2, keepdims=True) + epsilon)
    xhat = (xc * inv).reshape(n, c, -1)
    ds = (dy * xhat).sum(axis=2)
    db = dy.sum(axis=2)
    gy = (dy * as_f64(scale).reshape(1, c, 1)).reshape(n, g, -1)
    xh = xhat.reshape(n, g, -1)
    dx = inv * (gy - gy.mean(axis=2, keepdims=True) - xh * (gy * xh).mean(axis=2, keepdims=True))
    return dx.reshape(X.shape).astype(X.dtype), ds.astype(scale.dtype), db.astype(scale.dtype)


# -------------------------------------------------- dfdl.RMSNormalizationGrad


def _rms_stats(X: np.ndarray, ax: int, epsilon: float):
    """(x, 1 / rms) in float64 over axes ``ax..``."""
    x = as_f64(X)
    ms = (x * x).mean(axis=tuple(range(ax, X.ndim)), keepdims=True)
    return x, 1.0 / np.sqrt(ms + epsilon)


def _rms_grad_shape(inputs, consts, *, axis=-1, epsilon=1e-5, stash_type=1):
    dY, X = inputs[:2]
    check_axis(axis, X.rank, "dfdl.RMSNormalizationGrad")
    check_like("dfdl.RMSNormalizationGrad", "dY", dY, X.shape)
    return [X]


def _rms_grad_tile(ctx: TileContext) -> TileSpec:
    X = ctx.inputs[1]
    ax = normalize_axis(ctx.attrs.get("axis", -1), X.rank)
    x = letters(ax) + "." * (X.rank - ax)
    return TileSpec(inputs=(x, x, x[X.rank - ctx.inputs[2].rank :]), outputs=(x,))


@register(
    "RMSNormalizationGrad",
    domain=DFDL_DOMAIN,
    shape=_rms_grad_shape,
    tile=_rms_grad_tile,
    differentiable=False,
)
def RMSNormalizationGrad(dY, X, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """RMSNormalization backward for X in float64: with ``g = dY * scale`` and
    ``xhat = x / rms``, ``dX = (g - xhat * mean(g * xhat)) / rms``."""
    ax = normalize_axis(axis, X.ndim)
    x, inv = _rms_stats(X, ax, epsilon)
    axes = tuple(range(ax, X.ndim))
    g = as_f64(dY) * as_f64(scale)
    xhat = x * inv
    dx = inv * (g - xhat * (g * xhat).mean(axis=axes, keepdims=True))
    return dx.astype(X.dtype)


def _rms_param_shape(inputs, consts, *, axis=-1, epsilon=1e-5, stash_type=1, param_axis=None):
    dY, X = inputs
    ax = check_axis(axis, X.rank, "dfdl.RMSNormalizationParamGrad")
    pa = ax if param_axis is None else normalize_axis(param_axis, X.rank)
    if not 0 <= pa <= ax:
        raise ShapeError(f"dfdl.RMSNormalizationParamGrad: param_axis {param_axis} > axis")
    check_like("dfdl.RMSNormalizationParamGrad", "dY", dY, X.shape)
    return [TensorType(X.shape[pa:], X.dtype)]


def _rms_param_tile(ctx: TileContext) -> TileSpec:
    X = ctx.inputs[1]
    ax = normalize_axis(ctx.attrs.get("axis", -1), X.rank)
    pa = ctx.attrs.get("param_axis")
    pa = ax if pa is None else normalize_axis(pa, X.rank)
    x = letters(ax) + "." * (X.rank - ax)
    # the axes before param_axis are summed over: partial sums per tile, tree-added
    return TileSpec(inputs=(x, x), outputs=(x[pa:],), reduce={c: "sum" for c in x[:pa]})


@register(
    "RMSNormalizationParamGrad",
    domain=DFDL_DOMAIN,
    shape=_rms_param_shape,
    tile=_rms_param_tile,
    differentiable=False,
)
def RMSNormalizationParamGrad(dY, X, *, axis=-1, epsilon=1e-5, stash_type=1, param_axis=None):
    """RMSNormalization's scale gradient ``sum(dY * x / rms)`` over the axes before
    ``param_axis`` (default ``axis``); shape ``X.shape[param_axis:]``."""
    ax = normalize_axis(axis, X.ndim)
    pa = ax if param_axis is None else normalize_axis(param_axis, X.ndim)
    x, inv = _rms_stats(X, ax, epsilon)
    return (as_f64(dY) * x * inv).sum(axis=tuple(range(pa))).astype(X.dtype)


# -------------------------------------------------- dfdl.LpNormalizationGrad


def _lp_grad_shape(inputs, consts, *, axis=-1, p=2):
    dY, X = inputs
    _lp_check(X, axis, p)
    check_like("dfdl.LpNormalizationGrad", "dY", dY, X.shape)
    return [X]


@register(
    "LpNormalizationGrad",
    domain=DFDL_DOMAIN,
    shape=_lp_grad_shape,
    tile=_lp_tile,
    differentiable=False,
)
def LpNormalizationGrad(dY, X, *, axis=-1, p=2):
    """LpNormalization backward in float64 (0 where the norm is 0): for p=2
    ``(dY - y * sum(dY * y)) / n``, for p=1 ``dY / n - sign(x) * sum(dY * x) / n^2``."""
    ax = normalize_axis(axis, X.ndim)
    x, dy = as_f64(X), as_f64(dY)
    n = _lp_norm(x, ax, p)
    safe = np.where(n == 0, 1.0, n)
    if p == 2:
        y = x / safe
        dx = (dy - y * (dy * y).sum(axis=ax, keepdims=True)) / safe
    else:
        dx = dy / safe - np.sign(x) * (dy * x).sum(axis=ax, keepdims=True) / (safe * safe)
    return np.where(n == 0, 0.0, dx).astype(X.dtype)


# ============================================================================ VJP rules


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


@defvjp("GroupNormalization")
def _gn_vjp(b, node, dys):
    X, scale, _B = node.inputs
    keys = ("epsilon", "num_groups", "stash_type")
    attrs = {k: node.attrs[k] for k in keys if k in node.attrs}
    dx, ds, db = b.op(
        "GroupNormalizationGrad", [dys[0], X, scale], attrs, domain=DFDL_DOMAIN, n_outputs=3
    )
    # ds, db are (N, C): the driver sums them over N
    return [dx, ds, db]


@defvjp("RMSNormalization")
def _rms_vjp(b, node, dys):
    X, scale = node.inputs[:2]
    keys = ("axis", "epsilon", "stash_type")
    attrs = {k: node.attrs[k] for k in keys if k in node.attrs}
    dx = b.op("RMSNormalizationGrad", [dys[0], X, scale], attrs, domain=DFDL_DOMAIN)
    xr = b.type(X).rank
    ax = normalize_axis(attrs.get("axis", -1), xr)
    pa = min(ax, xr - b.type(scale).rank)
    ds = b.op(
        "RMSNormalizationParamGrad",
        [dys[0], X],
        {**attrs, "param_axis": pa},
        domain=DFDL_DOMAIN,
    )
    return [dx, ds]


@defvjp("LpNormalization")
def _lp_vjp(b, node, dys):
    attrs = {k: node.attrs[k] for k in ("axis", "p") if k in node.attrs}
    return [b.op("LpNormalizationGrad", [dys[0], node.inputs[0]], attrs, domain=DFDL_DOMAIN)]
