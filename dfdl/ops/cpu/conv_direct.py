"""Direct CPU kernels for stride-1 3x3 (and 3x3x3) convolutions with few channels.

im2col copies every input value kh*kw*kd times and then runs a GEMM whose short side is
the channel count; with 16-32 channels on large volumes (a 3-D U-Net's upper levels)
both halves run far below the machine's rate. These kernels never build the columns:
the samples of a tile are zero-padded into one flat grid per input channel, on which
every kernel tap is a constant flat offset. :func:`conv` keeps a register block of 16
positions x one vector of output channels (:mod:`dfdl.ops.cpu.simd`) and broadcasts
each input value into a fused multiply-add; :func:`conv_grad_weight` keeps the 27 (or
9) tap gradients of one input channel in registers over a channels-last dY;
:func:`conv_grad_input` runs the forward kernel on dY with the flipped, transposed
kernel. :func:`applies` says which convolutions they take (:data:`MIN_CHANNELS`,
:data:`MAX_CHANNEL_PRODUCT`, :data:`MAX_GRID_WASTE`, :data:`MIN_POSITIONS`).

Guarantees: each forward (or input-gradient) output is summed in one fixed order
(channels, then taps) from zero, whatever its position, its sample's place in the tile
or the tiling, so its bits are the same however the image is cut into tiles. The grid
and the channels-last dY are per-thread scratch memory (:mod:`dfdl.ops.cpu.scratch`).

Example:
    >>> x = np.ones((1, 8, 4, 4), np.float32)
    >>> float(conv(x, np.ones((8, 8, 3, 3), np.float32), [1, 1], [1, 1])[0, 0, 1, 1])
    72.0

Measurements: ``docs/design/conv-direct.md``.
"""

from __future__ import annotations

import numba
import numpy as np

from dfdl.ops.cpu.scratch import scratch
from dfdl.ops.cpu.simd import (
    BYTES,
    vadd,
    vfma_bcast,
    vload,
    vstore,
    vstore_lanes,
    vtranspose,
    vzero,
)
from dfdl.ops.cpu.vector_width import prefer_wide_vectors

#: fewest input and output channels that take the direct kernels (below this, the
#: im2col GEMM's cost is the copy, and the direct loop is short on the channel side)
MIN_CHANNELS = 8
#: largest input x output channel product that takes them (measured up to 64 x 64 and
#: 128 x 32, where they still beat im2col; above, im2col's GEMM is untested here)
MAX_CHANNEL_PRODUCT = 4096
#: largest ratio of padded-grid positions to output positions (wasted border work;
#: 16^3 volumes, 18^3 on the grid, are in; 8x8 images, 10x10 on the grid, are out)
MAX_GRID_WASTE = 1.5
#: fewest output positions per sample (smaller images, ResNet's 16x16, gained nothing
#: measurable on these kernels: ``docs/design/conv-direct.md``)
MIN_POSITIONS = 1024
#: output positions per block of the weight-gradient kernel (its x and dY stay in L2)
DW_BLOCK = 4096
#: output positions per register block of the forward kernel: 16 accumulators (each a
#: vector of output channels) and the weight vector they share use 17 of 32 registers
POSITIONS = 16
_LANE_ROWS = tuple(range(POSITIONS))

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def applies(
    x_shape: tuple,
    w_shape: tuple,
    strides,
    dilations,
    group: int,
    pads_begin,
    pads_end,
    out_spatial,
    dtype,
) -> bool:
    """Whether the direct kernels run this convolution (forward geometry): float
    dtypes, 2-D or 3-D, kernel 3x3 (x1 or x3 in depth), stride 1, no dilation, one
    group, pads of at most kernel-1, channel counts in range, images large enough and
    little border waste. float32 is the fast case; float64 runs the same kernels with
    vectors of 8.

    Example:
        >>> applies((1, 16, 64, 64, 64), (16, 16, 3, 3, 3), [1] * 3, [1] * 3, 1,
        ...         [1] * 3, [1] * 3, (64, 64, 64), np.float32)
        True
    """
    nd = len(x_shape) - 2
    if np.dtype(dtype) not in _FLOATS or nd not in (2, 3) or group != 1:
        return False
    kernel = tuple(w_shape[2:])
    if kernel[-2:] != (3, 3) or (nd == 3 and kernel[0] not in (1, 3)):
        return False
    if any(int(v) != 1 for v in strides) or any(int(v) != 1 for v in dilations):
        return False
    if any(not 0 <= int(p) <= k - 1 for p, k in zip(list(pads_begin) + list(pads_end), 2 * kernel)):
        return False
    c, m = int(x_shape[1]), int(w_shape[0])
    if min(c, m) < MIN_CHANNELS or c * m > MAX_CHANNEL_PRODUCT:
        return False
    grid = np.prod([int(s) + int(a) + int(b) for s, a, b in zip(x_shape[2:], pads_begin, pads_end)])
    positions = np.prod([int(v) for v in out_spatial])
    return bool(positions >= MIN_POSITIONS and grid <= MAX_GRID_WASTE * positions)


