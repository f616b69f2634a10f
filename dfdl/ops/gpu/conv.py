"""cupy kernels of the convolutions: Conv, ConvTranspose and Conv's gradients
(dfdl.ConvGradInput, dfdl.ConvGradWeight), 1-3-D, with groups, strides and dilations.

Each is one cuBLAS GEMM per group over an im2col matrix: a strided view of the
zero-padded input (one row per input channel and kernel tap, one column per batch
element and output position) copied once. The scatters back (ConvGradInput's and
ConvTranspose's col2im) add the taps one after another in the kernel's row-major order,
as the numpy forwards do, so a run repeats bit for bit. A 1x1 convolution with unit
strides and no padding is one batched GEMM on the input as it lies.

Example:
    >>> from dfdl.ops import REGISTRY
    >>> REGISTRY["Conv"].kernel("gpu").kernel.__name__
    'conv'
"""

from __future__ import annotations

import math

import numpy as np

from dfdl.ops.gpu.device import cupy, namespace, to_device
from dfdl.ops.gpu.kernels import floats
from dfdl.ops.registry import DFDL_DOMAIN, kernel


def _accepts(X, W, B=None, **attrs) -> bool:
    return floats(X, W, B)


def window(a, starts, sizes, fill=0):
    """``a[..., starts:starts+sizes]`` over the trailing axes, ``fill`` outside ``a``
    (``a`` itself when that is all of it).

    Example:
        >>> window(np.arange(3.0), [-1], [4])
        array([0., 0., 1., 2.])
    """
    nd = len(starts)
    lead = a.shape[: a.ndim - nd]
    if all(s == 0 for s in starts) and tuple(sizes) == a.shape[a.ndim - nd :]:
        return a
    res = namespace(a).full((*lead, *sizes), fill, dtype=a.dtype)
    src, dst = [], []
    for st, size, n in zip(starts, sizes, a.shape[a.ndim - nd :], strict=True):
        lo, hi = max(st, 0), min(st + size, n)
        if hi <= lo:
            return res
        src.append(slice(lo, hi))
        dst.append(slice(lo - st, hi - st))
    res[(..., *dst)] = a[(..., *src)]
    return res


def extent(out, kernel, strides, dilations) -> list[int]:
    """Input positions the windows of ``out`` outputs span, per spatial axis.

    Example:
        >>> extent([4], [3], [2], [1])  # 4 outputs of a 3-tap window, stride 2
        [9]
    """
    return [
        (o - 1) * s + (k - 1) * d + 1
        for o, k, s, d in zip(out, kernel, strides, dilations, strict=True)
    ]


def taps_view(x, kernel, strides, dilations, pads_begin, out, fill=0):
    """``(N, C, *kernel, *out)`` strided view of ``x`` padded with ``fill``: element
    ``[n, c, t, o]`` is the input that tap ``t`` of output ``o``'s window reads.

    Example:
        >>> taps_view(np.arange(4.0).reshape(1, 1, 4), [2], [2], [1], [1], [3])[0, 0]
        array([[0., 1., 3.],
               [0., 2., 0.]])
    """
    cp = namespace(x)
    nd = len(out)
    xp = window(x, [-b for b in pads_begin], extent(out, kernel, strides, dilations), fill)
    xp = cp.ascontiguousarray(xp)
    st = xp.strides
    shape = (*xp.shape[:2], *kernel, *out)
    strides_ = (
        st[0],
        st[1],
        *(st[2 + i] * dilations[i] for i in range(nd)),
        *(st[2 + i] * strides[i] for i in range(nd)),
    )
    return cp.lib.stride_tricks.as_strided(xp, shape, strides_)


