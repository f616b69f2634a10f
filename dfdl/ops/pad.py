"""Pad (opset 25: modes constant, reflect, edge and wrap) and its backward op
``dfdl.PadGrad``.

``pads`` (``[x1_begin, x2_begin, ..., x1_end, x2_end, ...]`` over ``axes``, every axis by
default), ``constant_value`` and ``axes`` are plan-time constants. A negative pad removes
elements: each axis is first cropped by its negative pads, then padded by its positive
ones (what onnxruntime computes in every mode; onnx's reference evaluator refuses
negative pads). ``reflect`` mirrors about the edge element without repeating it and, as
``numpy.pad`` does, keeps reflecting where a pad is longer than the axis; ``edge`` and
``wrap`` need a non-empty axis to pad from.

Tiling never changes the math: an axis without pads is tiled as is. A padded axis is
tiled in constant and edge mode: an output tile ``[lo, hi)`` reads the input slab its
elements come from (the elements at the axis's ends for edge padding) and pads it with
its own non-negative pads (:func:`pad_slab`). In reflect and wrap mode a tile near one
end reads the other end (wrap) or an input range that a pad of the slab cannot reproduce
(reflect), so those axes are whole on every tile.

VJPs: constant padding's gradient is ``Pad`` of ``dY`` with the pads negated (it crops
what was padded and puts zeros where the forward cropped), which tiles like the forward;
reflect, edge and wrap also add the padded elements' gradients back onto the elements
they copy: ``dfdl.PadGrad``, a scatter-add along each padded axis.

Example:
    >>> from dfdl.ops import REGISTRY
    >>> REGISTRY["Pad"].forward(np.arange(3.0), np.array([2, -1]), mode="reflect")
    array([2., 1., 0., 1.])
"""

from __future__ import annotations

import numpy as np

from dfdl.errors import ModelError, ShapeError, UnsupportedOpError
from dfdl.ops.common import letters, normalize_axis
from dfdl.ops.registry import DFDL_DOMAIN, TensorType, TileContext, TileSpec, defvjp, register

MODES = ("constant", "reflect", "edge", "wrap")


def _ints(x) -> list[int]:
    return [int(v) for v in np.asarray(x).reshape(-1)]


def pad_mode(mode) -> str:
    """The Pad ``mode`` attribute, checked.

    Example:
        >>> pad_mode("edge")
        'edge'
    """
    if mode not in MODES:
        raise UnsupportedOpError(
            f"Pad: mode {mode!r} is not supported; use one of {', '.join(MODES)}",
            op_type="Pad",
        )
    return mode


def pad_widths(shape: tuple[int, ...], pads, axes=None) -> list[tuple[int, int]]:
    """``(begin, end)`` pads of every axis of ``shape`` from ONNX ``pads`` and ``axes``.

    Example:
        >>> pad_widths((4, 5), [1, 2], axes=[-1])
        [(0, 0), (1, 2)]
    """
    rank = len(shape)
    p = _ints(pads)
    if axes is None:
        ax = list(range(rank))
    else:
        ax = []
        for a in _ints(axes):
            if not -rank <= a < rank:
                raise ModelError(f"Pad: axis {a} is out of range for rank {rank}")
            ax.append(normalize_axis(a, rank))
        if len(set(ax)) != len(ax):
            raise ModelError(f"Pad: repeated axis in {_ints(axes)}")
    if len(p) != 2 * len(ax):
        raise ShapeError(f"Pad: pads has {len(p)} values; {len(ax)} padded axes need {2 * len(ax)}")
    widths = [(0, 0)] * rank
    for i, a in enumerate(ax):
        widths[a] = (p[i], p[len(ax) + i])
    return widths


def _kept(width: tuple[int, int], d: int) -> tuple[int, int]:
    """The input range ``[c0, c1)`` an axis keeps after its negative pads crop it."""
    begin, end = width
    return max(-begin, 0), d - max(-end, 0)


def _check(shape: tuple[int, ...], widths, mode: str) -> None:
    for a, ((begin, end), d) in enumerate(zip(widths, shape, strict=True)):
        c0, c1 = _kept((begin, end), d)
        if c1 < c0:
            raise ShapeError(f"Pad: pads ({begin}, {end}) crop more than axis {a} of size {d}")
        if mode != "constant" and c1 == c0 and (begin > 0 or end > 0):
            raise ShapeError(f"Pad: mode {mode!r} cannot pad axis {a}: it has no elements")


