"""Pooling: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool (1-D/2-D/3-D).

Window geometry follows the ONNX spec (and onnxruntime/PyTorch): window ``o`` along an
axis starts at ``o * stride - pad_begin`` and takes ``kernel`` taps ``dilation`` apart;
taps outside the input are skipped (max) or not counted (average, unless
``count_include_pad``, which counts taps inside the explicit padding but never those of
the ``ceil_mode`` overhang). In ``ceil_mode`` a last window starting in the right padding
is dropped.

Tiling: batch and channels are independent; MaxPool and AveragePool also split spatial
axes into slabs, each reading the halo its windows need (:mod:`dfdl.ops.halo`). When a
MaxPool node asks for its ``Indices`` output nothing is split, because the indices are
flat offsets into the whole input tensor. The global pools and the gradient ops keep
spatial axes whole.

Training: ``dfdl.MaxPoolGrad(dY, X)`` routes each output gradient to the first max of its
window (the forward's tie rule) and ``dfdl.AveragePoolGrad(dY; input_shape)`` spreads it
over the window's counted taps; both tile like the forward (batch and channels). The
global pools' VJPs reuse them with one window covering all spatial axes.

The CPU kernels (:mod:`dfdl.ops.cpu.pool`) receive the resolved window geometry of
:func:`pool_params` and the rules next to it.

Example:
    >>> from dfdl.ops import REGISTRY
    >>> x = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
    >>> REGISTRY["MaxPool"].forward(x, kernel_shape=[2, 2])[0].ravel()
    array([3.], dtype=float32)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from dfdl.errors import ModelError, ShapeError, UnsupportedOpError
from dfdl.ops import halo
from dfdl.ops.common import letters, whole_tile
from dfdl.ops.registry import TensorType, TileContext, TileSpec, defvjp, register

_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclass(frozen=True)
class PoolGeometry:
    """Resolved window geometry of one pooling node (one entry per spatial axis)."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    out: tuple[int, ...]


