"""Numba kernel of dfdl.SoftmaxCrossEntropyLossGrad (float32/float64 scores).

``dscores[n, :, d] = coef[n, d] * (softmax(scores)[n, :, d] - onehot(labels[n, d]))``
with the coefficients that :func:`dfdl.ops.loss.sce_grad_params` resolves. The softmax
runs as :mod:`dfdl.ops.cpu.softmax`'s does: a numba pass subtracting the class max,
numpy's SIMD ``exp`` in place on cache-sized blocks, a numba pass that normalizes with a
float64 sum and subtracts the label's coefficient. Other dtypes and empty tensors use
the numpy forward (the ``accepts`` rule).

Example:
    >>> coef, labels = np.ones(1), np.zeros(1, np.intp)
    >>> softmax_cross_entropy_loss_grad(
    ...     None, np.zeros((1, 2), np.float32), None, coef=coef, safe_labels=labels
    ... )
    array([[-0.5,  0.5]], dtype=float32)
"""

from __future__ import annotations

import numba
import numpy as np

from dfdl.ops.cpu.softmax import BLOCK, sub_row_max
from dfdl.ops.registry import kernel

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _sce_finish_rows(e, labels, coef):
    """e[r, :] = coef[r] * (e[r, :] / sum(e[r, :]) - onehot(labels[r])), in place."""
    rows, n = e.shape
    for r in range(rows):
        s = 0.0
        for j in range(n):
            s += e[r, j]
        a = coef[r] / s
        for j in range(n):
            e[r, j] = e[r, j] * a
        e[r, labels[r]] -= coef[r]


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _sub_max_axis1(x, out):
    """out[n, :, s] = x[n, :, s] - max over the class axis, for x (N, C, S)."""
    N, C, S = x.shape
    mx = np.empty(S, dtype=x.dtype)
    for n in range(N):
        for s in range(S):
            mx[s] = x[n, 0, s]
        for c in range(1, C):
            for s in range(S):
                if x[n, c, s] > mx[s]:
                    mx[s] = x[n, c, s]
        for c in range(C):
            for s in range(S):
                out[n, c, s] = x[n, c, s] - mx[s]


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _sce_finish_nc(e, labels, coef):
    """_sce_finish_rows over the class axis of e (N, C, S): S-vectors stay contiguous."""
    N, C, S = e.shape
    sm = np.empty(S)
    for n in range(N):
        for s in range(S):
            sm[s] = 0.0
        for c in range(C):
            for s in range(S):
                sm[s] += e[n, c, s]
        for s in range(S):
            sm[s] = coef[n, s] / sm[s]
        for c in range(C):
            for s in range(S):
                e[n, c, s] = e[n, c, s] * sm[s]
        for s in range(S):
            e[n, labels[n, s], s] -= coef[n, s]


def _accepts(dloss, scores, *inputs, **attrs) -> bool:
    return scores.dtype in _FLOATS and scores.size > 0


@kernel("SoftmaxCrossEntropyLossGrad", domain="dfdl", accepts=_accepts)
def softmax_cross_entropy_loss_grad(
    dloss, scores, labels, weights=None, *, coef: np.ndarray, safe_labels: np.ndarray
):
    """The loss gradient for a float32/float64 (N, C, d...) ``scores`` tile; ``coef``
    and ``safe_labels`` have the labels' shape (``dloss``, ``labels`` and ``weights``
    are read through them)."""
    N, C = scores.shape[:2]
    x = np.ascontiguousarray(scores).reshape(N, C, -1)
    S = x.shape[2]
    coef = np.ascontiguousarray(coef, dtype=np.float64).reshape(N, S)
    safe = safe_labels.reshape(N, S)
    out = np.empty_like(x)
    step = max(1, BLOCK // max(C * S, 1))
    for i in range(0, N, step):
        ob = out[i : i + step]
        if S == 1:  # rows: the class axis is contiguous
            rows = ob.reshape(-1, C)
            sub_row_max(x[i : i + step].reshape(-1, C), rows)
            np.exp(rows, out=rows)
            _sce_finish_rows(rows, safe[i : i + step, 0], coef[i : i + step, 0])
        else:
            _sub_max_axis1(x[i : i + step], ob)
            np.exp(ob, out=ob)
            _sce_finish_nc(ob, safe[i : i + step], coef[i : i + step])
    return out.reshape(scores.shape)
