"""Direct CPU kernels for stride-1 3x3 (and 3x3x3) convolutions with few channels.

im2col copies every input value kh*kw*kd times and then runs a GEMM whose short side is
the channel count; with 16-32 channels on large volumes (a 3-D U-Net's upper levels)
both halves run far below the machine's rate. These kernels never build the columns.

The input of one sample is zero-padded into a flat grid of ``L`` values per channel
(padded depth x height x width, plus a slack row). On that grid every kernel tap is a
constant flat offset, so an output position ``q`` (on the padded grid: a few columns
and rows per plane are computed and thrown away) is
``y[m, q] = sum_{c, i, j, l} W[m, c, i, j, l] * x[c, q + i*plane + j*row + l]``.
The inner loop runs over ``q`` (contiguous, vectorized), holding the 9 taps of one
(channel, depth offset) for 2 output channels in registers: 18 fused multiply-adds per
9 input loads and 2 accumulator updates. (With 4 output channels the 36 weights no
longer fit the 32 vector registers and are reloaded every iteration: 108 against 133
GFLOP/s at 16 channels.) The weight gradient is the same loop with the
roles swapped: 18 running sums (2 output channels x 9 taps) over a block of positions.
Both ask LLVM for 512-bit vectors (:mod:`dfdl.ops.cpu.vector_width`): they are bound by
their multiply-adds, and measured 15-25% faster so.
The input gradient of a stride-1 convolution is a convolution of dY with the flipped,
transposed kernel, so it runs the forward kernel.

The summation order of a forward (or input-gradient) output never depends on its
position or on the block size, so its bits are the same however the image is tiled.
"""

from __future__ import annotations

import numba
import numpy as np

from dfdl.ops.cpu.vector_width import prefer_wide_vectors

#: fewest input and output channels that take the direct kernels (below this, the
#: im2col GEMM's cost is the copy, and the direct loop is short on the channel side)
MIN_CHANNELS = 8
#: largest input x output channel product that takes them (measured up to 64 x 64 and
#: 128 x 32, where they still beat im2col; above, im2col's GEMM is untested here)
MAX_CHANNEL_PRODUCT = 4096
#: largest ratio of padded-grid positions to output positions (wasted border work)
MAX_GRID_WASTE = 1.4
#: fewest output positions per sample (the kernels run sample by sample: a batch of
#: 16x16 images, as in ResNet, measured 20-30% slower than im2col's one GEMM)
MIN_POSITIONS = 1024
#: output positions per block of the forward kernel (2 accumulators of this many values
#: stay in L1) and of the weight-gradient kernel (a block of x and dY stays in L2)
FWD_BLOCK = 2048
DW_BLOCK = 4096

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_U1 = np.uint64(1)
_U2 = np.uint64(2)


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
    little border waste.

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
    grid = np.prod([s + a + b for s, a, b in zip(x_shape[2:], pads_begin, pads_end)][1:])
    out = np.prod([int(v) for v in out_spatial][1:])  # depth is not padded on the grid
    positions = np.prod([int(v) for v in out_spatial])
    return bool(positions >= MIN_POSITIONS and grid <= MAX_GRID_WASTE * out)


@numba.njit(inline="always")
def _window(xf, p, row):
    """The 3x3 input values at flat offset ``p`` of a grid with ``row`` values per row."""
    p1 = p + row
    p2 = p1 + row
    return (
        xf[p],
        xf[p + _U1],
        xf[p + _U2],
        xf[p1],
        xf[p1 + _U1],
        xf[p1 + _U2],
        xf[p2],
        xf[p2 + _U1],
        xf[p2 + _U2],
    )


@numba.njit(inline="always")
def _taps(s, u, x0, x1, x2, x3, x4, x5, x6, x7, x8):
    """``s + u[0]*x0 + ... + u[8]*x8``, added in this order (one output's 9 taps)."""
    s += u[0] * x0
    s += u[1] * x1
    s += u[2] * x2
    s += u[3] * x3
    s += u[4] * x4
    s += u[5] * x5
    s += u[6] * x6
    s += u[7] * x7
    s += u[8] * x8
    return s


@numba.njit(inline="always")
def _sums(s, e, x0, x1, x2, x3, x4, x5, x6, x7, x8):
    """The 9 running sums ``s[k] + e * xk`` of one output channel's tap gradients."""
    return (
        s[0] + e * x0,
        s[1] + e * x1,
        s[2] + e * x2,
        s[3] + e * x3,
        s[4] + e * x4,
        s[5] + e * x5,
        s[6] + e * x6,
        s[7] + e * x7,
        s[8] + e * x8,
    )


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def _stencil(xf, width, w, out, plane, row, block):
    """One sample: ``out[m, z, y, x]`` = the convolution at grid position
    ``q = z*plane + y*row + x`` of ``xf`` (C grids of ``width`` values, flat) with ``w``
    (M padded to a multiple of 2, C, kd, 9)."""
    prefer_wide_vectors()
    n_m, n_c, kd, _ = w.shape
    n_out, od, oh, ow = out.shape
    nq = od * plane
    ur = np.uint64(row)
    a0 = np.empty(block, out.dtype)
    a1 = np.empty(block, out.dtype)
    for qa in range(0, nq, block):
        qn = min(block, nq - qa)
        uqn = np.uint64(qn)
        for m0 in range(0, n_m, 2):
            a0[:] = 0
            a1[:] = 0
            for c in range(n_c):
                for i in range(kd):
                    o = np.uint64(c * width + qa + i * plane)
                    u0 = w[m0, c, i]
                    u1 = w[m0 + 1, c, i]
                    for q in range(uqn):
                        x0, x1, x2, x3, x4, x5, x6, x7, x8 = _window(xf, o + q, ur)
                        a0[q] = _taps(a0[q], u0, x0, x1, x2, x3, x4, x5, x6, x7, x8)
                        a1[q] = _taps(a1[q], u1, x0, x1, x2, x3, x4, x5, x6, x7, x8)
            # keep the block's positions that are outputs (not grid border columns/rows)
            z = qa // plane
            yy = (qa - z * plane) // row
            xx = qa - z * plane - yy * row
            second = m0 + 1 < n_out
            for t in range(qn):
                if yy < oh and xx < ow:
                    out[m0, z, yy, xx] = a0[t]
                    if second:
                        out[m0 + 1, z, yy, xx] = a1[t]
                xx += 1
                if xx == row:
                    xx = 0
                    yy += 1
                    if yy * row == plane:
                        yy = 0
                        z += 1


