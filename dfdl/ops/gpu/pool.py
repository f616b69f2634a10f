"""cupy kernels of pooling: MaxPool, AveragePool, GlobalAveragePool and the window
gradients dfdl.MaxPoolGrad and dfdl.AveragePoolGrad (1-3-D, strides, dilations, pads,
ceil mode).

The forwards reduce a copy of the strided window view (:func:`~dfdl.ops.gpu.conv.taps_view`;
MaxPool takes the first maximum of each window, as the numpy forward's scan does); the
gradients add each tap's share into dX tap after tap in row-major order, a fixed order,
so a run repeats bit for bit.

Example:
    >>> divisor((4,), (3,), (1,), (1,), (1,), (1,), (4,), False).tolist()
    [2.0, 3.0, 3.0, 2.0]
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dfdl.ops.gpu.conv import extent, taps_view, window
from dfdl.ops.gpu.device import cupy, to_device
from dfdl.ops.gpu.kernels import floats
from dfdl.ops.registry import DFDL_DOMAIN, kernel


@functools.lru_cache(maxsize=256)
def divisor(spatial, kernel, strides, dilations, pads_begin, pads_end, out, include_pad):
    """Number of counted taps of each window (host, float64, shape ``out``): taps inside
    the input, or (``include_pad``) inside the padded input."""
    total = np.ones((1,) * len(out))
    for ax, (L, o, k, s, d, pb, pe) in enumerate(
        zip(spatial, out, kernel, strides, dilations, pads_begin, pads_end, strict=True)
    ):
        pos = np.arange(o)[:, None] * s - pb + np.arange(k)[None, :] * d
        ok = pos < L + pe if include_pad else (pos >= 0) & (pos < L)
        shape = [1] * len(out)
        shape[ax] = o
        total = total * ok.sum(axis=1).reshape(shape)
    return total


def _windows(x, kernel, strides, dilations, pads_begin, out, fill):
    """``(N, C, *out, taps)``: each output's window, copied."""
    nd = len(out)
    v = taps_view(x, kernel, strides, dilations, pads_begin, out, fill)
    perm = (0, 1, *range(2 + nd, 2 + 2 * nd), *range(2, 2 + nd))
    w = cupy().ascontiguousarray(v.transpose(perm))
    return w.reshape(*w.shape[: 2 + nd], -1)


def _first_max_tap(x, kernel, strides, dilations, pads_begin, out):
    """Max of each window (padding never wins) and the flat index of its first max tap."""
    w = _windows(x, kernel, strides, dilations, pads_begin, out, -np.inf)
    tap = w.argmax(axis=-1)
    return cupy().take_along_axis(w, tap[..., None], axis=-1)[..., 0], tap


def _valid(spatial, kernel, strides, dilations, pads_begin, pads_end, out):
    """Windows with at least one tap inside the input, on the device (host rule)."""
    n = divisor(spatial, kernel, strides, dilations, pads_begin, pads_end, out, False)
    return to_device(n > 0)


def _supported(X, *rest, **attrs) -> bool:
    return floats(X) and X.ndim >= 3


