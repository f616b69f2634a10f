"""numba kernels for Resize modes "linear" and "cubic" and their adjoint (float32/float64),
per axis.

Each pass views the tensor as ``(outer, L, inner)`` and computes
``out[o, j, i] = sum_k w[j, k] * x[o, idx[j, k], i]`` with a float64 accumulator;
intermediate passes keep the input dtype. Other modes and dtypes use the numpy forward.
``ResizeGrad`` runs the adjoint passes (last axis first) as float64 scatter-adds. Both
receive their passes from the op's params rule (:func:`dfdl.ops.resize.resize_params`).

Example:
    >>> from dfdl.ops.resize import resize_params
    >>> x = np.ones((1, 1, 2, 2), np.float32)
    >>> resize(x, **resize_params(x, scales=np.array([1, 1, 2, 2], np.float32),
    ...                           mode="linear")).shape
    (1, 1, 4, 4)
"""

from __future__ import annotations

import math

import numba
import numpy as np

from dfdl.ops.registry import kernel

_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@numba.njit(cache=True, nogil=True)
def _resize_axis(x, out, idx, w, outside, fill):
    O, _, I = x.shape
    J, n = idx.shape
    for o in range(O):
        for j in range(J):
            if outside[j]:
                out[o, j, :] = fill
                continue
            for i in range(I):
                acc = 0.0
                for k in range(n):
                    acc += w[j, k] * x[o, idx[j, k], i]
                out[o, j, i] = acc


@numba.njit(cache=True, nogil=True)
def _resize_last_axis(x, out, idx, w, outside, fill):
    """``_resize_axis`` for the innermost axis (inner == 1), on 2-D views."""
    O, _ = x.shape
    J, n = idx.shape
    for o in range(O):
        xr = x[o]
        orow = out[o]
        for j in range(J):
            if outside[j]:
                orow[j] = fill
                continue
            acc = 0.0
            for k in range(n):
                acc += w[j, k] * xr[idx[j, k]]
            orow[j] = acc


def _accepts_filter(X, *rest, mode="nearest", **attrs) -> bool:
    return mode in ("linear", "cubic") and X.dtype in _KERNEL_DTYPES


@kernel("Resize", accepts=_accepts_filter)
def resize(X, roi=None, scales=None, sizes=None, *, passes, extrapolation_value):
    """numba linear or cubic Resize: ``passes`` (:func:`dfdl.ops.resize.forward_passes`) one axis
    after the other, ``extrapolation_value`` where a pass marks an output outside."""
    y = np.ascontiguousarray(X)
    for a, idx, w, outside, n_out in passes:
        L = y.shape[a]
        if outside is None:
            outside = np.zeros(len(idx), bool)
        outer, inner = math.prod(y.shape[:a]), math.prod(y.shape[a + 1 :])
        new_shape = y.shape[:a] + (n_out,) + y.shape[a + 1 :]
        out = np.empty(new_shape, X.dtype)
        args = (idx.astype(np.int64), np.ascontiguousarray(w), outside, extrapolation_value)
        if inner == 1:
            _resize_last_axis(y.reshape(outer, L), out.reshape(outer, n_out), *args)
        else:
            _resize_axis(y.reshape(outer, L, inner), out.reshape(outer, n_out, inner), *args)
        y = out
    return X.copy() if y is X else y


@numba.njit(cache=True, nogil=True)
def _scatter_axis(g, out, idx, w):
    """Adjoint of one pass: ``out[o, idx[j, k], i] += w[j, k] * g[o, j, i]`` (out zeroed)."""
    O, J, I = g.shape
    n = idx.shape[1]
    for o in range(O):
        for j in range(J):
            for k in range(n):
                wk = w[j, k]
                if wk == 0.0:
                    continue
                src = idx[j, k]
                for i in range(I):
                    out[o, src, i] += wk * g[o, j, i]


def _floats(dY, *rest, **attrs) -> bool:
    return dY.dtype in _KERNEL_DTYPES


@kernel("ResizeGrad", accepts=_floats, domain="dfdl")
def resize_grad(dY, roi=None, scales=None, sizes=None, *, passes):
    """numba dfdl.ResizeGrad: the adjoint ``passes`` (:func:`dfdl.ops.resize.adjoint_passes`)
    as float64 scatter-adds."""
    g = np.ascontiguousarray(dY, dtype=np.float64)
    for a, L, idx, w in passes:
        outer, inner = math.prod(g.shape[:a]), math.prod(g.shape[a + 1 :])
        out = np.zeros(g.shape[:a] + (L,) + g.shape[a + 1 :])
        _scatter_axis(
            g.reshape(outer, g.shape[a], inner),
            out.reshape(outer, L, inner),
            idx.astype(np.int64),
            np.ascontiguousarray(w, dtype=np.float64),
        )
        g = out
    return g.astype(dY.dtype)