def pool_geometry(
    op: str,
    spatial: tuple[int, ...],
    kernel_shape,
    strides=None,
    pads=None,
    auto_pad: str = "NOTSET",
    dilations=None,
    ceil_mode: int = 0,
) -> PoolGeometry:
    """Resolve kernel/strides/dilations/pads and the output spatial shape.

    Raises:
        ModelError: missing or malformed attributes.
        ShapeError: the window does not fit the input (empty output).
    """
    nd = len(spatial)
    if not kernel_shape or len(kernel_shape) != nd:
        raise ModelError(f"{op}: kernel_shape {kernel_shape} must have {nd} values")
    k = tuple(int(v) for v in kernel_shape)
    s = tuple(int(v) for v in strides) if strides else (1,) * nd
    d = tuple(int(v) for v in dilations) if dilations else (1,) * nd
    if len(s) != nd or len(d) != nd or min(k + s + d) < 1:
        raise ModelError(f"{op}: strides {s} / dilations {d} must be {nd} positive values")
    if auto_pad not in _AUTO_PADS:
        raise ModelError(f"{op}: unknown auto_pad {auto_pad!r}")
    p = [int(v) for v in pads] if pads else [0] * (2 * nd)
    if auto_pad == "NOTSET" and (len(p) != 2 * nd or min(p, default=0) < 0):
        raise ModelError(f"{op}: pads {p} must be {2 * nd} non-negative values")
    pb, pe, out = [], [], []
    for i, L in enumerate(spatial):
        ek = (k[i] - 1) * d[i] + 1  # dilated window extent
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-L // s[i])
            total = max(0, (o - 1) * s[i] + ek - L)
            # the odd pad goes to the end (SAME_UPPER) or the beginning (SAME_LOWER)
            b = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            e = total - b
        else:  # explicit pads; VALID means zero pads (ceil_mode still applies, as in onnx)
            b, e = (p[i], p[nd + i]) if auto_pad == "NOTSET" else (0, 0)
            num = L + b + e - ek
            if ceil_mode:
                o = -(-num // s[i]) + 1
                if (o - 1) * s[i] >= L + b:  # last window would start in the right padding
                    o -= 1
            else:
                o = num // s[i] + 1
        pb.append(b)
        pe.append(e)
        out.append(o)
    if min(out, default=1) < 1:
        raise ShapeError(
            f"{op}: kernel {k} (dilations {d}) does not fit input {tuple(spatial)} "
            f"(output spatial shape {tuple(out)})",
            given=tuple(spatial),
        )
    return PoolGeometry(k, s, d, tuple(pb), tuple(pe), tuple(out))


def _tap_span(o_count: int, L: int, s: int, d: int, pb: int, t: int) -> tuple[int, int]:
    """Outputs ``[lo, hi)`` whose tap ``t`` falls inside the input ``[0, L)``."""
    off = t * d - pb  # input position of tap t for output 0
    lo = max(0, -(off // s) if off < 0 else 0)
    hi = min(o_count, (L - 1 - off) // s + 1) if L - 1 - off >= 0 else 0
    return lo, max(lo, hi)


def _taps(x_spatial, g: PoolGeometry):
    """Yield ``(tap_index, out_slices, in_slices)`` for every kernel tap with any overlap."""
    for flat, tap in enumerate(itertools.product(*(range(k) for k in g.kernel))):
        out_sl, in_sl = [], []
        for L, o, s, d, pb, t in zip(
            x_spatial, g.out, g.strides, g.dilations, g.pads_begin, tap, strict=True
        ):
            lo, hi = _tap_span(o, L, s, d, pb, t)
            if hi <= lo:
                break
            start = lo * s + t * d - pb
            out_sl.append(slice(lo, hi))
            in_sl.append(slice(start, start + (hi - lo - 1) * s + 1, s))
        else:
            yield flat, (Ellipsis, *out_sl), (Ellipsis, *in_sl)


def _counts(x_spatial, g: PoolGeometry, include_pad: bool) -> np.ndarray:
    """Divisor of each average window: product over axes of counted taps."""
    total = np.ones((1,) * len(g.out))
    for ax, (L, o, k, s, d, pb, pe) in enumerate(
        zip(
            x_spatial,
            g.out,
            g.kernel,
            g.strides,
            g.dilations,
            g.pads_begin,
            g.pads_end,
            strict=True,
        )
    ):
        pos = np.arange(o)[:, None] * s - pb + np.arange(k)[None, :] * d
        ok = pos < L + pe if include_pad else (pos >= 0) & (pos < L)
        shape = [1] * len(g.out)
        shape[ax] = o
        total = total * ok.sum(axis=1).reshape(shape)
    return total


def max_pool_numpy(X: np.ndarray, g: PoolGeometry, storage_order: int = 0):
    """MaxPool values and flat argmax indices with plain numpy (any dtype)."""
    N, C, *sp = X.shape
    shape = (N, C, *g.out)
    Y = np.zeros(shape, X.dtype)
    tap = np.full(shape, -1, np.int64)
    have = np.zeros(shape, bool)
    for flat, out_sl, in_sl in _taps(sp, g):
        v, cur, h = X[in_sl], Y[out_sl], have[out_sl]
        upd = ~h | (v > cur)  # first valid tap wins ties, as in the spec's scan order
        np.copyto(cur, v, where=upd)
        tap[out_sl][upd] = flat
        h[...] = True
    # decode the winning tap into input coordinates, then into flat tensor offsets
    t = np.unravel_index(np.maximum(tap, 0), g.kernel)
    coords = []
    for ax in range(len(sp)):
        o = np.arange(g.out[ax]).reshape([-1 if i == ax else 1 for i in range(len(sp))])
        coords.append(o * g.strides[ax] - g.pads_begin[ax] + t[ax] * g.dilations[ax])
    order = "C" if storage_order == 0 else "F"
    # windows without any valid tap get -1 below; clip keeps their dummy coords legal
    spatial_flat = np.ravel_multi_index(coords, sp, mode="clip", order=order)
    nc = np.arange(N * C).reshape((N, C) + (1,) * len(sp))
    idx = nc * int(np.prod(sp, dtype=np.int64)) + spatial_flat
    idx = np.where(have, idx, -1).astype(np.int64)
    return Y, idx


def avg_pool_numpy(X: np.ndarray, g: PoolGeometry, count_include_pad: int = 0) -> np.ndarray:
    """AveragePool with plain numpy."""
    N, C, *sp = X.shape
    acc_dtype = np.float32 if X.dtype == np.float16 else X.dtype
    acc = np.zeros((N, C, *g.out), acc_dtype)
    for _, out_sl, in_sl in _taps(sp, g):
        acc[out_sl] += X[in_sl]
    div = _counts(sp, g, bool(count_include_pad)).astype(acc_dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (acc / div).astype(X.dtype, copy=False)


def _check_x(op: str, X: TensorType | None, float_only: bool) -> None:
    if X is None or X.rank < 3:
        raise ShapeError(f"{op}: input must be (N, C, D1, ...), got {X and X.shape}")
    if X.dtype.kind not in ("f" if float_only else "fiu"):
        raise UnsupportedOpError(f"{op}: dtype {X.dtype} is not supported", op_type=op)


def _max_pool_shape(inputs, consts, **attrs) -> list[TensorType]:
    X = inputs[0]
    _check_x("MaxPool", X, float_only=False)
    g = _geometry_from_attrs("MaxPool", X.shape, attrs)
    shape = X.shape[:2] + g.out
    return [TensorType(shape, X.dtype), TensorType(shape, np.int64)]


def _avg_pool_shape(inputs, consts, **attrs) -> list[TensorType]:
    X = inputs[0]
    _check_x("AveragePool", X, float_only=True)
    g = _geometry_from_attrs("AveragePool", X.shape, attrs)
    return [TensorType(X.shape[:2] + g.out, X.dtype)]


def _global_shape(op: str):
    def rule(inputs, consts, **attrs) -> list[TensorType]:
        X = inputs[0]
        _check_x(op, X, float_only=True)
        return [TensorType(X.shape[:2] + (1,) * (X.rank - 2), X.dtype)]

    return rule


def _geometry_from_attrs(op: str, shape, attrs) -> PoolGeometry:
    if attrs.get("storage_order", 0) not in (0, 1):
        raise ModelError(f"{op}: storage_order must be 0 or 1")
    return pool_geometry(
        op,
        tuple(shape[2:]),
        attrs.get("kernel_shape"),
        attrs.get("strides"),
        attrs.get("pads"),
        attrs.get("auto_pad", "NOTSET"),
        attrs.get("dilations"),
        attrs.get("ceil_mode", 0),
    )


def pool_tile(ctx: TileContext) -> TileSpec:
    """Global pools: batch and channels tiled, spatial axes whole."""
    spec = letters(2) + "." * (ctx.inputs[0].rank - 2)
    return TileSpec(inputs=(spec,), outputs=(spec,))


def window_pool_tile(ctx: TileContext) -> TileSpec:
    """MaxPool/AveragePool: batch, channels and spatial slabs (with halos) tiled.

    Each spatial tile reads the slab its windows cover and gets explicit pads for the
    part that lies outside X. Nothing is split when Indices is requested (flat offsets
    into the whole X); an AveragePool counting pads in ceil mode keeps spatial axes whole
    when a window overhangs the explicit pads (the overhang is not counted, explicit
    pads are, and a tile could not tell them apart).
    """
    if len(ctx.outputs) > 1:
        return whole_tile(ctx)
    x = ctx.inputs[0]
    nd = x.rank - 2
    g = _geometry_from_attrs("pool", x.shape, ctx.attrs)
    eff = [(k - 1) * d + 1 for k, d in zip(g.kernel, g.dilations, strict=True)]
    stops = [(o - 1) * s - pb + e for o, s, pb, e in zip(g.out, g.strides, g.pads_begin, eff)]
    overhang = any(st > n + pe for st, n, pe in zip(stops, x.shape[2:], g.pads_end))
    if overhang and ctx.attrs.get("count_include_pad", 0):
        spec = letters(2) + "." * nd
        return TileSpec(inputs=(spec,), outputs=(spec,))
    sp = halo.spatial_letters(nd)
    windows, pads = halo.gather_halo(
        x.shape[2:], g.kernel, g.strides, g.dilations, g.pads_begin, sp, read=0
    )

    def tile_attrs(attrs, ranges):
        # the tile's windows all fit its slab + pads: floor mode gives its exact count
        return {**attrs, "auto_pad": "NOTSET", "pads": pads(ranges), "ceil_mode": 0}

    spec = letters(2) + sp
    return TileSpec(
        inputs=(spec,), outputs=(spec,), windows=windows, spatial=sp, tile_attrs=tile_attrs
    )


def _geometry_params(g: PoolGeometry) -> dict:
    return {
        "kernel_shape": g.kernel,
        "strides": g.strides,
        "dilations": g.dilations,
        "pads_begin": g.pads_begin,
        "pads_end": g.pads_end,
        "out_spatial": g.out,
    }


def pool_params(
    X,
    *,
    auto_pad="NOTSET",
    ceil_mode=0,
    dilations=None,
    kernel_shape=None,
    pads=None,
    storage_order=0,
    strides=None,
) -> dict:
    """The MaxPool kernels' parameters: :func:`pool_geometry`'s windows and output size
    (``kernel_shape``, ``strides``, ``dilations``, ``pads_begin``, ``pads_end``,
    ``out_spatial``) and ``storage_order`` as an int.

    Example:
        >>> pool_params(np.ones((1, 1, 5, 5)), kernel_shape=[3, 3], strides=[2, 2])["out_spatial"]
        (2, 2)
    """
    g = pool_geometry(
        "MaxPool", X.shape[2:], kernel_shape, strides, pads, auto_pad, dilations, ceil_mode
    )
    return {**_geometry_params(g), "storage_order": int(storage_order)}


def average_pool_params(
    X,
    *,
    auto_pad="NOTSET",
    ceil_mode=0,
    count_include_pad=0,
    dilations=None,
    kernel_shape=None,
    pads=None,
    strides=None,
) -> dict:
    """The AveragePool kernels' parameters: the windows as :func:`pool_params` gives
    them, and ``count_include_pad`` as a bool.

    Example:
        >>> average_pool_params(np.ones((1, 1, 4)), kernel_shape=[2], pads=[1, 0])["pads_begin"]
        (1,)
    """
    g = pool_geometry(
        "AveragePool", X.shape[2:], kernel_shape, strides, pads, auto_pad, dilations, ceil_mode
    )
    return {**_geometry_params(g), "count_include_pad": bool(count_include_pad)}


@register("MaxPool", shape=_max_pool_shape, tile=window_pool_tile, params=pool_params)
def MaxPool(
    X,
    *,
    auto_pad="NOTSET",
    ceil_mode=0,
    dilations=None,
    kernel_shape=None,
    pads=None,
    storage_order=0,
    strides=None,
):
    """ONNX MaxPool; returns ``(Y, Indices)`` (flat offsets into X, int64)."""
    g = pool_geometry(
        "MaxPool", X.shape[2:], kernel_shape, strides, pads, auto_pad, dilations, ceil_mode
    )
    return max_pool_numpy(X, g, storage_order)


@register(
    "AveragePool",
    shape=_avg_pool_shape,
    tile=window_pool_tile,
    params=average_pool_params,
)
def AveragePool(
    X,
    *,
    auto_pad="NOTSET",
    ceil_mode=0,
    count_include_pad=0,
    dilations=None,
    kernel_shape=None,
    pads=None,
    strides=None,
):
    """ONNX AveragePool."""
    g = pool_geometry(
        "AveragePool", X.shape[2:], kernel_shape, strides, pads, auto_pad, dilations, ceil_mode
    )
    return avg_pool_numpy(X, g, count_include_pad)


@register("GlobalAveragePool", shape=_global_shape("GlobalAveragePool"), tile=pool_tile)
def GlobalAveragePool(X):
    """Mean over all spatial axes (kept as size 1)."""
    return np.mean(X, axis=tuple(range(2, X.ndim)), keepdims=True).astype(X.dtype, copy=False)


@register("GlobalMaxPool", shape=_global_shape("GlobalMaxPool"), tile=pool_tile)
def GlobalMaxPool(X):
    """Max over all spatial axes (kept as size 1)."""
    return np.max(X, axis=tuple(range(2, X.ndim)), keepdims=True)


# ---------------------------------------------------------------- backward (VJP) ops
# dfdl.MaxPoolGrad / dfdl.AveragePoolGrad compute dX from dY with the forward's window
# geometry; the global pools reuse them with one window covering every spatial axis.


def max_pool_grad_numpy(dY: np.ndarray, X: np.ndarray, g: PoolGeometry) -> np.ndarray:
    """dX of MaxPool: each dY element goes to the first max of its window (numpy)."""
    _, idx = max_pool_numpy(X, g)
    acc_dtype = np.float32 if X.dtype == np.float16 else X.dtype
    dx = np.zeros(X.size, acc_dtype)
    valid = idx >= 0  # windows lying entirely in the padding have no input to feed
    np.add.at(dx, idx[valid], dY[valid].astype(acc_dtype))
    return dx.reshape(X.shape).astype(X.dtype, copy=False)


def avg_pool_grad_numpy(
    dY: np.ndarray, input_shape, g: PoolGeometry, count_include_pad: int = 0
) -> np.ndarray:
    """dX of AveragePool: each dY element spread evenly over its window's counted taps."""
    sp = tuple(input_shape[2:])
    acc_dtype = np.float32 if dY.dtype == np.float16 else dY.dtype
    div = _counts(sp, g, bool(count_include_pad)).astype(acc_dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = dY.astype(acc_dtype) / div
    dx = np.zeros(dY.shape[:2] + sp, acc_dtype)
    for _, out_sl, in_sl in _taps(sp, g):
        dx[in_sl] += share[out_sl]  # one tap maps distinct outputs to distinct inputs
    return dx.astype(dY.dtype, copy=False)


def _check_grad(op: str, dY: TensorType, input_shape, g: PoolGeometry) -> None:
    want = tuple(input_shape[:2]) + g.out
    if dY.shape != want:
        raise ShapeError(f"{op}: dY has shape {dY.shape}, expected {want}", given=dY.shape)


def _max_pool_grad_shape(inputs, consts, **attrs) -> list[TensorType]:
    dY, X = inputs[0], inputs[1]
    _check_x("MaxPoolGrad", X, float_only=True)
    g = _geometry_from_attrs("MaxPoolGrad", X.shape, attrs)
    _check_grad("MaxPoolGrad", dY, X.shape, g)
    return [X]


def _avg_pool_grad_shape(inputs, consts, *, input_shape=None, **attrs) -> list[TensorType]:
    dY = inputs[0]
    if not input_shape:
        raise ModelError("AveragePoolGrad: attribute input_shape is required")
    shape = tuple(int(v) for v in input_shape)
    _check_x("AveragePoolGrad", TensorType(shape, dY.dtype), float_only=True)
    g = _geometry_from_attrs("AveragePoolGrad", shape, attrs)
    _check_grad("AveragePoolGrad", dY, shape, g)
    return [TensorType(shape, dY.dtype)]


def _max_pool_grad_tile(ctx: TileContext) -> TileSpec:
    """Batch, channels and spatial slabs of dX tiled.

    A dX slab ``[lo, hi)`` takes the dY rows whose windows reach it (a scatter halo) and
    the X rows those windows cover in full (a gather halo of those rows), so each window
    finds the same first max as untiled; the task computes dX over its X slab (explicit
    pads for what lies outside X) and keeps ``[lo, hi)`` (the ``dfdl_crop`` attribute).
    """
    x = ctx.inputs[1]
    nd = x.rank - 2
    g = _geometry_from_attrs("MaxPoolGrad", x.shape, ctx.attrs)
    eff = [(k - 1) * d + 1 for k, d in zip(g.kernel, g.dilations, strict=True)]
    sp = halo.spatial_letters(nd)
    rows = [
        halo.scatter_window(e, s, p, o) for e, s, p, o in zip(eff, g.strides, g.pads_begin, g.out)
    ]
    reads = [halo.gather_window(e, s, p) for e, s, p in zip(eff, g.strides, g.pads_begin)]
    windows = {}
    for a in range(nd):
        windows[(0, 2 + a)] = rows[a]
        windows[(1, 2 + a)] = lambda lo, hi, a=a: reads[a](*rows[a](lo, hi))

    def tile_attrs(attrs, ranges):
        begin, end, crop = [], [], []
        for a, ch in enumerate(sp):
            lo, hi = ranges[ch]
            first, stop = rows[a](lo, hi)
            b, e = halo.gather_pads(
                eff[a], g.strides[a], g.pads_begin[a], x.shape[2 + a], first, stop
            )
            begin.append(b)
            end.append(e)
            crop += [lo - max(0, reads[a](first, stop)[0]), hi - lo]
        return {
            **attrs,
            "auto_pad": "NOTSET",
            "pads": begin + end,
            "ceil_mode": 0,
            "dfdl_crop": crop,
        }

    spec = letters(2) + sp
    return TileSpec(
        inputs=(spec, spec), outputs=(spec,), windows=windows, spatial=sp, tile_attrs=tile_attrs
    )


def _avg_pool_grad_tile(ctx: TileContext) -> TileSpec:
    """Batch and channels tiled; each tile's ``input_shape`` becomes its dX tile shape."""
    spec = letters(2) + "." * (ctx.outputs[0].rank - 2)

    def adjust(attrs, consts, out_regions):
        shape = [r.stop - r.start for r in out_regions[0]]
        return {**attrs, "input_shape": shape}, consts

    return TileSpec(inputs=(spec,), outputs=(spec,), adjust=adjust)


def max_pool_grad_params(
    dY,
    X,
    *,
    auto_pad="NOTSET",
    ceil_mode=0,
    dilations=None,
    kernel_shape=None,
    pads=None,
    strides=None,
    dfdl_crop=None,
) -> dict:
    """The MaxPoolGrad kernels' parameters: the forward's windows (as :func:`pool_params`)
    and ``crop``, the slab of dX the tile keeps (:func:`dfdl.ops.halo.crop_slab`; None:
    all of it) as a tuple.

    Example:
        >>> x = np.ones((1, 1, 6))
        >>> max_pool_grad_params(x[..., :3], x, kernel_shape=[2], strides=[2])["crop"] is None
        True
    """
    g = pool_geometry(
        "MaxPoolGrad", X.shape[2:], kernel_shape, strides, pads, auto_pad, dilations, ceil_mode
    )
    crop = None if dfdl_crop is None else tuple(int(v) for v in dfdl_crop)
    return {**_geometry_params(g), "crop": crop}


def average_pool_grad_params(
    dY,
    *,
    input_shape=None,
    auto_pad="NOTSET",
    ceil_mode=0,
    count_include_pad=0,
    dilations=None,
    kernel_shape=None,
    pads=None,
    strides=None,
) -> dict:
    """The AveragePoolGrad kernels' parameters: the forward's windows (as
    :func:`average_pool_params`) and ``input_shape``, the shape of dX, as a tuple.

    Example:
        >>> dy = np.ones((1, 1, 2))
        >>> average_pool_grad_params(dy, input_shape=[1, 1, 4], kernel_shape=[2],
        ...                          strides=[2])["input_shape"]
        (1, 1, 4)
    """
    shape = tuple(int(v) for v in input_shape)
    g = pool_geometry(
        "AveragePoolGrad", shape[2:], kernel_shape, strides, pads, auto_pad, dilations, ceil_mode
    )
    return {
        **_geometry_params(g),
        "count_include_pad": bool(count_include_pad),
        "input_shape": shape,
    }


@register(
    "MaxPoolGrad",
    domain="dfdl",
    shape=_max_pool_grad_shape,
    tile=_max_pool_grad_tile,
    params=max_pool_grad_params,
    differentiable=False,
)
def MaxPoolGrad(
    dY,
    X,
    *,
    auto_pad="NOTSET",
    ceil_mode=0,
    dilations=None,
    kernel_shape=None,
    pads=None,
    strides=None,
    dfdl_crop=None,
):
    """dX of ``MaxPool(X)`` given dY (ties: the first max in scan order, as the forward).
    ``dfdl_crop`` (set by the tile rule, never in a model) keeps one slab of dX."""
    g = pool_geometry(
        "MaxPoolGrad", X.shape[2:], kernel_shape, strides, pads, auto_pad, dilations, ceil_mode
    )
    return halo.crop_slab(max_pool_grad_numpy(dY, X, g), dfdl_crop)


@register(
    "AveragePoolGrad",
    domain="dfdl",
    shape=_avg_pool_grad_shape,
    tile=_avg_pool_grad_tile,
    params=average_pool_grad_params,
    differentiable=False,
)
def AveragePoolGrad(
    dY,
    *,
    input_shape=None,
    auto_pad="NOTSET",
    ceil_mode=0,
    count_include_pad=0,
    dilations=None,
    kernel_shape=None,
    pads=None,
    strides=None,
):
    """dX of ``AveragePool(X)`` given dY; ``input_shape`` is X's shape."""
    sp = tuple(int(v) for v in input_shape[2:])
    g = pool_geometry(
        "AveragePoolGrad", sp, kernel_shape, strides, pads, auto_pad, dilations, ceil_mode
    )
    return avg_pool_grad_numpy(dY, input_shape, g, count_include_pad)


def _pool_attrs(node, drop=()) -> dict:
    return {k: v for k, v in node.attrs.items() if k not in drop}


@defvjp("MaxPool")
def _max_pool_vjp(b, node, dys):
    if dys[0] is None:  # only Indices is used: integer, no gradient
        return [None]
    attrs = _pool_attrs(node, drop=("storage_order",))
    return [b.op("MaxPoolGrad", [dys[0], node.inputs[0]], attrs, domain="dfdl")]


@defvjp("AveragePool")
def _avg_pool_vjp(b, node, dys):
    attrs = {**_pool_attrs(node), "input_shape": list(b.type(node.inputs[0]).shape)}
    return [b.op("AveragePoolGrad", [dys[0]], attrs, domain="dfdl")]


@defvjp("GlobalMaxPool")
def _global_max_pool_vjp(b, node, dys):
    # a global max is a MaxPool whose single window is the whole spatial extent
    spatial = list(b.type(node.inputs[0]).shape[2:])
    attrs = {"kernel_shape": spatial}
    return [b.op("MaxPoolGrad", [dys[0], node.inputs[0]], attrs, domain="dfdl")]


@defvjp("GlobalAveragePool")
def _global_avg_pool_vjp(b, node, dys):
    shape = list(b.type(node.inputs[0]).shape)
    attrs = {"kernel_shape": shape[2:], "input_shape": shape}
    return [b.op("AveragePoolGrad", [dys[0]], attrs, domain="dfdl")]
