"""Resize (opset 19+ semantics): modes "nearest", "linear" (N-linear) and "cubic"
(Keys' cubic convolution with ``cubic_coeff_a``), with antialias and exclude_outside.

Resizing is separable: each resized axis is interpolated on its own, in ``axes`` order,
exactly like the ONNX reference. Linear and cubic interpolation run in float64 and are
rounded back to the input dtype (integers round half to even and saturate); nearest
gathers values without arithmetic. Each axis' pass is a filter of a few taps per output
(2 for linear, 4 for cubic, widened by ``1 / scale`` when antialiasing a downscale).

Tiling: axes the op leaves untouched (scale 1, same length: typically batch and
channels) are tiled as they are; resized axes are tiled too, each output tile reading
the input slab its taps reach. A tile computes the whole Resize's sampling (with the
whole X's shape, given in the planner's ``dfdl_tile`` attribute) cut to its outputs, so
tiles equal the untiled op bit for bit, ``tf_crop_and_resize`` included.

Training: the VJP is ``dfdl.ResizeGrad(dY, roi, scales, sizes; input_shape)``, the adjoint
of Resize as a linear map of X (gradient 0 where ``extrapolation_value`` is written); it
tiles like the forward. roi/scales/sizes get no gradient.

The CPU kernels (:mod:`dfdl.ops.cpu.resize`) receive the passes themselves
(:func:`resize_params`, :func:`resize_grad_params`).

Example:
    >>> from dfdl.ops import REGISTRY
    >>> x = np.ones((1, 1, 2, 2), np.float32)
    >>> REGISTRY["Resize"].forward(x, None, np.array([1, 1, 2, 2], np.float32)).shape
    (1, 1, 4, 4)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dfdl.errors import ModelError, ShapeError, UnsupportedOpError
from dfdl.ops.common import LETTERS, normalize_axis, whole_tile
from dfdl.ops.registry import TensorType, TileContext, TileSpec, defvjp, register

_MODES = ("nearest", "linear", "cubic")
_CTMS = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_POLICIES = ("stretch", "not_larger", "not_smaller")


@dataclass(frozen=True)
class ResizePlan:
    """Per-axis scale and output length, the axes to process (in order) and the roi."""

    scales: tuple[float, ...]
    out: tuple[int, ...]
    axes: tuple[int, ...]
    roi: np.ndarray | None  # [start_0..start_r-1, end_0..end_r-1] over all axes, or None

    def identity(self, axis: int, length: int) -> bool:
        """True when ``axis`` is copied unchanged (the reference skips it too)."""
        if not (math.isclose(self.scales[axis], 1.0) and self.out[axis] == length):
            return False
        if self.roi is None:
            return True
        r = len(self.out)
        return math.isclose(float(self.roi[axis]), 0.0) and math.isclose(
            float(self.roi[axis + r]), 1.0
        )


def _given(a) -> np.ndarray | None:
    """An optional tensor input, None when absent or empty."""
    return None if a is None or np.size(a) == 0 else np.asarray(a)


def check_attrs(mode, coordinate_transformation_mode, nearest_mode, keep_aspect_ratio_policy):
    """Raise for attribute values ONNX does not define."""
    for name, value, allowed in (
        ("mode", mode, _MODES),
        ("coordinate_transformation_mode", coordinate_transformation_mode, _CTMS),
        ("nearest_mode", nearest_mode, _NEAREST_MODES),
        ("keep_aspect_ratio_policy", keep_aspect_ratio_policy, _POLICIES),
    ):
        if value not in allowed:
            raise ModelError(f"Resize: {name}={value!r} is not one of {allowed}")


def resize_plan(shape, roi, scales, sizes, axes=None, keep_aspect_ratio_policy="stretch", ctm=""):
    """Resolve ``scales``/``sizes``/``axes``/``roi`` into a :class:`ResizePlan`.

    Raises:
        ModelError: both or neither of scales/sizes, or lengths that do not match.
    """
    r = len(shape)
    scales, sizes = _given(scales), _given(sizes)
    if (scales is None) == (sizes is None):
        raise ModelError("Resize: exactly one of 'scales' and 'sizes' must be given")
    ax = [normalize_axis(int(a), r) for a in axes] if axes else list(range(r))
    if len(set(ax)) != len(ax) or not all(0 <= a < r for a in ax):
        raise ModelError(f"Resize: bad axes {axes} for rank {r}")
    given = scales if scales is not None else sizes
    if given.shape != (len(ax),):
        raise ModelError(f"Resize: scales/sizes must have {len(ax)} values, got {given.shape}")
    full_roi = None
    roi = _given(roi)
    if ctm == "tf_crop_and_resize":
        if roi is None or roi.shape != (2 * len(ax),):
            raise ModelError(f"Resize: roi must have {2 * len(ax)} values for tf_crop_and_resize")
        full_roi = np.array([0.0] * r + [1.0] * r, roi.dtype)
        for i, a in enumerate(ax):
            full_roi[a], full_roi[r + a] = roi[i], roi[len(ax) + i]
    sc = [1.0] * r
    out = list(shape)
    if scales is not None:
        if np.any(scales <= 0):
            raise ModelError(f"Resize: scales must be positive, got {scales.tolist()}")
        for i, a in enumerate(ax):
            sc[a] = float(scales[i])
            out[a] = int(np.float64(sc[a]) * shape[a])  # floor(length * scale), as the reference
    else:
        if np.any(sizes < 0):
            raise ModelError(f"Resize: sizes must be non-negative, got {sizes.tolist()}")
        for i, a in enumerate(ax):
            out[a] = int(sizes[i])
            sc[a] = out[a] / shape[a]
        if keep_aspect_ratio_policy != "stretch":
            pick = min if keep_aspect_ratio_policy == "not_larger" else max
            s = pick(sc[a] for a in ax)
            for a in ax:
                sc[a] = s
                out[a] = int(s * shape[a] + 0.5)  # round half up
    return ResizePlan(tuple(sc), tuple(out), tuple(ax), full_roi)


def _source_coords(ctm: str, n_out: int, L: int, scale: float, roi_pair) -> np.ndarray:
    """Input coordinate of every output position along one axis (float64)."""
    y = np.arange(n_out, dtype=np.float64)
    out_w = scale * L  # the (fractional) target length
    if ctm == "align_corners":
        return np.zeros(n_out) if out_w == 1 else y * (L - 1) / (out_w - 1)
    if ctm == "asymmetric":
        return y / scale
    if ctm == "pytorch_half_pixel":
        return np.full(n_out, -0.5) if out_w == 1 else (y + 0.5) / scale - 0.5
    if ctm == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if ctm == "half_pixel_symmetric":
        # centres the sampled region when the integer length differs from scale * L
        offset = L / 2 * (1 - n_out / out_w)
        return offset + (y + 0.5) / scale - 0.5
    start, end = roi_pair  # tf_crop_and_resize
    if out_w == 1:
        x = np.full(n_out, (end - start) * (L - 1) / 2)
    else:
        x = y * (end - start) * (L - 1) / (out_w - 1)
    return x + start * (L - 1)


def _nearest_index(x: np.ndarray, nearest_mode: str, L: int) -> np.ndarray:
    xi = np.floor(x)
    frac = x - xi
    if nearest_mode == "round_prefer_floor":
        up = frac > 0.5
    elif nearest_mode == "round_prefer_ceil":
        up = frac >= 0.5
    elif nearest_mode == "floor":
        up = np.zeros(x.shape, bool)
    else:
        up = frac > 0
    return np.clip(xi + up, 0, L - 1).astype(np.intp)


def _cubic_weights(d: np.ndarray, A: float) -> np.ndarray:
    """Keys' cubic convolution kernel at distances ``d`` (zero from 2 on)."""
    d = np.abs(d)
    near = ((A + 2) * d - (A + 3)) * d * d + 1
    far = ((A * d - 5 * A) * d + 8 * A) * d - 4 * A
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _filter_taps(
    x: np.ndarray,
    scale: float,
    L: int,
    antialias: int,
    exclude_outside: int,
    mode: str = "linear",
    cubic_coeff_a: float = -0.75,
):
    """Indices ``(n_out, n)`` and weights of the (possibly widened) triangle or cubic
    filter, taps placed as the reference places them."""
    half = 2 if mode == "cubic" else 1  # the kernel's support, each side
    s = min(scale, 1.0) if antialias else 1.0  # antialias widens the filter by 1/scale
    start = int(np.floor(-half / s) + 1)
    n = 2 - 2 * start
    xi = np.floor(x)
    integer = x == xi
    # the reference samples [x-1, x] at integer x (weight 1 on x), [floor, floor+1] otherwise
    # (and as many taps again on each side for wider filters)
    base = np.where(integer, x - 1, xi).astype(np.int64)
    ratio = np.where(integer, 1.0, x - xi)
    j = np.arange(start, start + n)
    if mode == "cubic":
        w = _cubic_weights((j[None, :] - ratio[:, None]) * s, cubic_coeff_a)
        if antialias:
            w = w / w.sum(axis=1, keepdims=True)
    elif antialias:
        w = np.clip(1 - np.abs((j[None, :] - ratio[:, None]) * s), 0, 1)
        w = w / w.sum(axis=1, keepdims=True)
    else:
        w = np.stack([1 - ratio, ratio], axis=1)
    idx = base[:, None] + j[None, :]
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= L), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, L - 1).astype(np.intp), w


