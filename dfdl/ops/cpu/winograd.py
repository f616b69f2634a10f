"""Winograd F(2x2, 3x3) convolution: 3x3, stride-1, pad-1 2-D convolutions in 2.25x
fewer multiplications than im2col + GEMM (Lavin and Gray, "Fast Algorithms for
Convolutional Neural Networks", 2016).

Every 2x2 block of outputs reads a 4x4 patch of the input; patch and filter are
transformed (``V = B^T d B``, ``U = G g G^T``), multiplied position by position and
summed over the input channels as 16 GEMMs ``(tiles x C) @ (C x C_out)``, and
transformed back (``Y = A^T M A``), in blocks of :data:`BLOCK_BYTES` that stay in cache.
:func:`conv` is the forward and, on dY with the flipped, transposed filter, the input
gradient (``dfdl.ConvGradInput``); :func:`conv_grad_weight` is the forward's adjoint in
the filter. :func:`applies` says which convolutions it takes (float32, one group,
:data:`MIN_CHANNELS` channels or more); :mod:`dfdl.ops.cpu.conv` picks it and runs it
by name.

The forward sums the channels in blocks of :data:`SUM_CHANNELS`: one float32 GEMM per
block, the blocks' products added in float64 by the output transform. A float32 sum over
all channels made the forward's error grow with the channels (2x im2col's at 256), and
the ReLUs downstream turned it into float32 gradients less accurate than PyTorch's; the
blocks bring it to im2col's at the speed of one sum (``docs/design/float32-accuracy.md``).

Guarantees: the result differs from the direct sum by rounding only (the transforms'
coefficients are 0, ±1 and ±1/2) and is the same from run to run; dfdl's tests compare
it with im2col at float32 tolerance.

Example:
    >>> x = np.ones((1, 16, 4, 4), np.float32)
    >>> w = np.ones((16, 16, 3, 3), np.float32)
    >>> float(conv(x, w)[0, 0, 1, 1]), float(conv(x, w)[0, 0, 0, 0])
    (144.0, 64.0)

Measurements: ``docs/design/winograd.md``.
"""

from __future__ import annotations

import numba
import numpy as np

from dfdl.ops.cpu.blas import matmul

#: fewest input and output channels: with fewer, the 16 GEMMs are too thin to pay
#: (``docs/design/winograd.md``)
MIN_CHANNELS = 32
#: bytes of transformed input per block of tiles (the GEMMs' left operand)
BLOCK_BYTES = 4 << 20
#: fewest tiles per block (the GEMMs' rows), whatever the channels
MIN_BLOCK_TILES = 64
#: input channels per float32 GEMM of the forward; the blocks' products are summed in
#: float64 (``docs/design/float32-accuracy.md``)
SUM_CHANNELS = 64
#: bytes of padded channels-last copies (input, and dY for the weight gradient) made at
#: once: samples are transformed in chunks of this size, so a kernel's temporaries stay
#: a few MiB whatever the tile (the planner counts a task's outputs again, not its inputs)
CHUNK_BYTES = 16 << 20


def applies(x_shape, w_shape, strides, dilations, group, pads_begin, pads_end, dtype) -> bool:
    """Whether a Conv with these attributes runs here: 2-D, 3x3 kernel, stride 1,
    dilation 1, one group, one pixel of padding on every side, float32, and at least
    :data:`MIN_CHANNELS` input and output channels.

    Example:
        >>> applies((8, 64, 16, 16), (64, 64, 3, 3), [1, 1], [1, 1], 1, [1, 1], [1, 1],
        ...         np.float32)
        True
    """
    return (
        len(x_shape) == 4
        and tuple(w_shape[2:]) == (3, 3)
        and list(strides) == [1, 1]
        and list(dilations) == [1, 1]
        and group == 1
        and list(pads_begin) == [1, 1]
        and list(pads_end) == [1, 1]
        and np.dtype(dtype) == np.float32
        and x_shape[1] >= MIN_CHANNELS
        and w_shape[0] >= MIN_CHANNELS
    )


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def _filter_transform(w, u):
    """``u[:, c, m] = G g G^T`` (the 4x4 flattened) of every filter ``g = w[m, c]``
    (``w`` as (C_out, C, 9)), vectorized over the output channels."""
    n_m, n_c = w.shape[:2]
    t = np.empty((4, 3, n_m), w.dtype)
    for c in range(n_c):
        for j in range(3):  # G g: the columns of each filter
            for o in range(n_m):
                g0, g1, g2 = w[o, c, j], w[o, c, 3 + j], w[o, c, 6 + j]
                t[0, j, o] = g0
                t[1, j, o] = 0.5 * (g0 + g1 + g2)
                t[2, j, o] = 0.5 * (g0 - g1 + g2)
                t[3, j, o] = g2
        for a in range(4):  # (G g) G^T
            for o in range(n_m):
                r0, r1, r2 = t[a, 0, o], t[a, 1, o], t[a, 2, o]
                u[4 * a + 0, c, o] = r0
                u[4 * a + 1, c, o] = 0.5 * (r0 + r1 + r2)
                u[4 * a + 2, c, o] = 0.5 * (r0 - r1 + r2)
                u[4 * a + 3, c, o] = r2