@numba.njit(inline="always")
def _fma9(s, xf, p, row, d):
    """``s[3j + l] + xf[p + j*row + l] * d``: one position's 9 taps of one input channel,
    times the dY vector of its output channels, into the 9 tap gradients."""
    p1 = p + row
    p2 = p1 + row
    return (
        vfma_bcast(s[0], xf, p, d),
        vfma_bcast(s[1], xf, p + 1, d),
        vfma_bcast(s[2], xf, p + 2, d),
        vfma_bcast(s[3], xf, p1, d),
        vfma_bcast(s[4], xf, p1 + 1, d),
        vfma_bcast(s[5], xf, p1 + 2, d),
        vfma_bcast(s[6], xf, p2, d),
        vfma_bcast(s[7], xf, p2 + 1, d),
        vfma_bcast(s[8], xf, p2 + 2, d),
    )


@numba.njit(inline="always")
def _add9(dwf, p, lanes, s):
    """``dwf[p + k*lanes :][:lanes] += s[k]`` for the 9 taps ``k``."""
    for k in numba.literal_unroll((0, 1, 2, 3, 4, 5, 6, 7, 8)):
        q = p + k * lanes
        vstore(dwf, q, vadd(vload(dwf, q), s[k]))


@numba.njit(cache=True, nogil=True)
def _stencil(xf, width, wv, out, pd, plane, row):
    """``out[n, m, z, y, x]`` = the convolution at grid position ``q = (n*pd + z)*plane +
    y*row + x`` of ``xf`` (C grids of ``width`` values, flat) with ``wv`` (output channels
    in vectors: (M/lanes, C, kd, 3, 3, lanes))."""
    prefer_wide_vectors()
    n_v, n_c, kd, _, _, lanes = wv.shape
    n, n_m, od, oh, ow = out.shape
    nq = (n * pd - kd + 1) * plane
    wf = wv.reshape(-1)
    outf = out.reshape(-1)
    channel = od * oh * ow
    runs = np.empty((POSITIONS + 1, 3), np.int64)
    for t in range(0, nq, POSITIONS):
        count = _runs(runs, t, pd, plane, row, out.shape)
        for v in range(n_v):
            # 16 accumulators as separate variables: as a tuple, 12% slower
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = vzero(xf)
            a8 = a9 = a10 = a11 = a12 = a13 = a14 = a15 = a0
            for c in range(n_c):
                for i in range(kd):
                    for j in range(3):
                        for l in range(3):
                            w = vload(wf, ((((v * n_c + c) * kd + i) * 3 + j) * 3 + l) * lanes)
                            p = c * width + t + i * plane + j * row + l
                            a0 = vfma_bcast(a0, xf, p, w)
                            a1 = vfma_bcast(a1, xf, p + 1, w)
                            a2 = vfma_bcast(a2, xf, p + 2, w)
                            a3 = vfma_bcast(a3, xf, p + 3, w)
                            a4 = vfma_bcast(a4, xf, p + 4, w)
                            a5 = vfma_bcast(a5, xf, p + 5, w)
                            a6 = vfma_bcast(a6, xf, p + 6, w)
                            a7 = vfma_bcast(a7, xf, p + 7, w)
                            a8 = vfma_bcast(a8, xf, p + 8, w)
                            a9 = vfma_bcast(a9, xf, p + 9, w)
                            a10 = vfma_bcast(a10, xf, p + 10, w)
                            a11 = vfma_bcast(a11, xf, p + 11, w)
                            a12 = vfma_bcast(a12, xf, p + 12, w)
                            a13 = vfma_bcast(a13, xf, p + 13, w)
                            a14 = vfma_bcast(a14, xf, p + 14, w)
                            a15 = vfma_bcast(a15, xf, p + 15, w)
            a = vtranspose((a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15))
            # vector k: output channel v*lanes + k % lanes at positions t + h .. t + h + lanes
            for k in numba.literal_unroll(_LANE_ROWS):
                m = v * lanes + k % lanes
                h = k // lanes * lanes
                if m < n_m:
                    for r in range(count):
                        base = runs[r, 2] + m * channel + h
                        vstore_lanes(outf, base, a[k], runs[r, 0] - h, runs[r, 1] - h)


