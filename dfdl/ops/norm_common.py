"""Shape checks and float64 math shared by the normalization op modules.

:mod:`dfdl.ops.batch_norm`, :mod:`dfdl.ops.norm` (Instance- and LayerNormalization) and
:mod:`dfdl.ops.softmax` check their inputs alike, and the batch- and instance-norm
gradients share one float64 formula. This module registers no op.

Example:
    >>> channel_view(np.arange(3.0), 4).shape
    (3, 1, 1)
"""

from __future__ import annotations

import numpy as np

from dfdl.errors import ShapeError
from dfdl.ops.common import normalize_axis
from dfdl.ops.registry import TensorType


def channel_view(p: np.ndarray, rank: int) -> np.ndarray:
    """A per-channel (C,) parameter reshaped to broadcast against (N, C, D1, ...).

    Example:
        >>> channel_view(np.ones(2), 3).shape
        (2, 1)
    """
    return np.reshape(p, (-1,) + (1,) * (rank - 2))


def as_f64(a: np.ndarray | None) -> np.ndarray | None:
    """``a`` as a float64 array (None stays None).

    Example:
        >>> as_f64(np.ones(2, np.float32)).dtype
        dtype('float64')
    """
    return None if a is None else np.asarray(a, dtype=np.float64)


def check_axis(axis: int, rank: int, op: str) -> int:
    """``axis`` made non-negative, or a :class:`ShapeError` naming ``op`` when it is out
    of range for ``rank``.

    Example:
        >>> check_axis(-1, 3, "Softmax")
        2
    """
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"{op}: axis {axis} out of range for rank {rank}", name="axis")
    return normalize_axis(axis, rank)


def check_channels(op: str, X: TensorType, params) -> None:
    """Raises a :class:`ShapeError` unless X is (N, C, ...) and every present parameter
    in ``params`` has shape (C,).

    Example:
        >>> check_channels("BatchNormalization", TensorType((2, 3), "f4"), [None])
    """
    if X.rank < 2:
        raise ShapeError(f"{op}: input must have rank >= 2 (N x C x ...), got {X.shape}")
    for p in params:
        if p is not None and p.shape != (X.shape[1],):
            raise ShapeError(
                f"{op}: per-channel input must have shape ({X.shape[1]},), got {p.shape}",
                expected=(X.shape[1],),
                given=p.shape,
            )


def check_like(op: str, what: str, t: TensorType | None, shape: tuple) -> None:
    """Raises a :class:`ShapeError` when the present input ``what`` lacks ``shape``.

    Example:
        >>> check_like("dfdl.SoftmaxGrad", "dY", TensorType((2,), "f4"), (2,))
    """
    if t is not None and t.shape != shape:
        raise ShapeError(f"{op}: {what} must have shape {shape}, got {t.shape}", name=what)


def normalize_grad(dY, X, scale, dMean, dVar, epsilon, axes):
    """Shared float64 math of training-mode batch- and instance-norm gradients.

    ``axes`` are the statistics axes; per-channel parameters broadcast along axis 1.
    ``dMean``/``dVar`` (None, or already shaped to broadcast against X) are gradients
    reaching the statistics; a missing ``dY`` counts as zeros.

    Returns:
        ``(dX, sum(dY * xhat), sum(dY))``, the sums keeping dims, all float64.

    Example:
        >>> x = np.array([[1.0], [3.0]])
        >>> normalize_grad(np.ones_like(x), x, np.ones(1), None, None, 0.0, (0,))[2]
        array([[2.]])
    """
    r = X.ndim
    x = as_f64(X)
    cnt = int(np.prod([X.shape[a] for a in axes], dtype=np.int64))
    xc = x - x.mean(axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt((xc * xc).mean(axis=axes, keepdims=True) + epsilon)
    xhat = xc * inv
    dy = np.zeros_like(x) if dY is None else as_f64(dY)
    db = dy.sum(axis=axes, keepdims=True)
    ds = (dy * xhat).sum(axis=axes, keepdims=True)
    # d/dx of scale * xhat through the batch mean and variance
    dx = channel_view(as_f64(scale), r) * inv * (dy - db / cnt - xhat * (ds / cnt))
    if dMean is not None:
        dx = dx + dMean / cnt
    if dVar is not None:
        dx = dx + dVar * (2.0 / cnt) * xc
    return dx, ds, db


def epsilon_params(*inputs, epsilon=1e-5) -> dict:
    """The parameters of kernels whose only attribute is ``epsilon``: it, as a float.

    Example:
        >>> epsilon_params(np.ones((2, 3)), epsilon=1e-3)
        {'epsilon': 0.001}
    """
    return {"epsilon": float(epsilon)}