@numba.njit(cache=True, nogil=True, fastmath=True)
def _stencil_grad_weight(xf, width, dy, dw, plane, row, block, zero):
    """One sample: ``dw[m, c, i, j*3 + l] += sum_q dy[m, q] * xf[c*width + q + i*plane +
    j*row + l]`` with ``dy`` (M padded to a multiple of 2, grid positions), zero off the
    outputs."""
    prefer_wide_vectors()
    n_m, n_c, kd, _ = dw.shape
    nq = dy.shape[1]
    ur = np.uint64(row)
    for qa in range(0, nq, block):
        qn = np.uint64(min(block, nq - qa))
        for m0 in range(0, n_m, 2):
            d0 = dy[m0, qa : qa + qn]
            d1 = dy[m0 + 1, qa : qa + qn]
            for c in range(n_c):
                for i in range(kd):
                    o = np.uint64(c * width + qa + i * plane)
                    s0 = (zero, zero, zero, zero, zero, zero, zero, zero, zero)
                    s1 = s0
                    for q in range(qn):
                        x0, x1, x2, x3, x4, x5, x6, x7, x8 = _window(xf, o + q, ur)
                        s0 = _sums(s0, d0[q], x0, x1, x2, x3, x4, x5, x6, x7, x8)
                        s1 = _sums(s1, d1[q], x0, x1, x2, x3, x4, x5, x6, x7, x8)
                    for t in range(9):
                        dw[m0, c, i, t] += s0[t]
                        dw[m0 + 1, c, i, t] += s1[t]


def _as3d(x: np.ndarray) -> np.ndarray:
    """(N, C, H, W) -> (N, C, 1, H, W); 3-D unchanged."""
    return x if x.ndim == 5 else x[:, :, None]


def _pads3d(pads_begin, pads_end, nd: int) -> tuple[list[int], list[int]]:
    lead = [0] * (3 - nd)
    return lead + [int(v) for v in pads_begin], lead + [int(v) for v in pads_end]


def _grid(x: np.ndarray, pb: list[int], pe: list[int]) -> tuple[np.ndarray, tuple, int]:
    """One sample (C, D, H, W) zero-padded into flat grids: (C * width,), the padded
    (D, H, W) and ``width`` (padded volume plus a slack of two rows and two values, so the
    taps of the last positions stay inside the channel's grid)."""
    c = x.shape[0]
    padded = tuple(s + a + b for s, a, b in zip(x.shape[1:], pb, pe))
    volume = int(np.prod(padded))
    width = volume + 2 * padded[2] + 2
    grid = np.zeros((c, width), x.dtype)
    inner = tuple(slice(a, a + s) for a, s in zip(pb, x.shape[1:]))
    grid[:, :volume].reshape(c, *padded)[(slice(None), *inner)] = x
    return grid.reshape(-1), padded, width


def _weights(w5: np.ndarray, multiple: int) -> np.ndarray:
    """(M, C, kd, 3, 3) -> (M rounded up to ``multiple``, C, kd, 9), zero rows added."""
    m, c, kd = w5.shape[:3]
    out = np.zeros((-(-m // multiple) * multiple, c, kd, 9), w5.dtype)
    out[:m] = w5.reshape(m, c, kd, 9)
    return out


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
    wk = _weights(w5, 2)
    out = None
    for b in range(n):
        xf, padded, width = _grid(x5[b], pb, pe)
        spatial = (padded[0] - kd + 1, padded[1] - 2, padded[2] - 2)
        if out is None:
            out = np.empty((n, m, *spatial), x.dtype)
        row = padded[2]
        _stencil(xf, width, wk, out[b], padded[1] * row, row, FWD_BLOCK)
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
    n, c = x5.shape[:2]
    m = dy5.shape[1]
    kd = 1 if nd == 2 else int(kernel[0])
    dw = np.zeros((m + m % 2, c, kd, 9), x.dtype)
    zero = x.dtype.type(0)
    for b in range(n):
        xf, padded, width = _grid(x5[b], pb, pe)
        od, oh, ow = dy5.shape[2:]
        # dY on the grid's positions, zero on its border columns and rows
        dyg = np.zeros((dw.shape[0], od, padded[1], padded[2]), x.dtype)
        dyg[:m, :, :oh, :ow] = dy5[b]
        row = padded[2]
        _stencil_grad_weight(
            xf, width, dyg.reshape(dw.shape[0], -1), dw, padded[1] * row, row, DW_BLOCK, zero
        )
    return dw[:m].reshape((m, c, *kernel))