@numba.njit(inline="always")
def _runs(runs, t, pd, plane, row, shape):
    """Splits grid positions ``t .. t+16`` into runs of outputs on one output row:
    ``runs[r] = (first, end, base)``, position ``t + p`` (``first <= p < end``) at flat
    offset ``base + p`` of output channel 0. Returns the number of runs (border columns,
    rows and planes are in none)."""
    n, n_m, od, oh, ow = shape
    count = 0
    p = 0
    while p < POSITIONS:
        zg, rest = divmod(t + p, plane)
        y, x = divmod(rest, row)
        b, z = divmod(zg, pd)
        run = min(POSITIONS - p, row - x)
        if b < n and z < od and y < oh and x < ow:
            runs[count, 0] = p
            runs[count, 1] = p + min(run, ow - x)
            runs[count, 2] = ((b * n_m * od + z) * oh + y) * ow + x - p
            count += 1
        p += run
    return count


@numba.njit(cache=True, nogil=True)
def _stencil_grad_weight(xf, width, dyg, dw, plane, row, block):
    """``dw[v, c, i, 3j + l, :] += sum_q dyg[q, v] * xf[c*width + q + i*plane + j*row +
    l]`` with ``dyg`` the output gradient on the grid's positions, channels last in
    vectors of ``lanes`` (zero off the outputs), summed block by block."""
    prefer_wide_vectors()
    n_v, n_c, kd, _, lanes = dw.shape
    mp = n_v * lanes
    nq = dyg.size // mp
    dwf = dw.reshape(-1)
    z = vzero(xf)
    for qa in range(0, nq, block):
        qn = min(block, nq - qa)
        for v in range(n_v):
            for c in range(n_c):
                p = c * width + qa
                k = (v * n_c + c) * kd * 9 * lanes
                if kd == 3:  # the 27 taps at once: one dY load per 27 multiply-adds
                    s0 = s1 = s2 = (z, z, z, z, z, z, z, z, z)
                    for t in range(qn):
                        d = vload(dyg, (qa + t) * mp + v * lanes)
                        s0 = _fma9(s0, xf, p + t, row, d)
                        s1 = _fma9(s1, xf, p + t + plane, row, d)
                        s2 = _fma9(s2, xf, p + t + 2 * plane, row, d)
                    _add9(dwf, k, lanes, s0)
                    _add9(dwf, k + 9 * lanes, lanes, s1)
                    _add9(dwf, k + 18 * lanes, lanes, s2)
                    continue
                for i in range(kd):
                    s0 = (z, z, z, z, z, z, z, z, z)
                    for t in range(qn):
                        d = vload(dyg, (qa + t) * mp + v * lanes)
                        s0 = _fma9(s0, xf, p + t + i * plane, row, d)
                    _add9(dwf, k + i * 9 * lanes, lanes, s0)