def _fill(constant_value, dtype: np.dtype):
    """The constant mode's fill value as a scalar of ``dtype`` (0 / False by default)."""
    if constant_value is None:
        return np.zeros((), dtype)[()]
    v = np.asarray(constant_value)
    if v.size != 1:
        raise ShapeError(f"Pad: constant_value must be a scalar, got shape {v.shape}")
    return v.reshape(()).astype(dtype)[()]


def _pad_shape(inputs, consts, *, mode="constant", **attrs):
    data = inputs[0]
    widths = pad_widths(data.shape, consts[1], consts[3] if len(consts) > 3 else None)
    _check(data.shape, widths, pad_mode(mode))
    shape = tuple(d + b + e for d, (b, e) in zip(data.shape, widths, strict=True))
    return [TensorType(shape, data.dtype)]


def pad_slab(mode: str, width: tuple[int, int], d: int, lo: int, hi: int):
    """The input slab ``[s, t)`` that the outputs ``[lo, hi)`` of a constant- or
    edge-padded axis (``width`` = its ``(begin, end)`` pads, ``d`` its input size) copy,
    and the tile's own ``(begin, end)`` pads of that slab (never negative).

    Edge padding reads at least one element: the edge that a tile lying wholly in the
    padding repeats.

    Example:
        >>> pad_slab("constant", (2, 1), 4, 0, 3)
        ((0, 1), (2, 0))
        >>> pad_slab("edge", (2, 1), 4, 5, 7)
        ((3, 4), (0, 1))
    """
    begin = width[0]
    c0, c1 = _kept(width, d)
    if mode == "edge" and c1 > c0:
        s = min(max(lo - begin, c0), c1 - 1)
        t = min(max(hi - begin, s + 1), c1)
    else:
        s = min(max(lo - begin, c0), c1)
        t = min(max(hi - begin, s), c1)
    n, kept = hi - lo, t - s
    tile_begin = min(max(s - (lo - begin), 0), n - kept)
    return (s, t), (tile_begin, n - kept - tile_begin)


def _slab_window(mode: str, width: tuple[int, int], d: int):
    def window(lo: int, hi: int) -> tuple[int, int]:
        return pad_slab(mode, width, d, lo, hi)[0]

    return window


def _pad_tile(ctx: TileContext) -> TileSpec:
    shape = ctx.inputs[0].shape
    consts = ctx.consts
    widths = pad_widths(shape, consts[1], consts[3] if len(consts) > 3 else None)
    mode = pad_mode(ctx.attrs.get("mode", "constant"))
    names = letters(len(shape))
    spec, windows = [], {}
    for a, (ch, w) in enumerate(zip(names, widths, strict=True)):
        if w == (0, 0):
            spec.append(ch)
        elif mode in ("constant", "edge"):
            spec.append(ch)
            windows[(0, a)] = _slab_window(mode, w, shape[a])
        else:
            spec.append(".")  # reflect / wrap: the whole axis on every tile
    windowed = {a for _, a in windows}

    def adjust(attrs, consts, out_regions):
        tile = list(widths)
        for a in windowed:
            region = out_regions[0][a]
            tile[a] = pad_slab(mode, widths[a], shape[a], region.start, region.stop)[1]
        consts = dict(consts)
        consts[1] = np.array([b for b, _ in tile] + [e for _, e in tile], np.int64)
        if 3 in consts:  # the tile's pads cover every axis
            consts[3] = np.arange(len(shape), dtype=np.int64)
        return attrs, consts

    s = "".join(spec)
    extra = (None,) * (len(ctx.inputs) - 1)
    return TileSpec(inputs=(s, *extra), outputs=(s,), windows=windows, adjust=adjust)


