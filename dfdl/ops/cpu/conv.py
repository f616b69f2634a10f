"""CPU kernels for Conv, ConvTranspose and their gradients (dfdl.ConvGradInput,
dfdl.ConvGradWeight): numba im2col / col2im around a BLAS GEMM, and faster kernels
for the geometries that have one.

For each convolution :func:`algorithm` picks the first implementation of
:data:`ALGORITHMS` that applies to its forward geometry: the stride-1 3x3 stencils of
:mod:`dfdl.ops.cpu.conv_direct` (few channels, large images: the 3-D U-Net), Winograd
F(2x2, 3x3) of :mod:`dfdl.ops.cpu.winograd` (2-D, 3x3, stride 1, pad 1, float32, at
least 32 channels: the ResNet's stages; its forward sums the channels in blocks added
in float64, ``docs/design/float32-accuracy.md``), the 1x1 kernels of
:mod:`dfdl.ops.cpu.conv_pointwise` (a ResNet's shortcuts), else im2col: every
convolution runs as 3-D, ``y = W @ im2col(x)``; ConvTranspose and ConvGradInput scatter
``W^T @ x`` with ``col2im``; ConvGradWeight is ``dY @ im2col(x)^T``. The cols buffer is
built in blocks of at most :data:`COLS_BYTES`, so the temporary stays bounded whatever
the tile size. float32/float64 only; other dtypes use the numpy forward.

Guarantees: the choice depends only on a tile's geometry and dtype, never on timing or
the machine, so a run repeats bit for bit. :func:`run_conv`, :func:`run_grad_input`
and :func:`run_grad_weight` run one named implementation, which is how tests and
benchmarks compare them. The kernels receive the resolved geometry of
:func:`dfdl.ops.conv.conv_params`.

Example:
    >>> algorithm((8, 64, 16, 16), (64, 64, 3, 3), np.float32, kernel_shape=(3, 3),
    ...           strides=(1, 1), dilations=(1, 1), pads_begin=(1, 1), pads_end=(1, 1),
    ...           out_spatial=(16, 16), group=1)
    'winograd'

Measurements: ``docs/design/conv-direct.md``, ``winograd.md``, ``conv-pointwise.md``,
``im2col-in-place.md``, ``float32-accuracy.md``.
"""

from __future__ import annotations

import numba
import numpy as np

from dfdl.ops.cpu import conv_direct, conv_pointwise, winograd
from dfdl.ops.cpu.blas import matmul
from dfdl.ops.registry import kernel

#: upper bound on one im2col/col2im buffer (bytes)
COLS_BYTES = 4 << 20
#: fewest channels per group for the channels-last path (each kernel offset copies this
#: many contiguous values; with fewer, the channels-first rows are the longer runs)
CL_MIN_CHANNELS = 4

#: the implementations :func:`algorithm` picks from, in order of preference
ALGORITHMS = ("direct", "winograd", "pointwise", "im2col")

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


def _supported(X, W, B=None, **attrs) -> bool:
    """Whether the kernels take these arrays: float32 or float64 alike, 1-D to 3-D."""
    return (
        X.dtype in _FLOATS
        and W.dtype == X.dtype
        and (B is None or B.dtype == X.dtype)
        and 3 <= X.ndim <= 5
    )


def algorithm(
    x_shape,
    w_shape,
    dtype,
    *,
    kernel_shape,
    strides,
    dilations,
    pads_begin,
    pads_end,
    out_spatial,
    group,
) -> str:
    """The implementation the kernels pick for a convolution of this forward geometry
    (the Conv's, or the one whose dX or dW is taken): ``"direct"``
    (:mod:`dfdl.ops.cpu.conv_direct`), ``"winograd"`` (:mod:`dfdl.ops.cpu.winograd`),
    ``"pointwise"`` (:mod:`dfdl.ops.cpu.conv_pointwise`) or ``"im2col"``, the first
    that applies; the gradients run the same implementation as the forward.

    Example:
        >>> algorithm((8, 64, 16, 16), (64, 64, 3, 3), np.float32, kernel_shape=(3, 3),
        ...           strides=(1, 1), dilations=(1, 1), pads_begin=(1, 1), pads_end=(1, 1),
        ...           out_spatial=(16, 16), group=1)
        'winograd'
    """
    if conv_direct.applies(
        x_shape, w_shape, strides, dilations, group, pads_begin, pads_end, out_spatial, dtype
    ):
        return "direct"
    if winograd.applies(x_shape, w_shape, strides, dilations, group, pads_begin, pads_end, dtype):
        return "winograd"
    if conv_pointwise.applies(w_shape, group, pads_begin, pads_end):
        return "pointwise"
    return "im2col"


