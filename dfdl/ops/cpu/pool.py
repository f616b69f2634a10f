"""numba kernels for MaxPool / AveragePool and their gradients (float32/float64, 1-D/2-D/3-D).

Every input is viewed as ``(N*C, D, H, W)``: lower ranks get leading singleton spatial
axes (kernel 1, stride 1, no padding), which leaves row-major and column-major flat
offsets unchanged. MaxPool computes ``Y`` and the argmax offsets in the same pass; 2-D
max pools, and windows two wide with stride = kernel (2x2, 2x2x2), have kernels of
their own. The kernels receive the resolved window geometry of
:func:`dfdl.ops.pool.pool_params`. A max pool's ties go to the first maximum in scan
order, in ``Y``'s Indices and in the gradient alike.

Example:
    >>> x = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
    >>> max_pool(x, kernel_shape=(2, 2), strides=(2, 2), dilations=(1, 1),
    ...          pads_begin=(0, 0), pads_end=(0, 0), out_spatial=(1, 1), storage_order=0)
    (array([[[[3.]]]], dtype=float32), array([[[[3]]]]))

Measurements: ``docs/design/max-pool-pairs.md``.
"""

from __future__ import annotations

import numba
import numpy as np

from dfdl.ops.halo import crop_slab
from dfdl.ops.registry import kernel

_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@numba.njit(cache=True, nogil=True)
def _tap_ranges(out, L, k, s, d, pb):
    """Per output position, the taps ``[lo, hi)`` that fall inside ``[0, L)``."""
    lo = np.empty(out, np.int64)
    hi = np.empty(out, np.int64)
    for o in range(out):
        start = o * s - pb
        t0 = 0 if start >= 0 else (-start + d - 1) // d
        t1 = (L - 1 - start) // d + 1 if L - 1 - start >= 0 else 0
        t1 = min(t1, k)
        lo[o] = t0
        hi[o] = max(t0, t1)
    return lo, hi


@numba.njit(cache=True, nogil=True)
def _pool_kernel(x, y, idx, k, s, d, pb, pe, is_max, include_pad, col_major):
    B, D, H, W = x.shape
    _, OD, OH, OW = y.shape
    lod, hid = _tap_ranges(OD, D, k[0], s[0], d[0], pb[0])
    loh, hih = _tap_ranges(OH, H, k[1], s[1], d[1], pb[1])
    low, hiw = _tap_ranges(OW, W, k[2], s[2], d[2], pb[2])
    # strides of the flat offset of (z, h, w): row-major or column-major
    if col_major:
        sz, sh, sw = 1, D, D * H
    else:
        sz, sh, sw = H * W, W, 1
    for b in range(B):
        xb = x[b]
        for od in range(OD):
            z0 = od * s[0] - pb[0]
            for oh in range(OH):
                h0 = oh * s[1] - pb[1]
                for ow in range(OW):
                    w0 = ow * s[2] - pb[2]
                    if is_max:
                        if hid[od] <= lod[od] or hih[oh] <= loh[oh] or hiw[ow] <= low[ow]:
                            y[b, od, oh, ow] = 0  # window entirely in the padding
                            idx[b, od, oh, ow] = -1
                            continue
                        # start from the first valid tap; later taps must be strictly larger
                        z = z0 + lod[od] * d[0]
                        h = h0 + loh[oh] * d[1]
                        w = w0 + low[ow] * d[2]
                        best = xb[z, h, w]
                        arg = z * sz + h * sh + w * sw
                        for tz in range(lod[od], hid[od]):
                            z = z0 + tz * d[0]
                            for th in range(loh[oh], hih[oh]):
                                h = h0 + th * d[1]
                                for tw in range(low[ow], hiw[ow]):
                                    w = w0 + tw * d[2]
                                    v = xb[z, h, w]
                                    gt = v > best  # branch-free selects run faster here
                                    best = v if gt else best
                                    arg = z * sz + h * sh + w * sw if gt else arg
                        y[b, od, oh, ow] = best
                        idx[b, od, oh, ow] = b * D * H * W + arg
                    else:
                        acc = 0.0
                        for tz in range(lod[od], hid[od]):
                            z = z0 + tz * d[0]
                            for th in range(loh[oh], hih[oh]):
                                h = h0 + th * d[1]
                                for tw in range(low[ow], hiw[ow]):
                                    acc += xb[z, h, w0 + tw * d[2]]
                        if include_pad:
                            # taps before the end of the explicit padding count, overhang not
                            cz = _count_until(z0, k[0], d[0], D + pe[0])
                            ch = _count_until(h0, k[1], d[1], H + pe[1])
                            cw = _count_until(w0, k[2], d[2], W + pe[2])
                        else:
                            cz = hid[od] - lod[od]
                            ch = hih[oh] - loh[oh]
                            cw = hiw[ow] - low[ow]
                        cnt = cz * ch * cw
                        y[b, od, oh, ow] = acc / cnt if cnt > 0 else np.nan


