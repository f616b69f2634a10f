"""CPU kernels for Conv, ConvTranspose and their gradients (dfdl.ConvGradInput,
dfdl.ConvGradWeight): numba im2col / col2im around a BLAS GEMM.

Every convolution is run as 3-D (1-D and 2-D get leading singleton spatial axes).
Conv: ``cols = im2col(x)`` of shape (C/g * kd*kh*kw, positions), then ``y = W @ cols``.
ConvTranspose and ConvGradInput (the same scatter): ``cols = W^T @ x``, then ``col2im``
scatter-adds cols into the output. ConvGradWeight: ``dW = dY @ im2col(x)^T``.
The cols buffer is built in blocks of at most ``COLS_BYTES`` (several samples at once
when images are small, a range of output rows when they are large), so the temporary
stays bounded whatever the tile size. float32/float64 only; other dtypes use the numpy
forward.

Three geometries take other kernels first: the stride-1 3x3 stencils of
:mod:`dfdl.ops.cpu.conv_direct` (few channels, large images: the 3-D U-Net), then
Winograd F(2x2, 3x3) (:mod:`dfdl.ops.cpu.winograd`: 2-D, 3x3, stride 1, pad 1, float32,
at least 32 channels: the ResNet's stages), then 1x1 kernels without padding at any
stride (:mod:`dfdl.ops.cpu.conv_pointwise`: a ResNet's shortcuts), for the forward and
both gradients.
"""

from __future__ import annotations

import numba
import numpy as np

from dfdl.ops.cpu import conv_direct, conv_pointwise, winograd
from dfdl.ops.cpu.blas import matmul

#: upper bound on one im2col/col2im buffer (bytes)
COLS_BYTES = 4 << 20
#: fewest channels per group for the channels-last path (each kernel offset copies this
#: many contiguous values; with fewer, the channels-first rows are the longer runs)
CL_MIN_CHANNELS = 4

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


# Both loops below index flat views with unsigned integers: numba then emits no
# negative-index wraparound check, and the contiguous copies vectorize.


