"""Convolutions: Conv and ConvTranspose, 1-D/2-D/3-D (ONNX semantics, opset 22), their
VJPs and the backward ops ``dfdl.ConvGradInput`` (a Conv's dX) and ``dfdl.ConvGradWeight``
(a Conv's dW).

The numpy forwards loop over kernel offsets and contract channels with einsum over a
padded input (Conv, ConvGradWeight) or scatter into a full-size output (ConvTranspose,
ConvGradInput); they are the oracle for the numba im2col/col2im kernels in
``dfdl.ops.cpu.conv``, which receive the params rules' resolved geometry
(:func:`conv_params` and its siblings).

Gradients: a Conv's dX is the transposed convolution of dY with the same W
(ConvGradInput), its dW correlates X with dY (ConvGradWeight, batch axis contracted) and
dB sums dY over batch and space. A ConvTranspose's dX is a Conv of dY with its W, and its
dW is a ConvGradWeight with the roles of X and dY swapped.

Example:
    >>> from dfdl.ops import REGISTRY
    >>> x = w = np.ones((1, 1, 3, 3), np.float32)
    >>> REGISTRY["Conv"].forward(x, w)
    array([[[[9.]]]], dtype=float32)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from dfdl.errors import ModelError, ShapeError, UnsupportedOpError
from dfdl.ops import halo
from dfdl.ops.registry import (
    Cost,
    TensorType,
    TileContext,
    TileSpec,
    defvjp,
    io_bytes,
    register,
)

_DTYPES = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))
_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


class Geometry(NamedTuple):
    """Per spatial axis: kernel size, stride, dilation, begin/end pads, output size."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    out: tuple[int, ...]


def _ints(op: str, name: str, value, nd: int, default: int) -> tuple[int, ...]:
    if value is None:
        return (default,) * nd
    value = tuple(int(v) for v in value)
    if len(value) != nd:
        raise ShapeError(f"{op}: {name}={list(value)} needs {nd} values", name=name)
    return value


def _common(op, x_shape, w_shape, auto_pad, dilations, kernel_shape, strides):
    if auto_pad not in _AUTO_PADS:
        raise UnsupportedOpError(f"{op}: auto_pad={auto_pad!r} is not supported", op_type=op)
    nd = len(x_shape) - 2
    if nd < 1 or len(w_shape) != len(x_shape):
        raise ShapeError(f"{op}: X {x_shape} and W {w_shape} must both have rank >= 3")
    k = tuple(int(v) for v in w_shape[2:])
    if kernel_shape is not None and tuple(kernel_shape) != k:
        raise ShapeError(f"{op}: kernel_shape={list(kernel_shape)} but W has shape {w_shape}")
    s = _ints(op, "strides", strides, nd, 1)
    d = _ints(op, "dilations", dilations, nd, 1)
    if min(s + d) < 1:
        raise ShapeError(f"{op}: strides and dilations must be >= 1")
    eff = tuple((ki - 1) * di + 1 for ki, di in zip(k, d, strict=True))
    return nd, k, s, d, eff