def _check_algorithm(algo: str) -> None:
    if algo not in ALGORITHMS:
        raise ValueError(f"unknown convolution algorithm {algo!r} (one of {ALGORITHMS})")


def run_conv(
    algo: str,
    X,
    W,
    B=None,
    *,
    kernel_shape,
    strides,
    dilations,
    pads_begin,
    pads_end,
    out_spatial,
    group,
) -> np.ndarray:
    """Conv of ``X`` and ``W`` (plus ``B``) by the implementation ``algo`` (see
    :func:`algorithm`; it must apply to the geometry), with the Conv kernel's parameters.

    Example:
        >>> x, w = np.ones((1, 2, 4, 4), np.float32), np.ones((3, 2, 3, 3), np.float32)
        >>> run_conv("im2col", x, w, kernel_shape=(3, 3), strides=(1, 1), dilations=(1, 1),
        ...          pads_begin=(0, 0), pads_end=(0, 0), out_spatial=(2, 2), group=1)[0, 0]
        array([[18., 18.],
               [18., 18.]], dtype=float32)
    """
    _check_algorithm(algo)
    if algo == "direct":
        y = conv_direct.conv(np.ascontiguousarray(X), W, pads_begin, pads_end)
        if B is not None:
            y += B.reshape((1, -1) + (1,) * (X.ndim - 2))
        return y
    if algo == "winograd":
        y = winograd.conv(X, np.ascontiguousarray(W))
        if B is not None:
            y += B.reshape(1, -1, 1, 1)
        return y
    if algo == "pointwise":
        y = conv_pointwise.conv(X, W, strides)
        if B is not None:
            y += B.reshape((1, -1) + (1,) * (X.ndim - 2))
        return y
    n, c = X.shape[:2]
    m = W.shape[0]
    cg, mg = c // group, m // group
    x = np.ascontiguousarray(X).reshape((n, c, *_to3d(X.shape[2:], 1)))
    k, s, d = _to3d(kernel_shape, 1), _to3d(strides, 1), _to3d(dilations, 1)
    p = _to3d(pads_begin, 0)
    out_d, out_h, out_w = (int(v) for v in _to3d(out_spatial, 1))
    rows, npos = out_d * out_h, out_d * out_h * out_w
    kk = cg * int(np.prod(k))
    w2 = np.ascontiguousarray(W).reshape(group, mg, kk)
    pointwise = kk == cg and not p.any() and (s == 1).all() and npos == x[0, 0].size
    per = 0 if pointwise else _cl_samples(npos, kk, cg, X.itemsize)
    if per:
        y = _conv_cl(x, W, group, per, (out_d, out_h, out_w), k, s, d, p)
        if B is not None:
            y += B.reshape(1, m, 1)
        return y.reshape((n, m, *out_spatial))
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
    return y.reshape((n, m, *out_spatial))


@kernel("Conv", accepts=_supported)
def conv(
    X, W, B=None, *, kernel_shape, strides, dilations, pads_begin, pads_end, out_spatial, group
):
    """Conv tile kernel: the first implementation of :func:`algorithm` that applies."""
    geo = dict(
        kernel_shape=kernel_shape,
        strides=strides,
        dilations=dilations,
        pads_begin=pads_begin,
        pads_end=pads_end,
        out_spatial=out_spatial,
        group=group,
    )
    return run_conv(algorithm(X.shape, W.shape, X.dtype, **geo), X, W, B, **geo)


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


@kernel("ConvTranspose", accepts=_supported)
def conv_transpose(
    X, W, B=None, *, kernel_shape, strides, dilations, pads_begin, pads_end, out_spatial, group
):
    """ConvTranspose tile kernel: BLAS matmul + numba col2im (``pads_end`` is implied by
    ``out_spatial``)."""
    y = _scatter(X, W, group, kernel_shape, strides, dilations, pads_begin, out_spatial)
    n, m = y.shape[:2]
    if B is not None:
        y += B.reshape((1, m, 1, 1, 1))
    return y.reshape((n, m, *out_spatial))


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


def _accepts_grad(A, B, **attrs) -> bool:
    return _supported(A, B)