@numba.njit(cache=True, nogil=True)
def _im2col(x, cols, col0, r0, r1, out_h, out_w, k, s, d, p):
    """Write output rows ``r0:r1`` (row = od*out_h + oh) of ``x`` (C, D, H, W) into
    ``cols[:, col0:]``; cols row = ((c*kd + i)*kh + j)*kw + l, zero where padded."""
    n_c, n_d, n_h, n_w = x.shape
    xf = x.reshape(x.size)
    cf = cols.reshape(cols.size)
    sw = np.uint64(s[2])
    row = 0
    for c in range(n_c):
        for i in range(k[0]):
            for j in range(k[1]):
                for l in range(k[2]):
                    off_w = l * d[2] - p[2]
                    # output columns whose input column ow*sw + off_w lies inside x
                    lo = min(max(0, -(off_w // s[2])), out_w)
                    hi = max(min(out_w, (n_w - 1 - off_w) // s[2] + 1), lo)
                    od, oh = r0 // out_h, r0 % out_h
                    base = row * cols.shape[1] + col0
                    for _ in range(r0, r1):
                        iz = od * s[0] + i * d[0] - p[0]
                        iy = oh * s[1] + j * d[1] - p[1]
                        dst = np.uint64(base)
                        if iz < 0 or iz >= n_d or iy < 0 or iy >= n_h:
                            for ow in range(np.uint64(out_w)):
                                cf[dst + ow] = 0
                        else:
                            src = np.uint64(((c * n_d + iz) * n_h + iy) * n_w + off_w + lo * s[2])
                            for ow in range(np.uint64(lo)):
                                cf[dst + ow] = 0
                            dst += np.uint64(lo)
                            if s[2] == 1:
                                for t in range(np.uint64(hi - lo)):
                                    cf[dst + t] = xf[src + t]
                            else:
                                for t in range(np.uint64(hi - lo)):
                                    cf[dst + t] = xf[src + t * sw]
                            dst = np.uint64(base)
                            for ow in range(np.uint64(hi), np.uint64(out_w)):
                                cf[dst + ow] = 0
                        base += out_w
                        oh += 1
                        if oh == out_h:
                            oh, od = 0, od + 1
                    row += 1


@numba.njit(cache=True, nogil=True)
def _col2im(cols, col0, r0, r1, in_h, in_w, y, k, s, d, p):
    """Scatter-add ``cols[:, col0:]`` (input rows ``r0:r1``, row = id*in_h + ih) into
    ``y`` (C, D, H, W): input position i, kernel offset o lands on i*s + o*d - p."""
    n_c, n_d, n_h, n_w = y.shape
    yf = y.reshape(y.size)
    cf = cols.reshape(cols.size)
    sw = np.uint64(s[2])
    row = 0
    for c in range(n_c):
        for i in range(k[0]):
            for j in range(k[1]):
                for l in range(k[2]):
                    off_w = l * d[2] - p[2]
                    # input columns whose output column iw*sw + off_w lies inside y
                    lo = min(max(0, -(off_w // s[2])), in_w)
                    hi = max(min(in_w, (n_w - 1 - off_w) // s[2] + 1), lo)
                    iz, iy = r0 // in_h, r0 % in_h
                    base = row * cols.shape[1] + col0
                    for _ in range(r0, r1):
                        oz = iz * s[0] + i * d[0] - p[0]
                        oy = iy * s[1] + j * d[1] - p[1]
                        if 0 <= oz < n_d and 0 <= oy < n_h:
                            src = np.uint64(base + lo)
                            dst = np.uint64(((c * n_d + oz) * n_h + oy) * n_w + off_w + lo * s[2])
                            for t in range(np.uint64(hi - lo)):
                                yf[dst + t * sw] += cf[src + t]
                        base += in_w
                        iy += 1
                        if iy == in_h:
                            iy, iz = 0, iz + 1
                    row += 1


@numba.njit(cache=True, nogil=True)
def _im2col_cl(x, cols, row0, out_d, out_h, out_w, k, s, d, p, c0, cg):
    """Channels-last im2col of one sample ``x`` (D, H, W, C): output position q (row-major
    over (out_d, out_h, out_w)) fills ``cols[row0 + q]`` with channels ``c0:c0+cg`` at
    each kernel offset, column ((i*kh + j)*kw + l)*cg + c, zero where padded."""
    n_d, n_h, n_w, n_c = x.shape
    xf = x.reshape(x.size)
    cf = cols.reshape(cols.size)
    ucg = np.uint64(cg)
    dst = np.uint64(row0 * cols.shape[1])
    for od in range(out_d):
        for oh in range(out_h):
            for ow in range(out_w):
                for i in range(k[0]):
                    iz = od * s[0] + i * d[0] - p[0]
                    for j in range(k[1]):
                        iy = oh * s[1] + j * d[1] - p[1]
                        for l in range(k[2]):
                            ix = ow * s[2] + l * d[2] - p[2]
                            if 0 <= iz < n_d and 0 <= iy < n_h and 0 <= ix < n_w:
                                src = np.uint64(((iz * n_h + iy) * n_w + ix) * n_c + c0)
                                for t in range(ucg):
                                    cf[dst + t] = xf[src + t]
                            else:
                                for t in range(ucg):
                                    cf[dst + t] = 0
                            dst += ucg


@numba.njit(cache=True, nogil=True)
def _col2im_cl(cols, row0, in_d, in_h, in_w, y, k, s, d, p, c0, cg):
    """Channels-last col2im: input position q (row-major over (in_d, in_h, in_w)) adds
    ``cols[row0 + q]`` (columns ordered as in :func:`_im2col_cl`) into channels
    ``c0:c0+cg`` of one sample ``y`` (D, H, W, C) at q*s + o*d - p."""
    n_d, n_h, n_w, n_c = y.shape
    yf = y.reshape(y.size)
    cf = cols.reshape(cols.size)
    ucg = np.uint64(cg)
    src = np.uint64(row0 * cols.shape[1])
    for iz in range(in_d):
        for iy in range(in_h):
            for ix in range(in_w):
                for i in range(k[0]):
                    oz = iz * s[0] + i * d[0] - p[0]
                    for j in range(k[1]):
                        oy = iy * s[1] + j * d[1] - p[1]
                        for l in range(k[2]):
                            ox = ix * s[2] + l * d[2] - p[2]
                            if 0 <= oz < n_d and 0 <= oy < n_h and 0 <= ox < n_w:
                                dst = np.uint64(((oz * n_h + oy) * n_w + ox) * n_c + c0)
                                for t in range(ucg):
                                    yf[dst + t] += cf[src + t]
                            src += ucg


def _channels_last(x: np.ndarray) -> np.ndarray:
    """(N, C, D, H, W) -> a contiguous (N, D, H, W, C) copy."""
    return np.ascontiguousarray(np.moveaxis(x, 1, -1))


def _cl_samples(npos: int, kk: int, channels: int, itemsize: int) -> int:
    """Samples per block of the channels-last path, 0 where it does not apply: one
    sample's cols (``npos`` x ``kk``) must fit ``COLS_BYTES`` and the channels copied per
    kernel offset (``channels``) must be at least ``CL_MIN_CHANNELS``."""
    sample_bytes = max(1, npos * kk * itemsize)
    if channels < CL_MIN_CHANNELS or sample_bytes > COLS_BYTES:
        return 0
    return COLS_BYTES // sample_bytes


def _to3d(values, fill: int) -> np.ndarray:
    values = tuple(values)
    return np.array((fill,) * (3 - len(values)) + values, dtype=np.int64)


def _blocks(n: int, per_block: int) -> list[tuple[int, int]]:
    """Split range(n) into near-equal blocks of at most ``per_block`` items."""
    if n == 0:
        return []
    count = -(-n // max(1, per_block))
    size = -(-n // count)
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def _plan(n: int, rows: int, row_len: int, kk: int, itemsize: int):
    """Blocks ``(n0, n1, r0, r1)`` of (samples, rows) whose cols buffer (kk rows) fits
    ``COLS_BYTES``, and the widest block's column count."""
    sample_bytes = kk * rows * row_len * itemsize
    if sample_bytes <= COLS_BYTES:  # small images: several samples side by side
        blocks = [(a, b, 0, rows) for a, b in _blocks(n, COLS_BYTES // max(1, sample_bytes))]
        width = max((b - a for a, b, _, _ in blocks), default=0) * rows * row_len
    else:  # large images: a range of rows of one sample
        row_blocks = _blocks(rows, COLS_BYTES // (kk * row_len * itemsize))
        blocks = [(i, i + 1, a, b) for i in range(n) for a, b in row_blocks]
        width = max(b - a for a, b in row_blocks) * row_len
    return blocks, width


def _direct(geo, x_shape, w_shape, group, dtype) -> bool:
    """Whether the forward geometry ``geo`` takes :mod:`dfdl.ops.cpu.conv_direct`."""
    return conv_direct.applies(
        x_shape,
        w_shape,
        geo.strides,
        geo.dilations,
        group,
        geo.pads_begin,
        geo.pads_end,
        geo.out,
        dtype,
    )


def _winograd(geo, x_shape, w_shape, group, dtype) -> bool:
    """Whether the forward geometry ``geo`` takes :mod:`dfdl.ops.cpu.winograd`."""
    return winograd.applies(x_shape, w_shape, *_same_attrs(geo, group), dtype)


def _pointwise(geo, w_shape, group) -> bool:
    """Whether ``geo`` takes :mod:`dfdl.ops.cpu.conv_pointwise`."""
    return conv_pointwise.applies(w_shape, group, geo.pads_begin, geo.pads_end)


def _supported(X, W, B) -> bool:
    return (
        X.dtype in _FLOATS
        and W.dtype == X.dtype
        and (B is None or B.dtype == X.dtype)
        and 3 <= X.ndim <= 5
    )


def conv_cpu(
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
    """Conv tile kernel: numba im2col + BLAS matmul; same signature as the forward."""
    from dfdl.ops import conv as ops  # lazy: dfdl.ops.conv imports this module

    attrs = {
        "auto_pad": auto_pad,
        "dilations": dilations,
        "kernel_shape": kernel_shape,
        "pads": pads,
        "strides": strides,
    }
    if not _supported(X, W, B):
        return ops.Conv(X, W, B, group=group, **attrs)
    geo = ops.conv_geometry(X.shape, W.shape, **attrs)
    if _direct(geo, X.shape, W.shape, group, X.dtype):
        y = conv_direct.conv(np.ascontiguousarray(X), W, geo.pads_begin, geo.pads_end)
        if B is not None:
            y += B.reshape((1, -1) + (1,) * (X.ndim - 2))
        return y
    if _winograd(geo, X.shape, W.shape, group, X.dtype):
        y = winograd.conv(X, np.ascontiguousarray(W))
        if B is not None:
            y += B.reshape(1, -1, 1, 1)
        return y
    if _pointwise(geo, W.shape, group):
        y = conv_pointwise.conv(X, W, geo.strides)
        if B is not None:
            y += B.reshape((1, -1) + (1,) * (X.ndim - 2))
        return y
    n, c = X.shape[:2]
    m = W.shape[0]
    cg, mg = c // group, m // group
    x = np.ascontiguousarray(X).reshape((n, c, *_to3d(X.shape[2:], 1)))
    k, s, d = _to3d(geo.kernel, 1), _to3d(geo.strides, 1), _to3d(geo.dilations, 1)
    p = _to3d(geo.pads_begin, 0)
    out_d, out_h, out_w = (int(v) for v in _to3d(geo.out, 1))
    rows, npos = out_d * out_h, out_d * out_h * out_w
    kk = cg * int(np.prod(k))
    w2 = np.ascontiguousarray(W).reshape(group, mg, kk)
    pointwise = kk == cg and not p.any() and (s == 1).all() and npos == x[0, 0].size
    per = 0 if pointwise else _cl_samples(npos, kk, cg, X.itemsize)
    if per:
        y = _conv_cl(x, W, group, per, (out_d, out_h, out_w), k, s, d, p)
        if B is not None:
            y += B.reshape(1, m, 1)
        return y.reshape((n, m, *geo.out))
    y = np.empty((n, m, npos), X.dtype)
    blocks, width = ([], 0) if pointwise else _plan(n, rows, out_w, kk, X.itemsize)
    buf = np.empty(kk * width, X.dtype)  # one buffer, reused by every block
    for g in range(group):
        xg = x[:, g * cg : (g + 1) * cg]
        yg = y[:, g * mg : (g + 1) * mg]
        if pointwise:  # 1x1 kernel, stride 1, no pad: cols is the input itself
            matmul(w2[g], xg.reshape(n, cg, npos), out=yg)
        for n0, n1, r0, r1 in blocks:
            step = (r1 - r0) * out_w
            cols = buf[: kk * step * (n1 - n0)].reshape(kk, step * (n1 - n0))
            for i in range(n1 - n0):
                _im2col(xg[n0 + i], cols, i * step, r0, r1, out_h, out_w, k, s, d, p)
            if n1 - n0 == 1:
                matmul(w2[g], cols, out=yg[n0, :, r0 * out_w : r1 * out_w])
            else:  # one product per sample, each into its place (one batched BLAS call)
                per_sample = cols.reshape(kk, n1 - n0, step).transpose(1, 0, 2)
                matmul(w2[g], per_sample, out=yg[n0:n1, :, r0 * out_w : r1 * out_w])
    if B is not None:
        y += B.reshape(1, m, 1)
    return y.reshape((n, m, *geo.out))


def _conv_cl(x, W, group, per, out, k, s, d, p) -> np.ndarray:
    """Conv of ``x`` (N, C, D, H, W) as (N, C_out, positions), channels-last: per block of
    ``per`` samples, ``cols`` (positions x C/g*k) from :func:`_im2col_cl`, then
    ``cols @ W_g^T`` (positions x C_out/g). Long contiguous copies whatever the image
    width, and the positions are the GEMM's long side."""
    n, c = x.shape[:2]
    m = W.shape[0]
    cg, mg, kv = c // group, m // group, int(np.prod(k))
    npos = int(np.prod(out))
    # (C_out, C/g, k) -> (group, C_out/g, k * C/g), the column order of _im2col_cl
    wcl = np.ascontiguousarray(W.reshape(group, mg, cg, kv).transpose(0, 1, 3, 2))
    wcl = wcl.reshape(group, mg, kv * cg)
    per = min(per, n)
    cols = np.empty((per * npos, kv * cg), x.dtype)
    ycl = np.empty((per * npos, m), x.dtype)
    y = np.empty((n, m, npos), x.dtype)
    for n0 in range(0, n, per):
        nb = min(per, n - n0)
        xcl = _channels_last(x[n0 : n0 + nb])
        for g in range(group):
            for i in range(nb):
                _im2col_cl(xcl[i], cols, i * npos, *out, k, s, d, p, g * cg, cg)
            matmul(cols[: nb * npos], wcl[g].T, out=ycl[: nb * npos, g * mg : (g + 1) * mg])
        y[n0 : n0 + nb] = ycl[: nb * npos].reshape(nb, npos, m).transpose(0, 2, 1)
    return y


def _conv_grad_weight_cl(x, dy, group, per, out, k, s, d, p) -> np.ndarray:
    """dW of a Conv as (group, C_out/g, C/g, k), channels-last: per block of ``per``
    samples, ``dW_g += dY_g^T @ cols`` with dY as (positions x C_out)."""
    n, c = x.shape[:2]
    m = dy.shape[1]
    cg, mg, kv = c // group, m // group, int(np.prod(k))
    npos = int(np.prod(out))
    per = min(per, n)
    cols = np.empty((per * npos, kv * cg), x.dtype)
    dw = np.zeros((group, mg, kv * cg), x.dtype)
    for n0 in range(0, n, per):
        nb = min(per, n - n0)
        xcl = _channels_last(x[n0 : n0 + nb])
        dycl = _channels_last(dy[n0 : n0 + nb]).reshape(nb * npos, m)
        for g in range(group):
            for i in range(nb):
                _im2col_cl(xcl[i], cols, i * npos, *out, k, s, d, p, g * cg, cg)
            matmul(dycl[:, g * mg : (g + 1) * mg].T, cols[: nb * npos], dw[g], accumulate=True)
    # (group, C_out/g, k * C/g) -> (group, C_out/g, C/g, k)
    return dw.reshape(group, mg, kv, cg).transpose(0, 1, 3, 2)


def _scatter_cl(x, W, group, per, out, k, s, d, p) -> np.ndarray:
    """:func:`_scatter` channels-last: per block of ``per`` samples, ``cols = x @ W_g``
    (input positions x k*C_out/g), then :func:`_col2im_cl`; returns (N, C_out, D, H, W)."""
    n, c = x.shape[:2]
    mg = W.shape[1]
    m, cg, kv = mg * group, c // group, int(np.prod(k))
    in_sp = x.shape[2:]
    npos = int(np.prod(in_sp))
    # (C, C_out/g, k) -> (group, C/g, k * C_out/g), the column order of _col2im_cl
    wcl = np.ascontiguousarray(W.reshape(group, cg, mg, kv).transpose(0, 1, 3, 2))
    wcl = wcl.reshape(group, cg, kv * mg)
    per = min(per, n)
    cols = np.empty((per * npos, kv * mg), x.dtype)
    ycl = np.empty((per, *out, m), x.dtype)
    y = np.empty((n, m, *out), x.dtype)
    for n0 in range(0, n, per):
        nb = min(per, n - n0)
        xcl = _channels_last(x[n0 : n0 + nb]).reshape(nb * npos, c)
        ycl[:nb] = 0
        for g in range(group):
            matmul(xcl[:, g * cg : (g + 1) * cg], wcl[g], out=cols[: nb * npos])
            for i in range(nb):
                _col2im_cl(cols, i * npos, *in_sp, ycl[i], k, s, d, p, g * mg, mg)
        y[n0 : n0 + nb] = np.moveaxis(ycl[:nb], -1, 1)
    return y


def conv_transpose_cpu(
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
    """ConvTranspose tile kernel: BLAS matmul + numba col2im; same signature as the
    forward."""
    from dfdl.ops import conv as ops  # lazy: dfdl.ops.conv imports this module

    attrs = {
        "auto_pad": auto_pad,
        "dilations": dilations,
        "kernel_shape": kernel_shape,
        "output_padding": output_padding,
        "output_shape": output_shape,
        "pads": pads,
        "strides": strides,
    }
    if not _supported(X, W, B):
        return ops.ConvTranspose(X, W, B, group=group, **attrs)
    geo = ops.conv_transpose_geometry(X.shape, W.shape, **attrs)
    y = _scatter(X, W, group, geo.kernel, geo.strides, geo.dilations, geo.pads_begin, geo.out)
    n, m = y.shape[:2]
    if B is not None:
        y += B.reshape((1, m, 1, 1, 1))
    return y.reshape((n, m, *geo.out))


def _scatter(X, W, group, kernel, strides, dilations, pads_begin, out) -> np.ndarray:
    """Transposed convolution core: ``cols = W^T @ x`` then col2im into a zero output of
    spatial size ``out`` (returned as (N, C_out, D, H, W)); input position i, kernel
    offset o lands on output position i*s + o*d - pad."""
    n, c = X.shape[:2]
    mg = W.shape[1]
    m, cg = mg * group, c // group
    in_d, in_h, in_w = (int(v) for v in _to3d(X.shape[2:], 1))
    rows, npos = in_d * in_h, in_d * in_h * in_w
    x = np.ascontiguousarray(X).reshape(n, c, npos)
    k, s, d = _to3d(kernel, 1), _to3d(strides, 1), _to3d(dilations, 1)
    p = _to3d(pads_begin, 0)
    kk = mg * int(np.prod(k))
    per = _cl_samples(npos, kk, mg, X.itemsize)
    if per:
        x5 = x.reshape(n, c, in_d, in_h, in_w)
        return _scatter_cl(x5, W, group, per, tuple(int(v) for v in _to3d(out, 1)), k, s, d, p)
    # (group, C/g, C_out/g * k) -> (group, C_out/g * k, C/g): cols = wt @ x
    wt = np.ascontiguousarray(W.reshape(group, cg, kk).transpose(0, 2, 1))
    y = np.zeros((n, m, *_to3d(out, 1)), X.dtype)
    blocks, width = _plan(n, rows, in_w, kk, X.itemsize)
    buf = np.empty(kk * width, X.dtype)  # one buffer, reused by every block
    for g in range(group):
        xg = x[:, g * cg : (g + 1) * cg]
        yg = y[:, g * mg : (g + 1) * mg]
        for n0, n1, r0, r1 in blocks:
            step = (r1 - r0) * in_w
            cols = buf[: kk * step * (n1 - n0)].reshape(kk, step * (n1 - n0))
            if n1 - n0 == 1:
                matmul(wt[g], xg[n0, :, r0 * in_w : r1 * in_w], out=cols)
            else:  # samples side by side: (C/g, n * positions)
                xs = xg[n0:n1].transpose(1, 0, 2).reshape(cg, (n1 - n0) * npos)
                matmul(wt[g], xs, out=cols)
            for i in range(n1 - n0):
                _col2im(cols, i * step, r0, r1, in_h, in_w, yg[n0 + i], k, s, d, p)
    return y


def _same_attrs(geo, group: int = 1) -> tuple:
    """(strides, dilations, group, pads_begin, pads_end) of ``geo`` with ``group``."""
    return geo.strides, geo.dilations, group, geo.pads_begin, geo.pads_end


def _grad_attrs(auto_pad, dilations, kernel_shape, pads, strides) -> dict:
    return {
        "auto_pad": auto_pad,
        "dilations": dilations,
        "kernel_shape": kernel_shape,
        "pads": pads,
        "strides": strides,
    }


def conv_grad_input_cpu(
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
    """dfdl.ConvGradInput tile kernel (a Conv's dX): BLAS matmul + numba col2im."""
    from dfdl.ops import conv as ops  # lazy: dfdl.ops.conv imports this module

    attrs = _grad_attrs(auto_pad, dilations, kernel_shape, pads, strides)
    if not _supported(dY, W, None):
        return ops.ConvGradInput(dY, W, group=group, input_shape=input_shape, **attrs)
    shape = tuple(int(v) for v in input_shape)
    geo = ops.conv_geometry(shape, W.shape, **attrs)
    if _direct(geo, shape, W.shape, group, dY.dtype):
        return conv_direct.conv_grad_input(
            np.ascontiguousarray(dY), W, geo.pads_begin, geo.pads_end, shape[2:]
        )
    if _winograd(geo, shape, W.shape, group, dY.dtype):
        # dX of a 3x3 stride-1 pad-1 conv: the same conv of dY with W flipped, C <-> C_out
        flipped = np.ascontiguousarray(W[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
        return winograd.conv(dY, flipped).reshape(shape)
    if _pointwise(geo, W.shape, group):
        return conv_pointwise.conv_grad_input(dY, W, geo.strides, shape)
    # dX is the transposed convolution of dY with the same W, pads and strides
    y = _scatter(dY, W, group, geo.kernel, geo.strides, geo.dilations, geo.pads_begin, shape[2:])
    return y.reshape(shape)


def conv_grad_weight_cpu(
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
    """dfdl.ConvGradWeight tile kernel (a Conv's dW): numba im2col + BLAS ``dY @ cols^T``."""
    from dfdl.ops import conv as ops  # lazy: dfdl.ops.conv imports this module

    attrs = _grad_attrs(auto_pad, dilations, kernel_shape, pads, strides)
    if not _supported(X, dY, None):
        return ops.ConvGradWeight(X, dY, group=group, weight_shape=weight_shape, **attrs)
    wshape = tuple(int(v) for v in weight_shape)
    geo = ops.conv_geometry(X.shape, wshape, **attrs)
    if _direct(geo, X.shape, wshape, group, X.dtype):
        return conv_direct.conv_grad_weight(
            np.ascontiguousarray(X),
            np.ascontiguousarray(dY),
            geo.pads_begin,
            geo.pads_end,
            geo.kernel,
        )
    if _winograd(geo, X.shape, wshape, group, X.dtype):
        return winograd.conv_grad_weight(X, dY).reshape(wshape)
    if _pointwise(geo, wshape, group):
        return conv_pointwise.conv_grad_weight(X, dY, geo.strides, wshape)
    n, c = X.shape[:2]
    m = wshape[0]
    cg, mg = c // group, m // group
    x = np.ascontiguousarray(X).reshape((n, c, *_to3d(X.shape[2:], 1)))
    k, s, d = _to3d(geo.kernel, 1), _to3d(geo.strides, 1), _to3d(geo.dilations, 1)
    p = _to3d(geo.pads_begin, 0)
    out_d, out_h, out_w = (int(v) for v in _to3d(geo.out, 1))
    rows, npos = out_d * out_h, out_d * out_h * out_w
    kk = cg * int(np.prod(k))
    dy = np.ascontiguousarray(dY).reshape(n, m, npos)
    per = _cl_samples(npos, kk, cg, X.itemsize)
    if per:
        dw = _conv_grad_weight_cl(x, dy, group, per, (out_d, out_h, out_w), k, s, d, p)
        return dw.reshape(wshape)
    dw = np.zeros((group, mg, kk), X.dtype)
    blocks, width = _plan(n, rows, out_w, kk, X.itemsize)
    buf = np.empty(kk * width, X.dtype)  # one buffer, reused by every block
    for g in range(group):
        xg = x[:, g * cg : (g + 1) * cg]
        dyg = dy[:, g * mg : (g + 1) * mg]
        for n0, n1, r0, r1 in blocks:
            step = (r1 - r0) * out_w
            cols = buf[: kk * step * (n1 - n0)].reshape(kk, step * (n1 - n0))
            for i in range(n1 - n0):
                _im2col(xg[n0 + i], cols, i * step, r0, r1, out_h, out_w, k, s, d, p)
            # contract positions: dW_g += dY_g @ cols^T (BLAS reads the transpose in place),
            # sample by sample (gathering dY's samples side by side was a copy of dY)
            for i in range(n1 - n0):
                dyb = dyg[n0 + i, :, r0 * out_w : r1 * out_w]
                matmul(dyb, cols[:, i * step : (i + 1) * step].T, dw[g], accumulate=True)
    return dw.reshape(wshape)