@kernel("MaxPool", "gpu", accepts=_supported)
def max_pool(
    X, *, kernel_shape, strides, dilations, pads_begin, pads_end, out_spatial, storage_order
):
    """Y and Indices (flat offsets into X, row-major or, ``storage_order`` 1,
    column-major over the spatial axes; -1 for a window wholly in the padding)."""
    cp = cupy()
    x = to_device(X)
    sp = x.shape[2:]
    y, tap = _first_max_tap(x, kernel_shape, strides, dilations, pads_begin, out_spatial)
    valid = _valid(sp, kernel_shape, strides, dilations, pads_begin, pads_end, out_spatial)
    nd = len(sp)
    flat = cp.zeros(tap.shape, np.int64)
    place = 1
    axes = range(nd) if storage_order else reversed(range(nd))
    for ax in axes:
        t = (tap // math.prod(kernel_shape[ax + 1 :])) % kernel_shape[ax]
        o = cp.arange(out_spatial[ax]).reshape([-1 if i == ax else 1 for i in range(nd)])
        pos = o * strides[ax] - pads_begin[ax] + t * dilations[ax]
        flat += cp.clip(pos, 0, sp[ax] - 1) * place
        place *= sp[ax]
    nc = cp.arange(x.shape[0] * x.shape[1]).reshape(x.shape[:2] + (1,) * nd)
    idx = cp.where(valid, nc * math.prod(sp) + flat, -1)
    return cp.where(valid, y, y.dtype.type(0)), idx


@kernel("AveragePool", "gpu", accepts=_supported)
def average_pool(
    X, *, kernel_shape, strides, dilations, pads_begin, pads_end, out_spatial, count_include_pad
):
    """The mean of each window's counted taps."""
    x = to_device(X)
    w = _windows(x, kernel_shape, strides, dilations, pads_begin, out_spatial, 0)
    div = divisor(
        x.shape[2:],
        kernel_shape,
        strides,
        dilations,
        pads_begin,
        pads_end,
        out_spatial,
        count_include_pad,
    )
    return w.sum(axis=-1) / to_device(div.astype(x.dtype))


@kernel("GlobalAveragePool", "gpu", accepts=_supported)
def global_average_pool(X):
    """The mean over all spatial axes (kept as size 1)."""
    x = to_device(X)
    return x.mean(axis=tuple(range(2, x.ndim)), keepdims=True)


def _spread(share, kernel, strides, dilations, pads_begin, out, spatial):
    """dX: ``share(tap)`` (``(N, C, *out)`` per flat tap index) added at each tap's
    input positions, tap after tap, over the windows' span, then cut to ``spatial``."""
    cp = cupy()
    span = extent(out, kernel, strides, dilations)
    first = share(0)
    acc = cp.zeros((*first.shape[:2], *span), first.dtype)
    for j, off in enumerate(np.ndindex(*kernel)):
        sl = tuple(
            slice(t * d, t * d + s * (o - 1) + 1, s)
            for t, d, s, o in zip(off, dilations, strides, out, strict=True)
        )
        acc[(slice(None), slice(None), *sl)] += first if j == 0 else share(j)
    return cp.ascontiguousarray(window(acc, pads_begin, spatial))


def _crop(dx, crop):
    """The slab ``[off, off + n)`` of each spatial axis (``crop`` = off0, n0, ...), zeros
    past dX's end; None keeps all of dX."""
    if crop is None:
        return dx
    nd = len(crop) // 2
    return cupy().ascontiguousarray(
        window(dx, [crop[2 * a] for a in range(nd)], [crop[2 * a + 1] for a in range(nd)])
    )


def _max_grad_accepts(dY, X, **attrs) -> bool:
    return floats(dY, X) and X.ndim >= 3


@kernel("MaxPoolGrad", "gpu", accepts=_max_grad_accepts, domain=DFDL_DOMAIN)
def max_pool_grad(
    dY, X, *, kernel_shape, strides, dilations, pads_begin, pads_end, out_spatial, crop
):
    """dX: each dY element goes to its window's first max, cut to the slab ``crop``."""
    cp = cupy()
    dy, x = to_device(dY), to_device(X)
    _, tap = _first_max_tap(x, kernel_shape, strides, dilations, pads_begin, out_spatial)
    zero = dy.dtype.type(0)
    dx = _spread(
        lambda j: cp.where(tap == j, dy, zero),
        kernel_shape,
        strides,
        dilations,
        pads_begin,
        out_spatial,
        x.shape[2:],
    )
    return _crop(dx, crop)


@kernel("AveragePoolGrad", "gpu", accepts=_supported, domain=DFDL_DOMAIN)
def average_pool_grad(
    dY,
    *,
    kernel_shape,
    strides,
    dilations,
    pads_begin,
    pads_end,
    out_spatial,
    count_include_pad,
    input_shape,
):
    """dX of shape ``input_shape``: each dY element spread evenly over its window's
    counted taps."""
    dy = to_device(dY)
    sp = tuple(input_shape[2:])
    div = divisor(
        sp, kernel_shape, strides, dilations, pads_begin, pads_end, out_spatial, count_include_pad
    )
    # a window wholly in the padding divides by 0: its taps all land in the padding, cut
    share = dy / to_device(div.astype(dy.dtype))
    if set(out_spatial) == {1} and set(dilations) == {1}:
        # one window (a global pool's gradient): its share broadcast over it
        full = cupy().broadcast_to(share, (*share.shape[:2], *kernel_shape))
        return cupy().ascontiguousarray(window(full, pads_begin, sp))
    return _spread(lambda j: share, kernel_shape, strides, dilations, pads_begin, out_spatial, sp)