@register("Pad", shape=_pad_shape, tile=_pad_tile, const_inputs=(1, 2, 3))
def Pad(data, pads, constant_value=None, axes=None, *, mode="constant"):
    """Pad ``data`` by ``pads`` on ``axes`` (negative pads crop first); see the module
    docstring for the modes."""
    data = np.asarray(data)
    mode = pad_mode(mode)
    widths = pad_widths(data.shape, pads, axes)
    _check(data.shape, widths, mode)
    kept = data[tuple(slice(*_kept(w, d)) for w, d in zip(widths, data.shape, strict=True))]
    grow = [(max(b, 0), max(e, 0)) for b, e in widths]
    if mode == "constant":
        return np.pad(
            kept, grow, mode="constant", constant_values=_fill(constant_value, data.dtype)
        )
    return np.pad(kept, grow, mode=mode)


# ---------------------------------------------------------------- PadGrad


def _pad_grad_widths(consts, shape):
    return pad_widths(shape, consts[1], consts[2] if len(consts) > 2 else None)


def _pad_grad_shape(inputs, consts, *, mode="constant", shape, **attrs):
    dy = inputs[0]
    shape = tuple(_ints(shape))
    widths = _pad_grad_widths(consts, shape)
    _check(shape, widths, pad_mode(mode))
    want = tuple(d + b + e for d, (b, e) in zip(shape, widths, strict=True))
    if dy.shape != want:
        raise ShapeError(f"PadGrad: dY shape {dy.shape} != padded shape {want} of {shape}")
    return [TensorType(shape, dy.dtype)]


def _pad_grad_tile(ctx: TileContext) -> TileSpec:
    shape = tuple(_ints(ctx.attrs["shape"]))
    widths = _pad_grad_widths(ctx.consts, shape)
    names = letters(len(shape))
    # a padded axis gathers from anywhere along it: whole; the others map tile to tile
    spec = "".join(ch if w == (0, 0) else "." for ch, w in zip(names, widths, strict=True))

    def adjust(attrs, consts, out_regions):
        return {**attrs, "shape": [s.stop - s.start for s in out_regions[0]]}, consts

    extra = (None,) * (len(ctx.inputs) - 1)
    return TileSpec(inputs=(spec, *extra), outputs=(spec,), adjust=adjust)


@register(
    "PadGrad",
    domain=DFDL_DOMAIN,
    shape=_pad_grad_shape,
    tile=_pad_grad_tile,
    const_inputs=(1, 2),
    differentiable=False,
)
def PadGrad(dY, pads, axes=None, *, mode="constant", shape):
    """Gradient of Pad: every element of ``dY`` added onto the input element it copies
    (padding constants add nothing), into zeros of ``shape``.

    Each padded axis in turn: the source of every output position is Pad itself run on
    the axis's positions (-1 for the constant), so the scatter follows the forward's
    exact index map.
    """
    dY = np.asarray(dY)
    mode = pad_mode(mode)
    shape = tuple(_ints(shape))
    widths = pad_widths(shape, pads, axes)
    _check(shape, widths, mode)
    g = dY
    for a, (w, d) in enumerate(zip(widths, shape, strict=True)):
        if w == (0, 0):
            continue
        src = Pad(np.arange(d), np.array(w), np.array(-1), mode=mode)
        keep = src >= 0
        out = np.zeros(g.shape[:a] + (d,) + g.shape[a + 1 :], dtype=dY.dtype)
        # np.add.at accumulates repeated sources (edge, reflect and wrap copies)
        np.add.at(out, (slice(None),) * a + (src[keep],), np.compress(keep, g, axis=a))
        g = out
    return g


# ---------------------------------------------------------------- VJP


@defvjp("Pad")
def _pad_vjp(b, node, dys):
    x = b.type(node.inputs[0])
    inits = b.graph.initializers
    axes = inits.get(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] else None
    widths = pad_widths(x.shape, inits[node.inputs[1]], axes)
    mode = pad_mode(node.attrs.get("mode", "constant"))
    rest = [None] * (len(node.inputs) - 1)
    if mode == "constant":
        neg = b.const([-p for p, _ in widths] + [-p for _, p in widths], np.int64, "pads")
        return [b.op("Pad", [dys[0], neg]), *rest]
    pads = b.const([p for p, _ in widths] + [p for _, p in widths], np.int64, "pads")
    attrs = {"mode": mode, "shape": [int(d) for d in x.shape]}
    return [b.op("PadGrad", [dys[0], pads], attrs, domain=DFDL_DOMAIN), *rest]