def conv_geometry(
    x_shape,
    w_shape,
    *,
    auto_pad="NOTSET",
    dilations=None,
    kernel_shape=None,
    pads=None,
    strides=None,
) -> Geometry:
    """Kernel, strides, dilations, resolved pads and output size of a Conv."""
    nd, k, s, d, eff = _common("Conv", x_shape, w_shape, auto_pad, dilations, kernel_shape, strides)
    n_in = x_shape[2:]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = tuple(-(-n // si) for n, si in zip(n_in, s, strict=True))
        total = [
            max(0, (o - 1) * si + e - n) for o, si, e, n in zip(out, s, eff, n_in, strict=True)
        ]
        # SAME_UPPER puts the odd extra pad at the end, SAME_LOWER at the beginning
        pb = tuple(t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total)
        pe = tuple(t - b for t, b in zip(total, pb, strict=True))
    else:
        p = (0,) * (2 * nd) if auto_pad == "VALID" else _ints("Conv", "pads", pads, 2 * nd, 0)
        pb, pe = p[:nd], p[nd:]
        out = tuple(
            (n + b + e - ef) // si + 1 for n, b, e, ef, si in zip(n_in, pb, pe, eff, s, strict=True)
        )
    if min(out) < 1:
        raise ShapeError(f"Conv: input {x_shape} too small for kernel {k} (output {out})")
    return Geometry(k, s, d, pb, pe, out)


def conv_transpose_geometry(
    x_shape,
    w_shape,
    *,
    auto_pad="NOTSET",
    dilations=None,
    kernel_shape=None,
    output_padding=None,
    output_shape=None,
    pads=None,
    strides=None,
) -> Geometry:
    """Geometry of a ConvTranspose; pads may be negative (output cropped past the end)."""
    op = "ConvTranspose"
    nd, k, s, d, eff = _common(op, x_shape, w_shape, auto_pad, dilations, kernel_shape, strides)
    n_in = x_shape[2:]
    opad = _ints(op, "output_padding", output_padding, nd, 0)
    # the output an unpadded transposed conv writes to, before output_padding
    full = tuple(si * (n - 1) + e for si, n, e in zip(s, n_in, eff, strict=True))
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if output_shape is not None:
            out = tuple(int(v) for v in output_shape)[-nd:]  # some files give (N, C, ...)
            if len(out) != nd:
                raise ShapeError(f"{op}: output_shape={list(output_shape)} needs {nd} values")
        else:
            out = tuple(n * si for n, si in zip(n_in, s, strict=True))
        total = [f + p - o for f, p, o in zip(full, opad, out, strict=True)]
        pb = tuple(t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total)
        pe = tuple(t - b for t, b in zip(total, pb, strict=True))
    else:
        p = (0,) * (2 * nd) if auto_pad == "VALID" else _ints(op, "pads", pads, 2 * nd, 0)
        pb, pe = p[:nd], p[nd:]
        out = tuple(f + p - b - e for f, p, b, e in zip(full, opad, pb, pe, strict=True))
    if min(out) < 1:
        raise ShapeError(f"{op}: output size {out} is empty (input {x_shape})")
    return Geometry(k, s, d, pb, pe, out)


def _window(a: np.ndarray, starts, sizes) -> np.ndarray:
    """``a[..., starts:starts+sizes]`` over the trailing axes, zero outside ``a``."""
    nd = len(starts)
    lead = a.shape[: a.ndim - nd]
    res = np.zeros((*lead, *sizes), a.dtype)
    src, dst = [], []
    for st, size, n in zip(starts, sizes, a.shape[a.ndim - nd :], strict=True):
        lo, hi = max(st, 0), min(st + size, n)
        if hi <= lo:
            return res
        src.append(slice(lo, hi))
        dst.append(slice(lo - st, hi - st))
    res[(..., *dst)] = a[(..., *src)]
    return res


def _acc_dtype(dtype: np.dtype) -> np.dtype:
    return np.promote_types(dtype, np.float32)  # float16 accumulates in float32


def _check_types(op, x, w, b, m):
    if x.dtype not in _DTYPES:
        raise UnsupportedOpError(f"{op}: dtype {x.dtype} is not supported", op_type=op)
    if w.dtype != x.dtype or (b is not None and b.dtype != x.dtype):
        raise ShapeError(f"{op}: X, W and B must have the same dtype")
    if b is not None and b.shape != (m,):
        raise ShapeError(f"{op}: B has shape {b.shape}, expected ({m},)", name="B")


def _geometry_params(geo: Geometry, group) -> dict:
    return {
        "kernel_shape": geo.kernel,
        "strides": geo.strides,
        "dilations": geo.dilations,
        "pads_begin": geo.pads_begin,
        "pads_end": geo.pads_end,
        "out_spatial": geo.out,
        "group": int(group),
    }


def conv_params(X, W, B=None, *, group=1, **window) -> dict:
    """The Conv kernels' parameters: :func:`conv_geometry`'s kernel, strides, dilations,
    pads and output size (``kernel_shape``, ..., ``out_spatial``) and ``group``.

    Example:
        >>> x, w = np.ones((1, 2, 5, 5), np.float32), np.ones((4, 2, 3, 3), np.float32)
        >>> conv_params(x, w, pads=[1, 1, 1, 1], strides=[2, 2])["out_spatial"]
        (3, 3)
    """
    return _geometry_params(conv_geometry(X.shape, W.shape, **window), group)


def conv_transpose_params(X, W, B=None, *, group=1, **window) -> dict:
    """The ConvTranspose kernels' parameters: :func:`conv_transpose_geometry` as
    :func:`conv_params` gives a Conv's, and ``group``.

    Example:
        >>> x, w = np.ones((1, 2, 3, 3), np.float32), np.ones((2, 4, 3, 3), np.float32)
        >>> conv_transpose_params(x, w, strides=[2, 2])["out_spatial"]
        (7, 7)
    """
    return _geometry_params(conv_transpose_geometry(X.shape, W.shape, **window), group)


def conv_grad_input_params(dY, W, *, group=1, input_shape=None, **window) -> dict:
    """The ConvGradInput kernels' parameters: the forward Conv's geometry (as
    :func:`conv_params`) and ``input_shape``, the shape of dX, as a tuple.

    Example:
        >>> dy, w = np.ones((1, 4, 3, 3), np.float32), np.ones((4, 2, 3, 3), np.float32)
        >>> conv_grad_input_params(dy, w, pads=[1] * 4, input_shape=[1, 2, 3, 3])["input_shape"]
        (1, 2, 3, 3)
    """
    shape = tuple(int(v) for v in input_shape)
    geo = conv_geometry(shape, W.shape, **window)
    return {**_geometry_params(geo, group), "input_shape": shape}


def conv_grad_weight_params(X, dY, *, group=1, weight_shape=None, **window) -> dict:
    """The ConvGradWeight kernels' parameters: the forward Conv's geometry (as
    :func:`conv_params`) and ``weight_shape``, the shape of dW, as a tuple.

    Example:
        >>> x, dy = np.ones((1, 2, 3, 3), np.float32), np.ones((1, 4, 3, 3), np.float32)
        >>> conv_grad_weight_params(x, dy, pads=[1] * 4, weight_shape=[4, 2, 3, 3])["pads_end"]
        (1, 1)
    """
    wshape = tuple(int(v) for v in weight_shape)
    geo = conv_geometry(X.shape, wshape, **window)
    return {**_geometry_params(geo, group), "weight_shape": wshape}


# ----------------------------------------------------------------------------- Conv


def _conv_shape(inputs, consts, *, group=1, **attrs):
    x, w, b = (list(inputs) + [None])[:3]
    geo = conv_geometry(x.shape, w.shape, **attrs)
    m = w.shape[0]
    if group < 1 or x.shape[1] != w.shape[1] * group or m % group:
        raise ShapeError(f"Conv: X {x.shape}, W {w.shape} do not fit group={group}")
    _check_types("Conv", x, w, b, m)
    return [TensorType((x.shape[0], m, *geo.out), x.dtype)]


# Spatial tiling (see dfdl.ops.halo): every op here splits its spatial axes into slabs;
# a Conv-like read of X takes a halo'd slab of it, a scatter (ConvTranspose, the Conv's
# dX) takes the sources that reach the tile; each task gets its own explicit pads.

_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _gather_halo(x: TensorType, geo: Geometry, ranges_of: str, read: int):
    """windows + tile_attrs for a Conv-like read of input ``read`` (shape ``x``), tiled
    along the letters ``ranges_of`` (one per spatial axis, in the Conv's output space)."""
    windows, pads = halo.gather_halo(
        x.shape[2:], geo.kernel, geo.strides, geo.dilations, geo.pads_begin, ranges_of, read
    )

    def tile_attrs(attrs, ranges):
        return {**attrs, "auto_pad": "NOTSET", "pads": pads(ranges)}

    return windows, tile_attrs


def _scatter_halo(src: TensorType, geo: Geometry, ranges_of: str, read: int, drop=()):
    """windows + tile_attrs for a scatter of input ``read`` (shape ``src``) into outputs
    tiled along ``ranges_of``; ``drop`` names attributes the explicit pads replace."""
    windows, pads = halo.scatter_halo(
        src.shape[2:], geo.kernel, geo.strides, geo.dilations, geo.pads_begin, ranges_of, read
    )

    def tile_attrs(attrs, ranges):
        kept = {k: v for k, v in attrs.items() if k not in drop}
        return {**kept, "auto_pad": "NOTSET", "pads": pads(ranges)}

    return windows, tile_attrs


def _geometry_attrs(attrs, names=_CONV_ATTRS) -> dict:
    return {k: attrs[k] for k in names if k != "group" and attrs.get(k) is not None}


def _conv_tile(ctx: TileContext) -> TileSpec:
    x, w, b = (list(ctx.inputs) + [None])[:3]
    sp = halo.spatial_letters(x.rank - 2)
    k = "." * (x.rank - 2)
    geo = conv_geometry(x.shape, w.shape, **_geometry_attrs(ctx.attrs))
    windows, tile_attrs = _gather_halo(x, geo, sp, read=0)
    if ctx.attrs.get("group", 1) == 1:
        # input channels c are contracted: partial sums over c tiles; bias added once
        return TileSpec(
            inputs=("nc" + sp, "oc" + k, None if b is None else "o"),
            outputs=("no" + sp,),
            reduce={"c": "sum"},
            first_only={2},
            windows=windows,
            spatial=sp,
            tile_attrs=tile_attrs,
        )
    return TileSpec(
        inputs=("n." + sp, ".." + k, None if b is None else "."),
        outputs=("n." + sp,),
        windows=windows,
        spatial=sp,
        tile_attrs=tile_attrs,
    )


def _conv_cost(inputs, outputs, **attrs) -> Cost:
    return Cost(2 * outputs[0].size * math.prod(inputs[1].shape[1:]), io_bytes(inputs, outputs))


def _conv_transpose_cost(inputs, outputs, **attrs) -> Cost:
    flops = 2 * inputs[0].size * math.prod(inputs[1].shape[1:])
    return Cost(flops, io_bytes(inputs, outputs))


@register(
    "Conv",
    shape=_conv_shape,
    tile=_conv_tile,
    params=conv_params,
    contraction=True,
    cost=_conv_cost,
)
def Conv(
    X,
    W,
    B=None,
    *,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    pads=None,
    strides=None,
):
    """N-D convolution (cross-correlation) with groups, strides, dilations and pads."""
    geo = conv_geometry(
        X.shape,
        W.shape,
        auto_pad=auto_pad,
        dilations=dilations,
        kernel_shape=kernel_shape,
        pads=pads,
        strides=strides,
    )
    n, c = X.shape[:2]
    m = W.shape[0]
    cg, mg = c // group, m // group
    size = [x + b + e for x, b, e in zip(X.shape[2:], geo.pads_begin, geo.pads_end, strict=True)]
    xp = _window(X, [-b for b in geo.pads_begin], size)
    y = np.zeros((n, m, *geo.out), _acc_dtype(X.dtype))
    for off in np.ndindex(*geo.kernel):
        # input positions o*s + off*d for every output position o
        sl = tuple(
            slice(o * d, o * d + s * (n_out - 1) + 1, s)
            for o, d, s, n_out in zip(off, geo.dilations, geo.strides, geo.out, strict=True)
        )
        xs = xp[(slice(None), slice(None), *sl)]
        for g in range(group):
            w = W[(slice(g * mg, (g + 1) * mg), slice(None), *off)]
            y[:, g * mg : (g + 1) * mg] += np.einsum(
                "nc...,mc->nm...", xs[:, g * cg : (g + 1) * cg], w
            )
    if B is not None:
        y += B.reshape((1, m) + (1,) * len(geo.out))
    return y.astype(X.dtype)


# -------------------------------------------------------------------- ConvTranspose


def _conv_transpose_shape(inputs, consts, *, group=1, **attrs):
    x, w, b = (list(inputs) + [None])[:3]
    geo = conv_transpose_geometry(x.shape, w.shape, **attrs)
    m = w.shape[1] * group
    if group < 1 or x.shape[1] != w.shape[0] or x.shape[1] % group:
        raise ShapeError(f"ConvTranspose: X {x.shape}, W {w.shape} do not fit group={group}")
    _check_types("ConvTranspose", x, w, b, m)
    return [TensorType((x.shape[0], m, *geo.out), x.dtype)]


def _conv_transpose_tile(ctx: TileContext) -> TileSpec:
    x, w, b = (list(ctx.inputs) + [None])[:3]
    sp = halo.spatial_letters(x.rank - 2)
    k = "." * (x.rank - 2)
    names = (*_CONV_ATTRS, "output_padding", "output_shape")
    geo = conv_transpose_geometry(x.shape, w.shape, **_geometry_attrs(ctx.attrs, names))
    # each tile scatters its sources with explicit pads: output_padding/output_shape and
    # SAME padding are folded into them
    windows, tile_attrs = _scatter_halo(x, geo, sp, read=0, drop=("output_padding", "output_shape"))
    if ctx.attrs.get("group", 1) == 1:
        # W is (C_in, C_out, k...): input channels c are contracted
        return TileSpec(
            inputs=("nc" + sp, "co" + k, None if b is None else "o"),
            outputs=("no" + sp,),
            reduce={"c": "sum"},
            first_only={2},
            windows=windows,
            spatial=sp,
            tile_attrs=tile_attrs,
        )
    return TileSpec(
        inputs=("n." + sp, ".." + k, None if b is None else "."),
        outputs=("n." + sp,),
        windows=windows,
        spatial=sp,
        tile_attrs=tile_attrs,
    )


@register(
    "ConvTranspose",
    shape=_conv_transpose_shape,
    tile=_conv_transpose_tile,
    params=conv_transpose_params,
    contraction=True,
    cost=_conv_transpose_cost,
)
def ConvTranspose(
    X,
    W,
    B=None,
    *,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    output_padding=None,
    output_shape=None,
    pads=None,
    strides=None,
):
    """N-D transposed convolution with groups, strides, dilations, pads, output_padding
    and output_shape."""
    geo = conv_transpose_geometry(
        X.shape,
        W.shape,
        auto_pad=auto_pad,
        dilations=dilations,
        kernel_shape=kernel_shape,
        output_padding=output_padding,
        output_shape=output_shape,
        pads=pads,
        strides=strides,
    )
    n, c = X.shape[:2]
    mg = W.shape[1]
    m, cg = mg * group, c // group
    n_in = X.shape[2:]
    full = [
        s * (i - 1) + (k - 1) * d + 1
        for s, i, k, d in zip(geo.strides, n_in, geo.kernel, geo.dilations, strict=True)
    ]
    yf = np.zeros((n, m, *full), _acc_dtype(X.dtype))
    for off in np.ndindex(*geo.kernel):
        # input position i lands on output position i*s + off*d
        sl = tuple(
            slice(o * d, o * d + s * (i - 1) + 1, s)
            for o, d, s, i in zip(off, geo.dilations, geo.strides, n_in, strict=True)
        )
        for g in range(group):
            w = W[(slice(g * cg, (g + 1) * cg), slice(None), *off)]
            yf[(slice(None), slice(g * mg, (g + 1) * mg), *sl)] += np.einsum(
                "nc...,cm->nm...", X[:, g * cg : (g + 1) * cg], w
            )
    y = _window(yf, geo.pads_begin, geo.out)
    if B is not None:
        y += B.reshape((1, m) + (1,) * len(geo.out))
    return y.astype(X.dtype)


# ------------------------------------------------------------------ backward ops
# Both take the forward Conv's attributes verbatim plus the shape of the tensor they
# produce (``input_shape`` / ``weight_shape``), which each tile rewrites to its own.


def _shape_attr(op: str, name: str, value, rank: int) -> tuple[int, ...]:
    if value is None:
        raise ModelError(f"{op}: attribute {name} is required")
    shape = tuple(int(v) for v in value)
    if len(shape) != rank:
        raise ShapeError(f"{op}: {name}={list(shape)} must have rank {rank}", name=name)
    return shape


def _check_grad_geometry(op, x_shape, w_shape, dy, group, attrs) -> None:
    geo = conv_geometry(x_shape, w_shape, **attrs)
    m = w_shape[0]
    if group < 1 or x_shape[1] != w_shape[1] * group or m % group:
        raise ShapeError(f"{op}: X {x_shape}, W {w_shape} do not fit group={group}")
    want = (x_shape[0], m, *geo.out)
    if dy.shape != want:
        raise ShapeError(f"{op}: dY has shape {dy.shape}, expected {want}", name="dY")


def _conv_grad_input_shape(inputs, consts, *, group=1, input_shape=None, **attrs):
    dy, w = inputs[:2]
    shape = _shape_attr("ConvGradInput", "input_shape", input_shape, dy.rank)
    _check_types("ConvGradInput", dy, w, None, 0)
    _check_grad_geometry("ConvGradInput", shape, w.shape, dy, group, attrs)
    return [TensorType(shape, dy.dtype)]


def _set_shape_attr(name: str):
    """adjust(): the shape attribute becomes the tile's output shape."""

    def adjust(attrs, consts, out_regions):
        return {**attrs, name: [r.stop - r.start for r in out_regions[0]]}, consts

    return adjust


def _conv_grad_input_tile(ctx: TileContext) -> TileSpec:
    dy, w = ctx.inputs[:2]
    sp = halo.spatial_letters(dy.rank - 2)
    k = "." * (dy.rank - 2)
    adjust = _set_shape_attr("input_shape")
    geo = conv_geometry(ctx.outputs[0].shape, w.shape, **_geometry_attrs(ctx.attrs))
    # dX is dY scattered back through W: a dX tile takes the dY slab that reaches it
    windows, tile_attrs = _scatter_halo(dy, geo, sp, read=0)
    common = dict(adjust=adjust, windows=windows, spatial=sp, tile_attrs=tile_attrs)
    if ctx.attrs.get("group", 1) == 1:
        # output channels m of the forward are contracted: partial dX per m tile
        return TileSpec(
            inputs=("nm" + sp, "mc" + k), outputs=("nc" + sp,), reduce={"m": "sum"}, **common
        )
    return TileSpec(inputs=("n." + sp, ".." + k), outputs=("n." + sp,), **common)


@register(
    "ConvGradInput",
    domain="dfdl",
    shape=_conv_grad_input_shape,
    tile=_conv_grad_input_tile,
    params=conv_grad_input_params,
    contraction=True,
    differentiable=False,
)
def ConvGradInput(
    dY,
    W,
    *,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    pads=None,
    strides=None,
    input_shape=None,
):
    """Gradient of ``Conv(X, W)`` with respect to X (of shape ``input_shape``), given dY.

    The Conv attributes are those of the forward node (auto_pad resolved against
    ``input_shape``).
    """
    shape = tuple(int(v) for v in input_shape)
    geo = conv_geometry(
        shape,
        W.shape,
        auto_pad=auto_pad,
        dilations=dilations,
        kernel_shape=kernel_shape,
        pads=pads,
        strides=strides,
    )
    n, c = shape[:2]
    m = W.shape[0]
    cg, mg = c // group, m // group
    size = [x + b + e for x, b, e in zip(shape[2:], geo.pads_begin, geo.pads_end, strict=True)]
    dtype, acc = dY.dtype, _acc_dtype(dY.dtype)
    dY, W = dY.astype(acc, copy=False), W.astype(acc, copy=False)
    dxp = np.zeros((n, c, *size), acc)
    for off in np.ndindex(*geo.kernel):
        # output position o read the padded input at o*s + off*d: scatter dY back there
        sl = tuple(
            slice(o * d, o * d + s * (n_out - 1) + 1, s)
            for o, d, s, n_out in zip(off, geo.dilations, geo.strides, geo.out, strict=True)
        )
        for g in range(group):
            w = W[(slice(g * mg, (g + 1) * mg), slice(None), *off)]
            dxp[(slice(None), slice(g * cg, (g + 1) * cg), *sl)] += np.einsum(
                "nm...,mc->nc...", dY[:, g * mg : (g + 1) * mg], w
            )
    return _window(dxp, geo.pads_begin, shape[2:]).astype(dtype)


def _conv_grad_weight_shape(inputs, consts, *, group=1, weight_shape=None, **attrs):
    x, dy = inputs[:2]
    shape = _shape_attr("ConvGradWeight", "weight_shape", weight_shape, x.rank)
    _check_types("ConvGradWeight", x, dy, None, 0)
    _check_grad_geometry("ConvGradWeight", x.shape, shape, dy, group, attrs)
    return [TensorType(shape, x.dtype)]


def _conv_grad_weight_tile(ctx: TileContext) -> TileSpec:
    x = ctx.inputs[0]
    sp = halo.spatial_letters(x.rank - 2)
    k = "." * (x.rank - 2)
    adjust = _set_shape_attr("weight_shape")
    geo = conv_geometry(x.shape, ctx.outputs[0].shape, **_geometry_attrs(ctx.attrs))
    # batch and dY's spatial axes are contracted: each (batch, slab) tile gives a partial
    # dW from its dY slab and the halo'd X slab under it, summed by a tree
    windows, tile_attrs = _gather_halo(x, geo, sp, read=0)
    reduce = {"n": "sum", **{ch: "sum" for ch in sp}}
    common = dict(adjust=adjust, windows=windows, spatial=sp, tile_attrs=tile_attrs)
    if ctx.attrs.get("group", 1) == 1:
        return TileSpec(inputs=("nc" + sp, "nm" + sp), outputs=("mc" + k,), reduce=reduce, **common)
    return TileSpec(inputs=("n." + sp, "n." + sp), outputs=(".." + k,), reduce=reduce, **common)


@register(
    "ConvGradWeight",
    domain="dfdl",
    shape=_conv_grad_weight_shape,
    tile=_conv_grad_weight_tile,
    params=conv_grad_weight_params,
    contraction=True,
    differentiable=False,
)
def ConvGradWeight(
    X,
    dY,
    *,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    pads=None,
    strides=None,
    weight_shape=None,
):
    """Gradient of ``Conv(X, W)`` with respect to W (of shape ``weight_shape``), given dY.

    The Conv attributes are those of the forward node.
    """
    wshape = tuple(int(v) for v in weight_shape)
    geo = conv_geometry(
        X.shape,
        wshape,
        auto_pad=auto_pad,
        dilations=dilations,
        kernel_shape=kernel_shape,
        pads=pads,
        strides=strides,
    )
    c, m = X.shape[1], wshape[0]
    cg, mg = c // group, m // group
    size = [x + b + e for x, b, e in zip(X.shape[2:], geo.pads_begin, geo.pads_end, strict=True)]
    acc = _acc_dtype(X.dtype)
    xp = _window(X.astype(acc, copy=False), [-b for b in geo.pads_begin], size)
    dY = dY.astype(acc, copy=False)
    dw = np.zeros(wshape, acc)
    for off in np.ndindex(*geo.kernel):
        sl = tuple(
            slice(o * d, o * d + s * (n_out - 1) + 1, s)
            for o, d, s, n_out in zip(off, geo.dilations, geo.strides, geo.out, strict=True)
        )
        xs = xp[(slice(None), slice(None), *sl)]
        for g in range(group):
            # sum over batch and output positions of dY[n, m, o] * X[n, c, o*s + off*d]
            dw[(slice(g * mg, (g + 1) * mg), slice(None), *off)] = np.tensordot(
                dY[:, g * mg : (g + 1) * mg],
                xs[:, g * cg : (g + 1) * cg],
                axes=([0, *range(2, dY.ndim)], [0, *range(2, dY.ndim)]),
            )
    return dw.astype(X.dtype)


# ------------------------------------------------------------------------- VJPs


def _bias_grad(b, dy: str) -> str:
    """dB: dY summed over batch and spatial axes."""
    axes = [0, *range(2, b.type(dy).rank)]
    return b.op("ReduceSum", [dy, b.const(axes, np.int64, "axes")], {"keepdims": 0})


@defvjp("Conv")
def _conv_vjp(b, node, dys):
    x, w = node.inputs[:2]
    has_bias = len(node.inputs) > 2 and bool(node.inputs[2])
    dy = dys[0]
    attrs = {k: node.attrs[k] for k in _CONV_ATTRS if node.attrs.get(k) is not None}
    dx = b.op(
        "ConvGradInput",
        [dy, w],
        {**attrs, "input_shape": list(b.type(x).shape)},
        domain="dfdl",
    )
    dw = b.op(
        "ConvGradWeight",
        [x, dy],
        {**attrs, "weight_shape": list(b.type(w).shape)},
        domain="dfdl",
    )
    return [dx, dw, _bias_grad(b, dy) if has_bias else None]


def _transpose_adjoint(n_in, n_out, k, s, d, pb) -> tuple[tuple[int, int], tuple[int, int]]:
    """For one spatial axis of a ConvTranspose (input size ``n_in``, output ``n_out``):
    the slice ``(start, stop)`` of dY and the non-negative Conv pads ``(begin, end)``
    such that ``Conv(dY[start:stop], W, pads)`` has size ``n_in`` and reads dY at
    ``i*s + k*d - pb`` (the positions input i was scattered to)."""
    start = max(0, -pb)  # a negative pad grew the output at the start: skip those
    begin = max(0, pb)
    length = s * (n_in - 1) + (k - 1) * d + 1  # padded length a Conv with n_in outputs needs
    size = n_out - start
    if size + begin <= length + s - 1:
        return (start, n_out), (begin, max(0, length - size - begin))
    return (start, start + length - begin), (begin, 0)  # dY longer than any read: crop


@defvjp("ConvTranspose")
def _conv_transpose_vjp(b, node, dys):
    x, w = node.inputs[:2]
    has_bias = len(node.inputs) > 2 and bool(node.inputs[2])
    dy = dys[0]
    xt, wt = b.type(x), b.type(w)
    names = ("auto_pad", "dilations", "kernel_shape", "output_padding", "output_shape")
    names += ("pads", "strides")
    geo = conv_transpose_geometry(
        xt.shape, wt.shape, **{k: node.attrs[k] for k in names if node.attrs.get(k) is not None}
    )
    nd = xt.rank - 2
    sl, pads = [], [0] * (2 * nd)
    for i in range(nd):
        (lo, hi), (pads[i], pads[nd + i]) = _transpose_adjoint(
            xt.shape[2 + i],
            geo.out[i],
            geo.kernel[i],
            geo.strides[i],
            geo.dilations[i],
            geo.pads_begin[i],
        )
        sl.append((lo, hi))
    dyc = dy
    if any(lo != 0 or hi != n for (lo, hi), n in zip(sl, geo.out, strict=True)):
        dyc = b.op(
            "Slice",
            [
                dy,
                b.const([lo for lo, _ in sl], np.int64, "starts"),
                b.const([hi for _, hi in sl], np.int64, "ends"),
                b.const(list(range(2, 2 + nd)), np.int64, "axes"),
            ],
        )
    attrs = {
        "strides": list(geo.strides),
        "dilations": list(geo.dilations),
        "pads": pads,
        "group": int(node.attrs.get("group", 1)),
    }
    # the adjoint of scattering X through W is correlating dY with the same W
    dx = b.op("Conv", [dyc, w], attrs)
    # dW[c, m, k] = sum X[n, c, i] dY[n, m, i*s + k*d - pb]: a Conv weight gradient with
    # dY as the Conv's input and X as its output gradient
    dw = b.op("ConvGradWeight", [dyc, x], {**attrs, "weight_shape": list(wt.shape)}, domain="dfdl")
    return [dx, dw, _bias_grad(b, dy) if has_bias else None]