def axis_sampling(
    plan: ResizePlan,
    axis: int,
    L: int,
    *,
    mode: str,
    ctm: str,
    nearest_mode: str,
    antialias: int,
    exclude_outside: int,
    cubic_coeff_a: float = -0.75,
):
    """How one resized axis samples its input.

    Returns:
        ``(idx, w, outside)``: source indices ``(n_out, n)``, their weights (None for
        nearest: one tap, copied) and, for tf_crop_and_resize, the output positions that
        take ``extrapolation_value`` (else None).
    """
    roi_pair = None
    if plan.roi is not None:
        roi_pair = (plan.roi[axis], plan.roi[axis + len(plan.out)])
    x = _source_coords(ctm, plan.out[axis], L, plan.scales[axis], roi_pair)
    outside = (x < 0) | (x > L - 1) if ctm == "tf_crop_and_resize" else None
    if mode == "nearest":
        return _nearest_index(x, nearest_mode, L)[:, None], None, outside
    idx, w = _filter_taps(
        x, plan.scales[axis], L, antialias, exclude_outside, mode, float(cubic_coeff_a)
    )
    return idx, w, outside


def forward_passes(shape, roi, scales, sizes, attrs, tile=None) -> list:
    """The interpolation passes of a Resize, one per resized axis, in ``axes`` order.

    Args:
        shape: the shape of the X this call gets.
        attrs: the node's attributes (defaults filled in by the caller).
        tile: for one spatial tile, ``(whole X shape, output starts, output stops, input
            slab starts)`` per axis: the passes are the whole Resize's, cut to the
            tile's outputs, with source indices relative to its slab.

    Returns:
        ``[(axis, idx, w, outside, n_out)]`` as :func:`axis_sampling` gives them.
    """
    whole = tuple(int(v) for v in (tile[0] if tile is not None else shape))
    plan = resize_plan(
        whole,
        roi,
        scales,
        sizes,
        attrs["axes"],
        attrs["keep_aspect_ratio_policy"],
        attrs["coordinate_transformation_mode"],
    )
    passes = []
    for a in plan.axes:
        if plan.identity(a, whole[a]):
            continue
        idx, w, outside = axis_sampling(
            plan,
            a,
            whole[a],
            mode=attrs["mode"],
            ctm=attrs["coordinate_transformation_mode"],
            nearest_mode=attrs["nearest_mode"],
            antialias=attrs["antialias"],
            exclude_outside=attrs["exclude_outside"],
            cubic_coeff_a=attrs.get("cubic_coeff_a", -0.75),
        )
        if tile is not None:
            sl = slice(tile[1][a], tile[2][a])
            idx = idx[sl] - tile[3][a]
            w = None if w is None else w[sl]
            outside = None if outside is None else outside[sl]
        passes.append((a, idx, w, outside, len(idx)))
    return passes