def _filters(w: np.ndarray) -> np.ndarray:
    """``U = G g G^T`` of every (C_out, C) filter as a contiguous (16, C, C_out) array:
    the GEMMs' right operands, one per transform position. Row-major, because BLAS takes a
    transposed right operand more slowly, at a cost per call, and the forward's channel
    blocks make a call per block of tiles (a transposed (16, C_out, C) layout cost the
    256-channel forward 35-38% more GEMM time with OpenBLAS)."""
    m, c = w.shape[:2]
    u = np.empty((16, c, m), w.dtype)
    _filter_transform(np.ascontiguousarray(w).reshape(m, c, 9), u)
    return u


def _padded(x: np.ndarray, th: int, tw: int) -> np.ndarray:
    """``x`` (N, C, H, W) channels-last in a zero grid of ``th`` x ``tw`` tiles' patches:
    (N, 2 * th + 2, 2 * tw + 2, C)."""
    xp = np.empty((x.shape[0], 2 * th + 2, 2 * tw + 2, x.shape[1]), x.dtype)
    _pad_channels_last(x, xp)
    return xp


def _pad_channels_last(x: np.ndarray, xp: np.ndarray) -> None:
    """``xp[s, 1 + i, 1 + j, c] = x[s, c, i, j]``, zero everywhere else."""
    h, w = x.shape[2:]
    xp[:, 0] = 0
    xp[:, h + 1 :] = 0
    xp[:, 1 : h + 1, 0] = 0
    xp[:, 1 : h + 1, w + 1 :] = 0
    xp[:, 1 : h + 1, 1 : w + 1] = x.transpose(0, 2, 3, 1)


@numba.njit(inline="always")
def _origin(t, per, tw):
    """Sample, first row and first column (in the padded grid) of tile ``t``."""
    return t // per, 2 * ((t % per) // tw), 2 * ((t % per) % tw)


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def _input_transform(xp, t0, t1, th, tw, v):
    """``v[:, t - t0, :] = B^T d B`` for tiles ``t0:t1`` (tile t: sample t // (th*tw),
    tile row and column within it), d the 4x4 patch of ``xp`` (N, Hp, Wp, C) at
    (2 * row, 2 * col), vectorized over the channels. The rows pass reads the patch in
    place, and each of the 16 rows of ``v`` is written in a pass of its own (a copy of
    the patch and interleaved stores took twice as long on a ResNet stage-1 tile)."""
    c = xp.shape[3]
    per = th * tw
    e = np.empty((4, 4, c), xp.dtype)
    for t in range(t0, t1):
        s, r, q = _origin(t, per, tw)
        for b in range(4):  # rows: B^T d
            for ch in range(c):
                d0, d1 = xp[s, r, q + b, ch], xp[s, r + 1, q + b, ch]
                d2, d3 = xp[s, r + 2, q + b, ch], xp[s, r + 3, q + b, ch]
                e[0, b, ch] = d0 - d2
                e[1, b, ch] = d1 + d2
                e[2, b, ch] = d2 - d1
                e[3, b, ch] = d1 - d3
        k = t - t0
        for a in range(4):  # columns: (B^T d) B
            for ch in range(c):
                v[4 * a + 0, k, ch] = e[a, 0, ch] - e[a, 2, ch]
            for ch in range(c):
                v[4 * a + 1, k, ch] = e[a, 1, ch] + e[a, 2, ch]
            for ch in range(c):
                v[4 * a + 2, k, ch] = e[a, 2, ch] - e[a, 1, ch]
            for ch in range(c):
                v[4 * a + 3, k, ch] = e[a, 1, ch] - e[a, 3, ch]


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def _output_transform(mm, t0, t1, th, tw, y):
    """``y``'s 2x2 blocks of tiles ``t0:t1`` from ``A^T M A``, ``M`` the sum over the
    first axis of ``mm`` (blocks of channels, 16, tiles, C_out), the GEMMs' products,
    taken in float64; blocks past ``y``'s edge (odd sizes) are cut."""
    nb, m = mm.shape[0], mm.shape[3]
    h, w = y.shape[2], y.shape[3]
    per = th * tw
    total = np.empty((16, m), np.float64)
    f = np.empty((2, 4, m), np.float64)
    for t in range(t0, t1):
        s, r, q = _origin(t, per, tw)
        k = t - t0
        for p in range(16):
            for o in range(m):
                total[p, o] = mm[0, p, k, o]
            for b in range(1, nb):
                for o in range(m):
                    total[p, o] += mm[b, p, k, o]
        # rows: A^T M
        for b in range(4):
            for o in range(m):
                m0, m1 = total[b, o], total[4 + b, o]
                m2, m3 = total[8 + b, o], total[12 + b, o]
                f[0, b, o] = m0 + m1 + m2
                f[1, b, o] = m1 - m2 - m3
        for a in range(2):
            if r + a >= h:
                continue
            for o in range(m):
                f0, f1, f2, f3 = f[a, 0, o], f[a, 1, o], f[a, 2, o], f[a, 3, o]
                y[s, o, r + a, q] = f0 + f1 + f2
                if q + 1 < w:
                    y[s, o, r + a, q + 1] = f1 - f2 - f3