@numba.njit(cache=True, nogil=True)
def _count_until(start, k, d, end):
    """Taps ``start + t*d`` (t < k) lying before ``end``."""
    if start >= end:
        return 0
    return min(k, (end - 1 - start) // d + 1)


# The 2-D max kernels below scan exactly as _pool_kernel and _pool_grad_kernel do, on
# flat views with unsigned offsets: no per-access bounds or wraparound checks, and no
# depth loop (docs/design/max-pool-pairs.md).


@numba.njit(inline="always")
def _window_first_max(xf, base, W, h0, w0, th0, th1, tw0, tw1, dh, dw):
    """``(value, offset)`` of the first maximum, in scan order, of the window of taps
    ``[th0, th1) x [tw0, tw1)`` at ``(h0, w0)``; ``offset`` is ``h * W + w``."""
    at = (h0 + th0 * dh) * W + w0 + tw0 * dw
    best = xf[np.uint64(base + at)]
    for th in range(th0, th1):
        row = (h0 + th * dh) * W
        for tw in range(tw0, tw1):
            p = row + w0 + tw * dw
            v = xf[np.uint64(base + p)]
            if v > best:
                best = v
                at = p
    return best, at


@numba.njit(cache=True, nogil=True)
def _max_pool_2d(x, y, idx, k, s, d, pb, col_major):
    """MaxPool of ``x`` (B, 1, H, W) into ``y`` and ``idx`` (B, 1, OH, OW); a
    column-major index (``storage_order=1``) of depth 1 is ``h + w * H``."""
    B, _, H, W = x.shape
    OH, OW = y.shape[2], y.shape[3]
    loh, hih = _tap_ranges(OH, H, k[1], s[1], d[1], pb[1])
    low, hiw = _tap_ranges(OW, W, k[2], s[2], d[2], pb[2])
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    jf = idx.reshape(idx.size)
    o = 0
    for b in range(B):
        base = b * H * W
        for oh in range(OH):
            h0 = oh * s[1] - pb[1]
            for ow in range(OW):
                w0 = ow * s[2] - pb[2]
                if hih[oh] <= loh[oh] or hiw[ow] <= low[ow]:
                    yf[o] = 0  # window entirely in the padding
                    jf[o] = -1
                else:
                    yf[o], at = _window_first_max(
                        xf, base, W, h0, w0, loh[oh], hih[oh], low[ow], hiw[ow], d[1], d[2]
                    )
                    jf[o] = base + (at if not col_major else at // W + (at % W) * H)
                o += 1


@numba.njit(cache=True, nogil=True)
def _max_pool_grad_2d(dy, x, dx, k, s, d, pb):
    """MaxPoolGrad on (B, 1, H, W): ``dy`` added to ``dx`` (zeroed) at each window's
    first maximum of ``x``, outputs in the order of :func:`_pool_grad_kernel`."""
    B, _, H, W = dx.shape
    OH, OW = dy.shape[2], dy.shape[3]
    loh, hih = _tap_ranges(OH, H, k[1], s[1], d[1], pb[1])
    low, hiw = _tap_ranges(OW, W, k[2], s[2], d[2], pb[2])
    xf = x.reshape(x.size)
    gf = dy.reshape(dy.size)
    df = dx.reshape(dx.size)
    o = 0
    for b in range(B):
        base = b * H * W
        for oh in range(OH):
            h0 = oh * s[1] - pb[1]
            for ow in range(OW):
                w0 = ow * s[2] - pb[2]
                if hih[oh] > loh[oh] and hiw[ow] > low[ow]:  # some tap inside the input
                    _, at = _window_first_max(
                        xf, base, W, h0, w0, loh[oh], hih[oh], low[ow], hiw[ow], d[1], d[2]
                    )
                    df[np.uint64(base + at)] += gf[o]
                o += 1


# Windows that tile the input, two wide: 2x2 and 2x2x2 pools with stride = kernel, the
# pooling of nearly every CNN. The width is a constant, so the taps of a window unroll
# into straight-line code; the gradient zeroes the windows' rows as contiguous runs,
# then writes each window's value (docs/design/max-pool-pairs.md).


@numba.njit(inline="always")
def _first_max_pair(xf, row, H, W, ow, kd, kh):
    """``(value, offset)`` of the first maximum, in scan order, of the ``kd x kh x 2``
    window of output column ``ow`` whose first row starts at flat offset ``row``."""
    at = row + np.uint64(2 * ow)
    best = xf[at]
    for tz in range(kd):
        for th in range(kh):
            p = row + np.uint64((tz * H + th) * W + 2 * ow)
            for tw in range(2):
                v = xf[p + np.uint64(tw)]
                gt = v > best
                best = v if gt else best
                at = p + np.uint64(tw) if gt else at
    return best, at


@numba.njit(cache=True, nogil=True)
def _max_pool_pairs(x, y, idx, kd, kh):
    """MaxPool of ``x`` (B, D, H, W) with windows ``kd x kh x 2``, stride = kernel, no
    pads, into ``y`` and row-major ``idx`` (B, OD, OH, OW); scan as :func:`_pool_kernel`."""
    B, D, H, W = x.shape
    OD, OH, OW = y.shape[1], y.shape[2], y.shape[3]
    xf = x.reshape(x.size)
    yf = y.reshape(y.size)
    jf = idx.reshape(idx.size)
    o = np.uint64(0)
    for b in range(B):
        for od in range(OD):
            for oh in range(OH):
                row = np.uint64(b * D * H * W + (od * kd * H + oh * kh) * W)
                for ow in range(OW):
                    yf[o], at = _first_max_pair(xf, row, H, W, ow, kd, kh)
                    jf[o] = np.int64(at)
                    o += np.uint64(1)


@numba.njit(cache=True, nogil=True)
def _max_pool_grad_pairs(dy, x, dx, kd, kh):
    """MaxPoolGrad for :func:`_max_pool_pairs`' windows: writes every element of ``dx``
    that a window covers (``dy`` at the window's first max, 0 elsewhere)."""
    B, D, H, W = x.shape
    OD, OH, OW = dy.shape[1], dy.shape[2], dy.shape[3]
    xf = x.reshape(x.size)
    gf = dy.reshape(dy.size)
    df = dx.reshape(dx.size)
    o = np.uint64(0)
    for b in range(B):
        for od in range(OD):
            for oh in range(OH):
                row = np.uint64(b * D * H * W + (od * kd * H + oh * kh) * W)
                for tz in range(kd):  # the windows' rows, zeroed whole (contiguous)
                    for th in range(kh):
                        p = row + np.uint64((tz * H + th) * W)
                        for w in range(2 * OW):
                            df[p + np.uint64(w)] = 0
                for ow in range(OW):
                    _, at = _first_max_pair(xf, row, H, W, ow, kd, kh)
                    # + 0: the sum the general kernel forms, which turns -0.0 into 0.0
                    df[at] = gf[o] + 0
                    o += np.uint64(1)


def _pairs(sp3, k: np.ndarray, s: np.ndarray, d: np.ndarray, pb, out3) -> bool:
    """Whether :func:`_max_pool_pairs` applies to spatial shape ``sp3`` (D, H, W):
    windows two wide, stride = kernel, no dilation, no pads, every window inside."""
    return (
        k[2] == 2
        and (k == s).all()
        and (d == 1).all()
        and not np.any(pb)
        and all(o * kk <= n for o, kk, n in zip(out3, k, sp3, strict=True))
    )


def _flat_depth(x4: np.ndarray, k: np.ndarray, pb: np.ndarray) -> bool:
    """Whether a (B, D, H, W) view is 2-D pooling: depth 1, depth kernel 1, no depth pad."""
    return x4.shape[1] == 1 and k[0] == 1 and pb[0] == 0


def _as3(vals, fill):
    """Left-pad a per-spatial-axis tuple to 3 entries."""
    return np.array((fill,) * (3 - len(vals)) + tuple(vals), np.int64)


def _windows(kernel_shape, strides, dilations, pads_begin, pads_end) -> tuple:
    """``(k, s, d, pb, pe)``: the window geometry padded to 3 spatial axes."""
    return (
        _as3(kernel_shape, 1),
        _as3(strides, 1),
        _as3(dilations, 1),
        _as3(pads_begin, 0),
        _as3(pads_end, 0),
    )


def _run(X, out_spatial, windows, is_max, include_pad=False, storage_order=0):
    N, C, *sp = X.shape
    x = np.ascontiguousarray(X).reshape((N * C,) + (1,) * (3 - len(sp)) + tuple(sp))
    out3 = (1,) * (3 - len(sp)) + tuple(out_spatial)
    y = np.empty((N * C, *out3), X.dtype)
    idx = np.empty((N * C, *out3) if is_max else (1, 1, 1, 1), np.int64)
    k, s, d, pb, pe = windows
    if is_max and storage_order == 0 and _pairs(x.shape[1:], k, s, d, pb, out3):
        _max_pool_pairs(x, y, idx, k[0], k[1])
    elif is_max and _flat_depth(x, k, pb):
        _max_pool_2d(x, y, idx, k, s, d, pb, storage_order == 1)
    else:
        _pool_kernel(x, y, idx, k, s, d, pb, pe, is_max, bool(include_pad), storage_order == 1)
    shape = (N, C, *out_spatial)
    return (y.reshape(shape), idx.reshape(shape)) if is_max else y.reshape(shape)


def _supported(X, **attrs) -> bool:
    """Whether the kernels take ``X``: float32 or float64, 1-D to 3-D pooling."""
    return X.dtype in _KERNEL_DTYPES and 3 <= X.ndim <= 5


@kernel("MaxPool", accepts=_supported)
def max_pool(
    X, *, kernel_shape, strides, dilations, pads_begin, pads_end, out_spatial, storage_order
):
    """numba MaxPool: Y and Indices (row-major, or column-major for ``storage_order`` 1)."""
    windows = _windows(kernel_shape, strides, dilations, pads_begin, pads_end)
    return _run(X, out_spatial, windows, True, storage_order=storage_order)


@kernel("AveragePool", accepts=_supported)
def average_pool(
    X, *, kernel_shape, strides, dilations, pads_begin, pads_end, out_spatial, count_include_pad
):
    """numba AveragePool."""
    windows = _windows(kernel_shape, strides, dilations, pads_begin, pads_end)
    return _run(X, out_spatial, windows, False, include_pad=count_include_pad)


@numba.njit(cache=True, nogil=True)
def _pool_grad_kernel(dy, x, dx, k, s, d, pb, pe, is_max, include_pad):
    """Scatter ``dy`` into ``dx`` (zeroed): to the first max (``is_max``) or evenly."""
    B, D, H, W = dx.shape
    _, OD, OH, OW = dy.shape
    lod, hid = _tap_ranges(OD, D, k[0], s[0], d[0], pb[0])
    loh, hih = _tap_ranges(OH, H, k[1], s[1], d[1], pb[1])
    low, hiw = _tap_ranges(OW, W, k[2], s[2], d[2], pb[2])
    for b in range(B):
        for od in range(OD):
            z0 = od * s[0] - pb[0]
            for oh in range(OH):
                h0 = oh * s[1] - pb[1]
                for ow in range(OW):
                    w0 = ow * s[2] - pb[2]
                    if hid[od] <= lod[od] or hih[oh] <= loh[oh] or hiw[ow] <= low[ow]:
                        continue  # no tap inside the input
                    g = dy[b, od, oh, ow]
                    if is_max:
                        # same scan as the forward: first valid tap, then strictly larger
                        bz = z0 + lod[od] * d[0]
                        bh = h0 + loh[oh] * d[1]
                        bw = w0 + low[ow] * d[2]
                        best = x[b, bz, bh, bw]
                        for tz in range(lod[od], hid[od]):
                            z = z0 + tz * d[0]
                            for th in range(loh[oh], hih[oh]):
                                h = h0 + th * d[1]
                                for tw in range(low[ow], hiw[ow]):
                                    w = w0 + tw * d[2]
                                    v = x[b, z, h, w]
                                    if v > best:
                                        best = v
                                        bz, bh, bw = z, h, w
                        dx[b, bz, bh, bw] += g
                    else:
                        if include_pad:
                            cz = _count_until(z0, k[0], d[0], D + pe[0])
                            ch = _count_until(h0, k[1], d[1], H + pe[1])
                            cw = _count_until(w0, k[2], d[2], W + pe[2])
                        else:
                            cz = hid[od] - lod[od]
                            ch = hih[oh] - loh[oh]
                            cw = hiw[ow] - low[ow]
                        share = g / (cz * ch * cw)
                        for tz in range(lod[od], hid[od]):
                            z = z0 + tz * d[0]
                            for th in range(loh[oh], hih[oh]):
                                h = h0 + th * d[1]
                                for tw in range(low[ow], hiw[ow]):
                                    dx[b, z, h, w0 + tw * d[2]] += share


def _run_grad(dY, X, shape, out_spatial, windows, is_max, include_pad=False):
    """Run the grad kernel on ``(N*C, D, H, W)`` views; ``X`` is only read for max."""
    N, C, *sp = shape
    ones = (1,) * (3 - len(sp))
    dy = np.ascontiguousarray(dY).reshape((N * C, *ones, *out_spatial))
    k, s, d, pb, pe = windows
    x4 = (N * C, *ones, *sp)
    if is_max and _pairs(x4[1:], k, s, d, pb, dy.shape[1:]):
        covered = all(o * kk == n for o, kk, n in zip(dy.shape[1:], k, x4[1:], strict=True))
        dx = (np.empty if covered else np.zeros)(x4, dY.dtype)  # uncovered rows get 0
        _max_pool_grad_pairs(dy, np.ascontiguousarray(X).reshape(x4), dx, k[0], k[1])
        return dx.reshape(tuple(shape))
    dx = np.zeros(x4, dY.dtype)
    x = dx if X is None else np.ascontiguousarray(X).reshape(dx.shape)
    if is_max and _flat_depth(dx, k, pb):
        _max_pool_grad_2d(dy, x, dx, k, s, d, pb)
    else:
        _pool_grad_kernel(dy, x, dx, k, s, d, pb, pe, is_max, bool(include_pad))
    return dx.reshape(tuple(shape))


def _accepts_max_grad(dY, X, **attrs) -> bool:
    return _supported(X) and dY.dtype == X.dtype


@kernel("MaxPoolGrad", accepts=_accepts_max_grad, domain="dfdl")
def max_pool_grad(
    dY, X, *, kernel_shape, strides, dilations, pads_begin, pads_end, out_spatial, crop
):
    """numba dfdl.MaxPoolGrad, cut to the tile's slab ``crop`` (None: all of dX)."""
    windows = _windows(kernel_shape, strides, dilations, pads_begin, pads_end)
    return crop_slab(_run_grad(dY, X, X.shape, out_spatial, windows, True), crop)


@kernel("AveragePoolGrad", accepts=_supported, domain="dfdl")
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
    """numba dfdl.AveragePoolGrad: dX of shape ``input_shape``."""
    windows = _windows(kernel_shape, strides, dilations, pads_begin, pads_end)
    return _run_grad(
        dY, None, input_shape, out_spatial, windows, False, include_pad=count_include_pad
    )