def _saturate(value, dtype: np.dtype):
    """Round and clip float64 values into an integer dtype (floats just cast)."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.clip(np.round(value), info.min, info.max).astype(dtype)
    return np.asarray(value).astype(dtype)


def _resize_shape(inputs, consts, **attrs) -> list[TensorType]:
    X = inputs[0]
    plan = _plan_from_attrs(X.shape, consts, attrs)
    if X.dtype.kind not in ("fiub" if attrs.get("mode", "nearest") == "nearest" else "fiu"):
        raise UnsupportedOpError(f"Resize: dtype {X.dtype} is not supported", op_type="Resize")
    return [TensorType(plan.out, X.dtype)]


def _plan_from_attrs(shape, consts, attrs) -> ResizePlan:
    ctm = attrs.get("coordinate_transformation_mode", "half_pixel")
    policy = attrs.get("keep_aspect_ratio_policy", "stretch")
    check_attrs(
        attrs.get("mode", "nearest"), ctm, attrs.get("nearest_mode", "round_prefer_floor"), policy
    )
    consts = list(consts) + [None] * (4 - len(consts))
    return resize_plan(shape, consts[1], consts[2], consts[3], attrs.get("axes"), policy, ctm)


_RESIZE_DEFAULTS = dict(
    axes=None,
    keep_aspect_ratio_policy="stretch",
    coordinate_transformation_mode="half_pixel",
    mode="nearest",
    nearest_mode="round_prefer_floor",
    antialias=0,
    exclude_outside=0,
    cubic_coeff_a=-0.75,
)


def _resize_tile(ctx: TileContext) -> TileSpec:
    """Copied axes tiled as they are; resized axes tiled too, each output tile reading the
    input slab its taps reach (``dfdl_tile`` tells the kernel where it stands)."""
    X = ctx.inputs[0]
    attrs = {**_RESIZE_DEFAULTS, **ctx.attrs}
    consts = (list(ctx.consts) + [None] * 4)[:4]
    passes = forward_passes(X.shape, *consts[1:], attrs)
    resized = {p[0]: p[1] for p in passes}
    # copied axes keep their own letter; resized ones take letters from the alphabet's end
    spec = "".join(LETTERS[-1 - a] if a in resized else LETTERS[a] for a in range(X.rank))
    inputs = (spec,) + tuple(None for _ in ctx.inputs[1:])
    windows = {
        (0, a): (lambda lo, hi, idx=idx: (int(idx[lo:hi].min()), int(idx[lo:hi].max()) + 1))
        for a, idx in resized.items()
    }

    def tile_attrs(attrs, ranges):
        out_lo = [ranges[ch][0] if ch in ranges else 0 for ch in spec]
        out_hi = [ranges[ch][1] if ch in ranges else n for ch, n in zip(spec, X.shape)]
        in_lo = list(out_lo)
        for a, window in windows.items():
            in_lo[a[1]] = max(0, window(out_lo[a[1]], out_hi[a[1]])[0])
        return {**attrs, "dfdl_tile": (X.shape, out_lo, out_hi, in_lo)}

    return TileSpec(
        inputs=inputs,
        outputs=(spec,),
        windows=windows,
        spatial="".join(ch for a, ch in enumerate(spec) if a in resized),
        tile_attrs=tile_attrs,
    )


def resize_params(
    X,
    roi=None,
    scales=None,
    sizes=None,
    *,
    antialias=0,
    axes=None,
    coordinate_transformation_mode="half_pixel",
    cubic_coeff_a=-0.75,
    exclude_outside=0,
    extrapolation_value=0.0,
    keep_aspect_ratio_policy="stretch",
    mode="nearest",
    nearest_mode="round_prefer_floor",
    dfdl_tile=None,
) -> dict:
    """The Resize kernels' parameters: ``passes``, the tile's interpolation passes
    (:func:`forward_passes`), and ``extrapolation_value`` as a float.

    Example:
        >>> x = np.ones((1, 1, 2, 2), np.float32)
        >>> p = resize_params(x, scales=np.array([1, 1, 2, 2], np.float32), mode="linear")
        >>> [(axis, n_out) for axis, _, _, _, n_out in p["passes"]]
        [(2, 4), (3, 4)]
    """
    check_attrs(mode, coordinate_transformation_mode, nearest_mode, keep_aspect_ratio_policy)
    attrs = dict(
        axes=axes,
        keep_aspect_ratio_policy=keep_aspect_ratio_policy,
        coordinate_transformation_mode=coordinate_transformation_mode,
        mode=mode,
        nearest_mode=nearest_mode,
        antialias=antialias,
        exclude_outside=exclude_outside,
        cubic_coeff_a=cubic_coeff_a,
    )
    return {
        "passes": forward_passes(X.shape, roi, scales, sizes, attrs, dfdl_tile),
        "extrapolation_value": float(extrapolation_value),
    }


@register(
    "Resize",
    shape=_resize_shape,
    tile=_resize_tile,
    params=resize_params,
    const_inputs=(1, 2, 3),
)
def Resize(
    X,
    roi=None,
    scales=None,
    sizes=None,
    *,
    antialias=0,
    axes=None,
    coordinate_transformation_mode="half_pixel",
    cubic_coeff_a=-0.75,
    exclude_outside=0,
    extrapolation_value=0.0,
    keep_aspect_ratio_policy="stretch",
    mode="nearest",
    nearest_mode="round_prefer_floor",
    dfdl_tile=None,
):
    """ONNX Resize, modes "nearest", "linear" and "cubic" (see the module docstring).

    ``dfdl_tile`` is set by the planner, never by a model: this call computes one spatial
    tile of the whole Resize (see :func:`forward_passes`).
    """
    passes = resize_params(
        X,
        roi,
        scales,
        sizes,
        antialias=antialias,
        axes=axes,
        coordinate_transformation_mode=coordinate_transformation_mode,
        cubic_coeff_a=cubic_coeff_a,
        exclude_outside=exclude_outside,
        keep_aspect_ratio_policy=keep_aspect_ratio_policy,
        mode=mode,
        nearest_mode=nearest_mode,
        dfdl_tile=dfdl_tile,
    )["passes"]
    y = X if mode == "nearest" else X.astype(np.float64)
    fill = _saturate(extrapolation_value, X.dtype) if mode == "nearest" else extrapolation_value
    for a, idx, w, outside, n_out in passes:
        bshape = [1] * X.ndim
        bshape[a] = n_out
        if w is None:
            y = np.take(y, idx[:, 0], axis=a)
        else:
            acc = None
            for k in range(idx.shape[1]):
                term = np.take(y, idx[:, k], axis=a) * w[:, k].reshape(bshape)
                acc = term if acc is None else acc + term
            y = acc
        if outside is not None:
            y = np.where(outside.reshape(bshape), fill, y)
    if mode == "nearest":
        return y.copy() if y is X else np.ascontiguousarray(y)
    return _saturate(y, X.dtype)


# ---------------------------------------------------------------- backward (VJP) op
# dfdl.ResizeGrad is the adjoint of Resize as a linear map of X (roi/scales/sizes fixed):
# the per-axis passes run in reverse order, each scattering dY back to its source taps.


def adjoint_passes(plan: ResizePlan, input_shape, attrs):
    """Per resized axis, last one first: ``(axis, L, idx, w)`` with w zero where the
    forward writes ``extrapolation_value`` (no gradient flows there)."""
    passes = []
    for a in reversed(plan.axes):
        L = int(input_shape[a])
        if plan.identity(a, L):
            continue
        idx, w, outside = axis_sampling(
            plan,
            a,
            L,
            mode=attrs["mode"],
            ctm=attrs["coordinate_transformation_mode"],
            nearest_mode=attrs["nearest_mode"],
            antialias=attrs["antialias"],
            exclude_outside=attrs["exclude_outside"],
            cubic_coeff_a=attrs.get("cubic_coeff_a", -0.75),
        )
        w = np.ones(idx.shape) if w is None else w
        if outside is not None:
            w = np.where(outside[:, None], 0.0, w)
        passes.append((a, L, idx, w))
    return passes


def _resize_grad_shape(inputs, consts, *, input_shape=None, **attrs) -> list[TensorType]:
    dY = inputs[0]
    if not input_shape:
        raise ModelError("ResizeGrad: attribute input_shape is required")
    shape = tuple(int(v) for v in input_shape)
    plan = _plan_from_attrs(shape, consts, attrs)
    if plan.out != dY.shape:
        raise ShapeError(f"ResizeGrad: dY has shape {dY.shape}, expected {plan.out}")
    if dY.dtype.kind != "f":
        raise UnsupportedOpError(
            f"ResizeGrad: dtype {dY.dtype} is not supported", op_type="ResizeGrad"
        )
    return [TensorType(shape, dY.dtype)]


def _resize_grad_tile(ctx: TileContext) -> TileSpec:
    """Axes Resize copies unchanged are tiled (dY and dX alike); resized axes stay whole."""
    dY, shape = ctx.inputs[0], ctx.outputs[0].shape
    if ctx.attrs.get("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize":
        return whole_tile(ctx)
    plan = _plan_from_attrs(shape, ctx.consts, ctx.attrs)
    spec = "".join(LETTERS[a] if plan.identity(a, shape[a]) else "." for a in range(dY.rank))
    tiled = [a for a, ch in enumerate(spec) if ch != "."]
    sizes_given = len(ctx.consts) > 3 and _given(ctx.consts[3]) is not None

    def adjust(attrs, consts, out_regions):
        # input_shape (and sizes on tiled axes) become the tile's own lengths
        tile_shape = [r.stop - r.start for r in out_regions[0]]
        if sizes_given:
            sizes = np.array(consts[3], dtype=np.int64)
            for i, a in enumerate(plan.axes):
                if a in tiled:
                    sizes[i] = tile_shape[a]
            consts = {**consts, 3: sizes}
        return {**attrs, "input_shape": tile_shape}, consts

    inputs = (spec,) + tuple(None for _ in ctx.inputs[1:])
    return TileSpec(inputs=inputs, outputs=(spec,), adjust=adjust if tiled else None)


def resize_grad_params(
    dY,
    roi=None,
    scales=None,
    sizes=None,
    *,
    input_shape=None,
    antialias=0,
    axes=None,
    coordinate_transformation_mode="half_pixel",
    cubic_coeff_a=-0.75,
    exclude_outside=0,
    extrapolation_value=0.0,
    keep_aspect_ratio_policy="stretch",
    mode="nearest",
    nearest_mode="round_prefer_floor",
) -> dict:
    """The ResizeGrad kernels' parameters: ``passes``, the adjoint passes
    (:func:`adjoint_passes`, last axis first) for dX of shape ``input_shape``.

    Example:
        >>> dy = np.ones((1, 1, 4, 4), np.float32)
        >>> p = resize_grad_params(dy, scales=np.array([1, 1, 2, 2], np.float32),
        ...                        input_shape=[1, 1, 2, 2], mode="linear")
        >>> [(axis, length) for axis, length, _, _ in p["passes"]]
        [(3, 2), (2, 2)]
    """
    attrs = dict(
        mode=mode,
        coordinate_transformation_mode=coordinate_transformation_mode,
        nearest_mode=nearest_mode,
        antialias=antialias,
        exclude_outside=exclude_outside,
        cubic_coeff_a=cubic_coeff_a,
    )
    check_attrs(mode, coordinate_transformation_mode, nearest_mode, keep_aspect_ratio_policy)
    shape = tuple(int(v) for v in input_shape)
    plan = resize_plan(
        shape, roi, scales, sizes, axes, keep_aspect_ratio_policy, coordinate_transformation_mode
    )
    return {"passes": adjoint_passes(plan, shape, attrs)}


@register(
    "ResizeGrad",
    domain="dfdl",
    shape=_resize_grad_shape,
    tile=_resize_grad_tile,
    params=resize_grad_params,
    const_inputs=(1, 2, 3),
    differentiable=False,
)
def ResizeGrad(
    dY,
    roi=None,
    scales=None,
    sizes=None,
    *,
    input_shape=None,
    antialias=0,
    axes=None,
    coordinate_transformation_mode="half_pixel",
    cubic_coeff_a=-0.75,
    exclude_outside=0,
    extrapolation_value=0.0,
    keep_aspect_ratio_policy="stretch",
    mode="nearest",
    nearest_mode="round_prefer_floor",
):
    """dX of ``Resize(X, roi, scales, sizes)`` given dY; ``input_shape`` is X's shape."""
    passes = resize_grad_params(
        dY,
        roi,
        scales,
        sizes,
        input_shape=input_shape,
        antialias=antialias,
        axes=axes,
        coordinate_transformation_mode=coordinate_transformation_mode,
        cubic_coeff_a=cubic_coeff_a,
        exclude_outside=exclude_outside,
        keep_aspect_ratio_policy=keep_aspect_ratio_policy,
        mode=mode,
        nearest_mode=nearest_mode,
    )["passes"]
    g = dY.astype(np.float64)
    for a, L, idx, w in passes:
        # dense (L, n_out) transpose of this axis' interpolation matrix
        m = np.zeros((L, idx.shape[0]))
        np.add.at(m, (idx, np.arange(idx.shape[0])[:, None]), w)
        g = np.moveaxis(np.tensordot(m, g, axes=([1], [a])), 0, a)
    return np.ascontiguousarray(g).astype(dY.dtype, copy=False)


@defvjp("Resize")
def _resize_vjp(b, node, dys):
    x, *params = node.inputs
    params = (params + [None] * 3)[:3]
    attrs = {**node.attrs, "input_shape": list(b.type(x).shape)}
    dx = b.op("ResizeGrad", [dys[0], *params], attrs, domain="dfdl")
    return [dx, None, None, None][: len(node.inputs)]
