"""Spatial tiling with halos: the input slab a tile of a sliding-window op reads, and the
pads that tile's kernel needs so that it computes exactly its part of the whole.

Along one spatial axis, with window extent ``eff = (k - 1) * d + 1``, stride ``s`` and
begin pad ``p``:

* a *gather* op (Conv, MaxPool, AveragePool; ConvGradWeight reading X) computes output
  ``o`` from inputs ``o*s - p ... o*s - p + eff - 1``, so outputs ``[lo, hi)`` read the
  slab ``[lo*s - p, (hi-1)*s - p + eff)``. Clipped to the input, the tile's pads are
  what the slab reaches past the input's ends (zero at interior tile borders);
* a *scatter* op (ConvTranspose, ConvGradInput) adds input ``i`` into outputs
  ``i*s - p + j*d``, so outputs ``[lo, hi)`` receive from inputs
  ``floor((lo + p - eff + 1) / s) ... floor((hi - 1 + p) / s)``; the tile's pads place
  that slab's scatter so that exactly ``[lo, hi)`` is kept (a negative end pad crops).

Tiles then compute the same sums as the untiled op, term by term, so a spatially tiled
forward equals the untiled one (the planner's invariant 1).

Example:
    >>> gather_window(eff=3, stride=1, pad=1)(0, 4)
    (-1, 5)
    >>> gather_pads(eff=3, stride=1, pad=1, size=8, lo=0, hi=4)
    (1, 0)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dfdl.ops.common import LETTERS

Window = Callable[[int, int], tuple[int, int]]


def spatial_letters(nd: int) -> str:
    """Letters for ``nd`` spatial axes, outermost first, taken from the alphabet's end
    (``spatial_letters(3) == "xyz"``) so they never meet batch/channel letters."""
    return LETTERS[len(LETTERS) - nd :]


def gather_window(eff: int, stride: int, pad: int) -> Window:
    """Input range (unclipped) read by the outputs ``[lo, hi)`` of a gather op."""

    def window(lo: int, hi: int) -> tuple[int, int]:
        return lo * stride - pad, (hi - 1) * stride - pad + eff

    return window


def gather_pads(eff: int, stride: int, pad: int, size: int, lo: int, hi: int) -> tuple[int, int]:
    """(begin, end) pads of a gather tile whose slab is clipped to an input of ``size``."""
    start, stop = gather_window(eff, stride, pad)(lo, hi)
    return max(0, -start), max(0, stop - size)


def scatter_window(eff: int, stride: int, pad: int, n_src: int) -> Window:
    """Source range (clipped, never empty) that a scatter op adds into outputs ``[lo, hi)``.

    The start rounds down, so it may take one source whose terms all fall before ``lo``;
    they are cropped, and the tile's begin pad stays >= 0.
    """

    def window(lo: int, hi: int) -> tuple[int, int]:
        start = min(max(0, (lo + pad - eff + 1) // stride), n_src - 1)
        stop = min(n_src, (hi - 1 + pad) // stride + 1)
        return start, max(stop, start + 1)

    return window


def _extents(kernel, dilations) -> list[int]:
    return [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]


def gather_halo(sizes, kernel, strides, dilations, pads_begin, letters: str, read: int):
    """Halo reads of a gather op's input ``read`` (spatial ``sizes``), tiled along
    ``letters`` (one per spatial axis): ``(windows, pads)``, the TileSpec windows and
    ``pads(ranges)``, the tile's explicit ONNX ``pads`` list."""
    eff, nd = _extents(kernel, dilations), len(sizes)
    windows = {(read, 2 + a): gather_window(eff[a], strides[a], pads_begin[a]) for a in range(nd)}

    def pads(ranges) -> list[int]:
        out = [0] * (2 * nd)
        for a, ch in enumerate(letters):
            out[a], out[nd + a] = gather_pads(
                eff[a], strides[a], pads_begin[a], sizes[a], *ranges[ch]
            )
        return out

    return windows, pads


def scatter_halo(n_src, kernel, strides, dilations, pads_begin, letters: str, read: int):
    """As :func:`gather_halo`, for a scatter op whose input ``read`` (spatial ``n_src``)
    is added into outputs tiled along ``letters``."""
    eff, nd = _extents(kernel, dilations), len(n_src)
    windows = {
        (read, 2 + a): scatter_window(eff[a], strides[a], pads_begin[a], n_src[a])
        for a in range(nd)
    }

    def pads(ranges) -> list[int]:
        out = [0] * (2 * nd)
        for a, ch in enumerate(letters):
            out[a], out[nd + a] = scatter_pads(
                eff[a], strides[a], pads_begin[a], n_src[a], *ranges[ch]
            )
        return out

    return windows, pads


def scatter_pads(eff: int, stride: int, pad: int, n_src: int, lo: int, hi: int) -> tuple[int, int]:
    """(begin, end) pads of a scatter tile: with them, scattering the tile's source slab
    writes exactly the outputs ``[lo, hi)``."""
    start, stop = scatter_window(eff, stride, pad, n_src)(lo, hi)
    begin = lo + pad - start * stride
    end = stride * (stop - start - 1) + eff - begin - (hi - lo)
    return begin, end


def crop_slab(dx: np.ndarray, crop) -> np.ndarray:
    """The part ``[off, off + n)`` of each spatial axis of ``dx`` (``crop`` = off0, n0,
    off1, n1, ...), zeros where it runs past ``dx``'s end: the slab a tile keeps of what
    it computed over its halo (a MaxPoolGrad tile's dX). None keeps all of ``dx``.

    Example:
        >>> crop_slab(np.arange(4.0).reshape(1, 1, 4), [1, 4])[0, 0]
        array([1., 2., 3., 0.])
    """
    if crop is None or list(crop) == [v for n in dx.shape[2:] for v in (0, n)]:
        return dx  # the whole of dx: no copy (an untiled image, as in a ResNet's stem)
    nd = len(crop) // 2
    out = np.zeros(dx.shape[:2] + tuple(crop[2 * a + 1] for a in range(nd)), dx.dtype)
    src, dst = [slice(None)] * 2, [slice(None)] * 2
    for a in range(nd):
        off, n = crop[2 * a], crop[2 * a + 1]
        take = max(0, min(n, dx.shape[2 + a] - off))
        src.append(slice(off, off + take))
        dst.append(slice(0, take))
    out[tuple(dst)] = dx[tuple(src)]
    return out