def run_grad_input(
    algo: str,
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
) -> np.ndarray:
    """A Conv's dX (of shape ``input_shape``) from ``dY`` by the implementation ``algo``
    (see :func:`algorithm`), with the ConvGradInput kernel's parameters.

    Example:
        >>> dy, w = np.ones((1, 3, 2, 2), np.float32), np.ones((3, 2, 3, 3), np.float32)
        >>> run_grad_input("im2col", dy, w, kernel_shape=(3, 3), strides=(1, 1),
        ...                dilations=(1, 1), pads_begin=(0, 0), pads_end=(0, 0),
        ...                out_spatial=(2, 2), group=1, input_shape=(1, 2, 4, 4))[0, 0, 0]
        array([3., 6., 6., 3.], dtype=float32)
    """
    _check_algorithm(algo)
    if algo == "direct":
        return conv_direct.conv_grad_input(
            np.ascontiguousarray(dY), W, pads_begin, pads_end, input_shape[2:]
        )
    if algo == "winograd":
        # dX of a 3x3 stride-1 pad-1 conv: the same conv of dY with W flipped, C <-> C_out
        flipped = np.ascontiguousarray(W[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
        # one float32 sum over the channels: dX's error changed no gradient measurably
        return winograd.conv(dY, flipped, sum_channels=None).reshape(input_shape)
    if algo == "pointwise":
        return conv_pointwise.conv_grad_input(dY, W, strides, input_shape)
    # dX is the transposed convolution of dY with the same W, pads and strides
    y = _scatter(dY, W, group, kernel_shape, strides, dilations, pads_begin, input_shape[2:])
    return y.reshape(input_shape)


@kernel("ConvGradInput", accepts=_accepts_grad, domain="dfdl")
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
    """dfdl.ConvGradInput tile kernel (a Conv's dX): the first implementation of
    :func:`algorithm` that applies to the forward geometry."""
    geo = dict(
        kernel_shape=kernel_shape,
        strides=strides,
        dilations=dilations,
        pads_begin=pads_begin,
        pads_end=pads_end,
        out_spatial=out_spatial,
        group=group,
    )
    algo = algorithm(input_shape, W.shape, dY.dtype, **geo)
    return run_grad_input(algo, dY, W, **geo, input_shape=input_shape)


def run_grad_weight(
    algo: str,
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
) -> np.ndarray:
    """A Conv's dW (of shape ``weight_shape``) from ``X`` and ``dY`` by the implementation
    ``algo`` (see :func:`algorithm`), with the ConvGradWeight kernel's parameters.

    Example:
        >>> x, dy = np.ones((1, 2, 4, 4), np.float32), np.ones((1, 3, 2, 2), np.float32)
        >>> run_grad_weight("im2col", x, dy, kernel_shape=(3, 3), strides=(1, 1),
        ...                 dilations=(1, 1), pads_begin=(0, 0), pads_end=(0, 0),
        ...                 out_spatial=(2, 2), group=1, weight_shape=(3, 2, 3, 3))[0, 0, 0]
        array([4., 4., 4.], dtype=float32)
    """
    _check_algorithm(algo)
    if algo == "direct":
        return conv_direct.conv_grad_weight(
            np.ascontiguousarray(X),
            np.ascontiguousarray(dY),
            pads_begin,
            pads_end,
            kernel_shape,
        )
    if algo == "winograd":
        return winograd.conv_grad_weight(X, dY).reshape(weight_shape)
    if algo == "pointwise":
        return conv_pointwise.conv_grad_weight(X, dY, strides, weight_shape)
    n, c = X.shape[:2]
    m = weight_shape[0]
    cg, mg = c // group, m // group
    x = np.ascontiguousarray(X).reshape((n, c, *_to3d(X.shape[2:], 1)))
    k, s, d = _to3d(kernel_shape, 1), _to3d(strides, 1), _to3d(dilations, 1)
    p = _to3d(pads_begin, 0)
    out_d, out_h, out_w = (int(v) for v in _to3d(out_spatial, 1))
    rows, npos = out_d * out_h, out_d * out_h * out_w
    kk = cg * int(np.prod(k))
    dy = np.ascontiguousarray(dY).reshape(n, m, npos)
    per = _cl_samples(npos, kk, cg, X.itemsize)
    if per:
        dw = _conv_grad_weight_cl(x, dy, group, per, (out_d, out_h, out_w), k, s, d, p)
        return dw.reshape(weight_shape)
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
    return dw.reshape(weight_shape)


@kernel("ConvGradWeight", accepts=_accepts_grad, domain="dfdl")
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
    """dfdl.ConvGradWeight tile kernel (a Conv's dW): the first implementation of
    :func:`algorithm` that applies to the forward geometry."""
    geo = dict(
        kernel_shape=kernel_shape,
        strides=strides,
        dilations=dilations,
        pads_begin=pads_begin,
        pads_end=pads_end,
        out_spatial=out_spatial,
        group=group,
    )
    algo = algorithm(X.shape, weight_shape, X.dtype, **geo)
    return run_grad_weight(algo, X, dY, **geo, weight_shape=weight_shape)