def _columns(x, kernel, strides, dilations, pads_begin, out, group):
    """im2col: ``(group, C/group * taps, N * outputs)``."""
    n, c = x.shape[:2]
    nd = len(out)
    v = taps_view(x, kernel, strides, dilations, pads_begin, out)
    perm = (1, *range(2, 2 + nd), 0, *range(2 + nd, 2 + 2 * nd))
    cols = cupy().ascontiguousarray(v.transpose(perm))
    return cols.reshape(group, (c // group) * math.prod(kernel), n * math.prod(out))


def _pointwise(kernel, strides, pads_begin, pads_end, group) -> bool:
    """A 1x1 convolution reading its input as it lies (one batched GEMM)."""
    return (
        group == 1 and set(kernel) == {1} and set(strides) == {1} and not any(pads_begin + pads_end)
    )


def _channels_first(y):
    """``(M, N, ...)`` -> C-ordered ``(N, M, ...)``."""
    return cupy().ascontiguousarray(y.swapaxes(0, 1))


def _add_bias(y, B):
    if B is not None:
        y += to_device(B).reshape((1, -1) + (1,) * (y.ndim - 2))
    return y


def _scatter_taps(cols, kernel, strides, dilations, spatial):
    """col2im: ``cols`` ``(C, *kernel, N, *positions)`` added into zeros of ``(N, C,
    *spatial)`` tap by tap, position ``p`` of tap ``t`` at ``p * strides + t * dilations``."""
    cp = cupy()
    c, n = cols.shape[0], cols.shape[1 + len(kernel)]
    positions = cols.shape[2 + len(kernel) :]
    acc = cp.zeros((n, c, *spatial), cols.dtype)
    for off in np.ndindex(*kernel):
        sl = tuple(
            slice(t * d, t * d + s * (p - 1) + 1, s)
            for t, d, s, p in zip(off, dilations, strides, positions, strict=True)
        )
        acc[(slice(None), slice(None), *sl)] += cols[(slice(None), *off)].swapaxes(0, 1)
    return acc


@kernel("Conv", "gpu", accepts=_accepts)
def conv(
    X, W, B=None, *, kernel_shape, strides, dilations, pads_begin, pads_end, out_spatial, group
):
    """Conv as ``W (group, M/group, C/group * taps) @ im2col(X)`` on cuBLAS."""
    cp = cupy()
    x, w = to_device(X), to_device(W)
    n, m = x.shape[0], w.shape[0]
    if _pointwise(kernel_shape, strides, pads_begin, pads_end, group):
        y = cp.matmul(w.reshape(m, -1), x.reshape(n, x.shape[1], -1))
        return _add_bias(y.reshape(n, m, *out_spatial), B)
    cols = _columns(x, kernel_shape, strides, dilations, pads_begin, out_spatial, group)
    y = cp.matmul(w.reshape(group, m // group, -1), cols)
    return _add_bias(_channels_first(y.reshape(m, n, *out_spatial)), B)


def _grad_accepts(A, B, **attrs) -> bool:
    return floats(A, B)


def _rows(dy, group):
    """dY ``(N, M, *out)`` as ``(group, M/group, N * outputs)``."""
    n, m = dy.shape[:2]
    t = cupy().ascontiguousarray(dy.reshape(n, m, -1).swapaxes(0, 1))
    return t.reshape(group, m // group, -1)


@kernel("ConvGradInput", "gpu", accepts=_grad_accepts, domain=DFDL_DOMAIN)
def conv_grad_input(
    dY,
    W,
    *,
    kernel_shape,
    strides,
    dilations,
    pads_begin,
    pads_end,
    out_spatial,
    group,
    input_shape,
):
    """dX as ``W^T @ dY`` per group on cuBLAS, then col2im over the taps."""
    cp = cupy()
    dy, w = to_device(dY), to_device(W)
    n, c = input_shape[:2]
    m = w.shape[0]
    if _pointwise(kernel_shape, strides, pads_begin, pads_end, group):
        dx = cp.matmul(w.reshape(m, c).T, dy.reshape(n, m, -1))
        return dx.reshape(input_shape)
    wt = w.reshape(group, m // group, -1).transpose(0, 2, 1)
    cols = cp.matmul(wt, _rows(dy, group)).reshape(c, *kernel_shape, n, *out_spatial)
    span = extent(out_spatial, kernel_shape, strides, dilations)
    dxp = _scatter_taps(cols, kernel_shape, strides, dilations, span)
    return cp.ascontiguousarray(window(dxp, pads_begin, input_shape[2:]))


@kernel("ConvGradWeight", "gpu", accepts=_grad_accepts, domain=DFDL_DOMAIN)
def conv_grad_weight(
    X,
    dY,
    *,
    kernel_shape,
    strides,
    dilations,
    pads_begin,
    pads_end,
    out_spatial,
    group,
    weight_shape,
):
    """dW as ``dY @ im2col(X)^T`` per group on cuBLAS (batch and positions contracted)."""
    cp = cupy()
    x, dy = to_device(X), to_device(dY)
    cols = _columns(x, kernel_shape, strides, dilations, pads_begin, out_spatial, group)
    dw = cp.matmul(_rows(dy, group), cols.transpose(0, 2, 1))
    return dw.reshape(weight_shape)


@kernel("ConvTranspose", "gpu", accepts=_accepts)
def conv_transpose(
    X, W, B=None, *, kernel_shape, strides, dilations, pads_begin, pads_end, out_spatial, group
):
    """ConvTranspose as ``W^T @ X`` per group on cuBLAS, then col2im over the taps and
    the pads cropped."""
    cp = cupy()
    x, w = to_device(X), to_device(W)
    n, c = x.shape[:2]
    m = w.shape[1] * group
    n_in = x.shape[2:]
    wt = w.reshape(group, c // group, -1).transpose(0, 2, 1)
    cols = cp.matmul(wt, _rows(x, group)).reshape(m, *kernel_shape, n, *n_in)
    full = extent(n_in, kernel_shape, strides, dilations)
    yf = _scatter_taps(cols, kernel_shape, strides, dilations, full)
    y = cp.ascontiguousarray(window(yf, pads_begin, out_spatial))
    return _add_bias(y, B)