def _as3d(x: np.ndarray) -> np.ndarray:
    """(N, C, H, W) -> (N, C, 1, H, W); 3-D unchanged."""
    return x if x.ndim == 5 else x[:, :, None]


def _pads3d(pads_begin, pads_end, nd: int) -> tuple[list[int], list[int]]:
    lead = [0] * (3 - nd)
    return lead + [int(v) for v in pads_begin], lead + [int(v) for v in pads_end]


def _grid(x: np.ndarray, pb: list[int], pe: list[int]) -> tuple[np.ndarray, tuple, int]:
    """The samples (N, C, D, H, W) zero-padded into one flat grid per channel, the
    samples' padded volumes one after the other: (C * width,), the padded (D, H, W) and
    ``width`` (N padded volumes plus a slack of two planes, two rows, two values and a
    register block, so the taps of every position of the last block stay inside the
    channel's grid). The grid is this thread's scratch memory, valid until its next call.
    """
    n, c = x.shape[:2]
    padded = tuple(s + a + b for s, a, b in zip(x.shape[2:], pb, pe))
    plane = padded[1] * padded[2]
    width = n * padded[0] * plane + 2 * plane + 2 * padded[2] + 2 + POSITIONS
    grid = scratch("conv_direct.grid", (c, width), x.dtype)
    _fill_grid(x, grid, pb[0], pb[1], pb[2], padded[0], padded[1], padded[2])
    return grid.reshape(-1), padded, width


@numba.njit(cache=True, nogil=True)
def _fill_grid(x, grid, b0, b1, b2, pd, ph, pw):
    """``grid[c]`` = the samples' channel ``c`` padded by ``b0, b1, b2`` at the start
    of each axis into (pd, ph, pw) volumes, one after the other, then zeros: every value
    written once."""
    n, n_c, d, h, w = x.shape
    for c in range(n_c):
        g = grid[c]
        q = 0
        for b in range(n):
            for z in range(pd):
                if not b0 <= z < b0 + d:
                    g[q : q + ph * pw] = 0
                    q += ph * pw
                    continue
                for y in range(ph):
                    if b1 <= y < b1 + h:
                        g[q : q + b2] = 0
                        g[q + b2 : q + b2 + w] = x[b, c, z - b0, y - b1]
                        g[q + b2 + w : q + pw] = 0
                    else:
                        g[q : q + pw] = 0
                    q += pw
        g[q:] = 0


@numba.njit(cache=True, nogil=True)
def _fill_dy_grid(dy, dyg):
    """``dyg[n, z, y, x, m]`` = ``dy[n, m, z, y, x]`` at the outputs, zero elsewhere (the
    grid's border columns, rows and planes, and the channels past dY's)."""
    n, n_m, od, oh, ow = dy.shape
    for b in range(n):
        for z in range(dyg.shape[1]):
            for y in range(dyg.shape[2]):
                row = dyg[b, z, y]
                if z >= od or y >= oh:
                    row[:, :] = 0
                    continue
                for x in range(ow):
                    for m in range(n_m):
                        row[x, m] = dy[b, m, z, y, x]
                    row[x, n_m:] = 0
                row[ow:, :] = 0


def _lanes(dtype) -> int:
    return BYTES // np.dtype(dtype).itemsize