def conv(x: np.ndarray, w: np.ndarray, *, sum_channels: int | None = SUM_CHANNELS) -> np.ndarray:
    """3x3 convolution, stride 1, one pixel of zero padding, no bias: ``x`` (N, C, H, W),
    ``w`` (C_out, C, 3, 3) -> (N, C_out, H, W). The channels are summed in float32 GEMMs of
    ``sum_channels`` each, added in float64 (``None``: one GEMM over all channels, the
    input gradient's choice, whose error did not matter).

    Example:
        >>> conv(np.ones((1, 16, 2, 2), np.float32), np.ones((16, 16, 3, 3), np.float32)
        ...      )[0, 0].tolist()
        [[64.0, 64.0], [64.0, 64.0]]
    """
    n, c, h, wd = x.shape
    m = w.shape[0]
    th, tw = (h + 1) // 2, (wd + 1) // 2
    step = c if sum_channels is None else max(1, int(sum_channels))
    sums = -(-c // step)
    u = _filters(w)
    y = np.empty((n, m, h, wd), x.dtype)
    v = mm = None
    for n0, n1 in _chunks(n, (2 * th + 2) * (2 * tw + 2) * c * x.itemsize):
        xp = _padded(x[n0:n1], th, tw)
        tiles = (n1 - n0) * th * tw
        if v is None:
            # the blocks' products stay as large as one whole product was
            block = min(tiles, max(MIN_BLOCK_TILES, _block(tiles, c, x.itemsize) // sums))
            v = np.empty((16, block, c), x.dtype)
            mm = np.empty((sums, 16, block, m), x.dtype)
        block = v.shape[1]
        for t0 in range(0, tiles, block):
            t1 = min(t0 + block, tiles)
            k = t1 - t0
            _input_transform(xp, t0, t1, th, tw, v)
            for b in range(sums):
                c0, c1 = b * step, min(c, (b + 1) * step)
                matmul(v[:, :k, c0:c1], u[:, c0:c1], out=mm[b, :, :k])
            _output_transform(mm, t0, t1, th, tw, y[n0:n1])
    return y


def _chunks(n: int, sample_bytes: int) -> list[tuple[int, int]]:
    """Ranges of samples whose padded copies take at most :data:`CHUNK_BYTES` (one
    sample at least)."""
    per = max(1, CHUNK_BYTES // max(1, sample_bytes))
    return [(a, min(a + per, n)) for a in range(0, n, per)]


def _block(tiles: int, channels: int, itemsize: int) -> int:
    """Tiles per block: :data:`BLOCK_BYTES` of transformed values (at least
    :data:`MIN_BLOCK_TILES`), at most ``tiles``."""
    return min(tiles, max(MIN_BLOCK_TILES, BLOCK_BYTES // (16 * channels * itemsize)))


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def _gradient_transform(dyp, t0, t1, th, tw, g):
    """``g[:, t - t0, :] = A dY A^T`` for tiles ``t0:t1``: the adjoint of the output
    transform, dY the tile's 2x2 block of ``dyp`` (N, 2 * th, 2 * tw, C_out; zero past
    the image), vectorized over the output channels. Each of the 16 rows of ``g`` is
    written in one pass: stores that alternate between rows a plane apart evict each
    other from the cache."""
    m = dyp.shape[3]
    per = th * tw
    e = np.empty((4, 2, m), dyp.dtype)
    for t in range(t0, t1):
        s, r, q = _origin(t, per, tw)
        k = t - t0
        for b in range(2):  # rows: A dY (A = [[1, 0], [1, 1], [1, -1], [0, -1]])
            for o in range(m):
                y0, y1 = dyp[s, r, q + b, o], dyp[s, r + 1, q + b, o]
                e[0, b, o] = y0
                e[1, b, o] = y0 + y1
                e[2, b, o] = y0 - y1
                e[3, b, o] = -y1
        for a in range(4):  # columns: (A dY) A^T
            for o in range(m):
                g[4 * a + 0, k, o] = e[a, 0, o]
            for o in range(m):
                g[4 * a + 1, k, o] = e[a, 0, o] + e[a, 1, o]
            for o in range(m):
                g[4 * a + 2, k, o] = e[a, 0, o] - e[a, 1, o]
            for o in range(m):
                g[4 * a + 3, k, o] = -e[a, 1, o]


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def _weight_transform(s, dw):
    """``dw[m, c] = G^T S G`` (3x3) of every ``S = s[:, m, c]`` (4x4 flattened): the
    adjoint of the filter transform."""
    n_m, n_c = s.shape[1], s.shape[2]
    t = np.empty((3, 4, n_c), s.dtype)
    for o in range(n_m):
        for b in range(4):  # G^T S: the columns of S
            for c in range(n_c):
                s0, s1, s2, s3 = s[b, o, c], s[4 + b, o, c], s[8 + b, o, c], s[12 + b, o, c]
                t[0, b, c] = s0 + 0.5 * (s1 + s2)
                t[1, b, c] = 0.5 * (s1 - s2)
                t[2, b, c] = 0.5 * (s1 + s2) + s3
        for i in range(3):  # (G^T S) G
            for c in range(n_c):
                r0, r1, r2, r3 = t[i, 0, c], t[i, 1, c], t[i, 2, c], t[i, 3, c]
                dw[o, c, i, 0] = r0 + 0.5 * (r1 + r2)
                dw[o, c, i, 1] = 0.5 * (r1 - r2)
                dw[o, c, i, 2] = 0.5 * (r1 + r2) + r3


def conv_grad_weight(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Weight gradient of :func:`conv`: ``x`` (N, C, H, W), ``dy`` (N, C_out, H, W) ->
    (C_out, C, 3, 3). The forward is linear in the filter, ``y = A^T [(G g G^T) ⊙ V] A``
    per tile, so its adjoint is ``dg = G^T [Σ_tiles (A dY A^T) ⊙ V] G``: the same input
    transform, 16 GEMMs that sum over the tiles (their long side), one inverse transform.

    Example:
        >>> x = np.ones((1, 16, 2, 2), np.float32)
        >>> conv_grad_weight(x, np.ones((1, 16, 2, 2), np.float32))[0, 0].tolist()
        [[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]]
    """
    n, c, h, wd = x.shape
    m = dy.shape[1]
    th, tw = (h + 1) // 2, (wd + 1) // 2
    s = np.zeros((16, m, c), x.dtype)
    v = g = None
    sample_bytes = ((2 * th + 2) * (2 * tw + 2) * c + 4 * th * tw * m) * x.itemsize
    for n0, n1 in _chunks(n, sample_bytes):
        xp = _padded(x[n0:n1], th, tw)
        dyp = np.zeros((n1 - n0, 2 * th, 2 * tw, m), x.dtype)  # zero past the image's edge
        dyp[:, :h, :wd] = dy[n0:n1].transpose(0, 2, 3, 1)
        tiles = (n1 - n0) * th * tw
        if v is None:
            block = _block(tiles, max(c, m), x.itemsize)
            v = np.empty((16, block, c), x.dtype)
            g = np.empty((16, block, m), x.dtype)
        block = v.shape[1]
        for t0 in range(0, tiles, block):
            t1 = min(t0 + block, tiles)
            k = t1 - t0
            _input_transform(xp, t0, t1, th, tw, v)
            _gradient_transform(dyp, t0, t1, th, tw, g)
            matmul(g[:, :k].transpose(0, 2, 1), v[:, :k], out=s, accumulate=True)
    dw = np.empty((m, c, 3, 3), x.dtype)
    _weight_transform(s, dw)
    return dw