def _weights(w5: np.ndarray) -> np.ndarray:
    """(M, C, kd, 3, 3) -> (M/lanes, C, kd, 9, lanes): output channels in vectors, zero
    channels added up to a multiple of the vector's lanes."""
    m, c, kd = w5.shape[:3]
    lanes = _lanes(w5.dtype)
    out = np.zeros((-(-m // lanes) * lanes, c, kd, 9), w5.dtype)
    out[:m] = w5.reshape(m, c, kd, 9)
    return np.ascontiguousarray(out.reshape(-1, lanes, c, kd, 3, 3).transpose(0, 2, 3, 4, 5, 1))


def conv(x: np.ndarray, w: np.ndarray, pads_begin, pads_end) -> np.ndarray:
    """Stride-1 convolution of ``x`` (N, C, [D,] H, W) with ``w`` (M, C, [kd,] 3, 3).

    Example:
        >>> x = np.ones((1, 8, 4, 4), np.float32)
        >>> float(conv(x, np.ones((8, 8, 3, 3), np.float32), [1, 1], [1, 1])[0, 0, 1, 1])
        72.0
    """
    nd = x.ndim - 2
    x5, w5 = _as3d(x), _as3d(w)
    pb, pe = _pads3d(pads_begin, pads_end, nd)
    n, m, kd = x5.shape[0], w5.shape[0], w5.shape[2]
    xf, padded, width = _grid(x5, pb, pe)
    wv = _weights(w5)
    spatial = (padded[0] - kd + 1, padded[1] - 2, padded[2] - 2)
    out = np.empty((n, m, *spatial), x.dtype)
    _stencil(xf, width, wv, out, padded[0], padded[1] * padded[2], padded[2])
    return out.reshape(out.shape[:2] + out.shape[5 - nd :])


def conv_grad_input(dy: np.ndarray, w: np.ndarray, pads_begin, pads_end, x_spatial) -> np.ndarray:
    """dX of :func:`conv`: the stride-1 convolution of ``dy`` with the flipped kernel,
    input and output channels swapped, padded by ``kernel - 1 - pad`` (plus whatever
    input the forward's end padding left unread).

    Example:
        >>> dy = np.ones((1, 8, 4, 4), np.float32)
        >>> dx = conv_grad_input(dy, np.ones((8, 8, 3, 3), np.float32), [1, 1], [1, 1], (4, 4))
        >>> float(dx[0, 0, 1, 1])
        72.0
    """
    nd = dy.ndim - 2
    kernel = w.shape[2:]
    axes = tuple(range(2, 2 + nd))
    wt = np.ascontiguousarray(np.flip(w, axes).swapaxes(0, 1))
    begin = [k - 1 - int(p) for k, p in zip(kernel, pads_begin)]
    end = [int(s) - o - b + k - 1 for s, o, b, k in zip(x_spatial, dy.shape[2:], begin, kernel)]
    return conv(dy, wt, begin, end)


def conv_grad_weight(x: np.ndarray, dy: np.ndarray, pads_begin, pads_end, kernel) -> np.ndarray:
    """dW of :func:`conv`, shaped (M, C, [kd,] 3, 3).

    Example:
        >>> x, dy = np.ones((1, 8, 4, 4), np.float32), np.ones((1, 8, 4, 4), np.float32)
        >>> float(conv_grad_weight(x, dy, [1, 1], [1, 1], (3, 3))[0, 0, 1, 1])
        16.0
    """
    nd = x.ndim - 2
    x5, dy5 = _as3d(x), _as3d(dy)
    pb, pe = _pads3d(pads_begin, pads_end, nd)
    c, m = x5.shape[1], dy5.shape[1]
    kd = 1 if nd == 2 else int(kernel[0])
    lanes = _lanes(x.dtype)
    mp = -(-m // lanes) * lanes
    xf, padded, width = _grid(x5, pb, pe)
    od, oh, ow = dy5.shape[2:]
    # dY on the grid's positions, channels last, zero on its border columns, rows, planes
    dyg = scratch("conv_direct.dy", (x5.shape[0], *padded, mp), x.dtype)
    _fill_dy_grid(np.ascontiguousarray(dy5), dyg)
    row = padded[2]
    plane = padded[1] * row
    nq = (x5.shape[0] * padded[0] - kd + 1) * plane
    dw = np.zeros((mp // lanes, c, kd, 9, lanes), x.dtype)
    _stencil_grad_weight(xf, width, dyg.reshape(-1)[: nq * mp], dw, plane, row, DW_BLOCK)
    dw = dw.transpose(0, 4, 1, 2, 3).reshape(mp, c, kd, 9)
    return np.ascontiguousarray(dw[:m]).reshape((m, c, *kernel))
