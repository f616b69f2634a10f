"""1x1 convolutions without padding, at any stride: a strided sample of the input and
one matrix product, for the forward and both gradients.

A 1x1 kernel reads one input position per output position, so the convolution is
``y[n] = W @ x[n][:, ::s]`` (positions flattened), with no im2col buffer: :func:`conv`,
:func:`conv_grad_weight` (one product over all samples' positions) and
:func:`conv_grad_input` (``W^T @ dY`` placed at the sampled positions, zeros elsewhere).
:func:`applies` says which convolutions they take; :mod:`dfdl.ops.cpu.conv` picks them
for a ResNet's shortcuts. Products go through :func:`dfdl.ops.cpu.blas.matmul`.

Example:
    >>> x = np.ones((2, 3, 4, 4), np.float32)
    >>> w = np.ones((5, 3, 1, 1), np.float32)
    >>> conv(x, w, (2, 2)).shape
    (2, 5, 2, 2)

Measurements: ``docs/design/conv-pointwise.md``.
"""

from __future__ import annotations

import numpy as np

from dfdl.ops.cpu.blas import matmul


def applies(w_shape, group: int, pads_begin, pads_end) -> bool:
    """Whether a Conv runs here: every kernel extent 1, one group, no padding (the
    dilation of a 1x1 kernel changes nothing).

    Example:
        >>> applies((128, 64, 1, 1), 1, [0, 0], [0, 0])
        True
    """
    return (
        all(k == 1 for k in w_shape[2:])
        and group == 1
        and not any(pads_begin)
        and not any(pads_end)
    )


def _every(strides) -> tuple:
    """The index of the input positions a strided 1x1 kernel reads."""
    return (slice(None), slice(None), *(slice(None, None, int(s)) for s in strides))


def _sampled(x: np.ndarray, strides) -> np.ndarray:
    """The input positions a strided 1x1 kernel reads: ``(N, C, positions)``."""
    return np.ascontiguousarray(x[_every(strides)]).reshape(x.shape[0], x.shape[1], -1)


def conv(x: np.ndarray, w: np.ndarray, strides) -> np.ndarray:
    """``Conv(x, w)`` without bias: ``(N, C_out, *out)``."""
    xs = _sampled(x, strides)
    y = matmul(np.ascontiguousarray(w).reshape(w.shape[0], w.shape[1]), xs)
    out = tuple(-(-n // int(s)) for n, s in zip(x.shape[2:], strides, strict=True))
    return y.reshape((x.shape[0], w.shape[0], *out))


def conv_grad_weight(x: np.ndarray, dy: np.ndarray, strides, w_shape) -> np.ndarray:
    """dW of :func:`conv`: one product over every sample's positions,
    ``dY (C_out, N*P) @ x_sampled (N*P, C)``."""
    n, m = dy.shape[:2]
    xs = _sampled(x, strides)
    # samples side by side along the contracted axis: (C, N*P) and (C_out, N*P); two plain
    # copies measured no slower than one strided 4-D transpose
    cols = np.ascontiguousarray(xs.transpose(1, 0, 2)).reshape(x.shape[1], -1)
    dyt = np.ascontiguousarray(dy.reshape(n, m, -1).transpose(1, 0, 2)).reshape(m, -1)
    return matmul(dyt, cols.T).reshape(w_shape)


def conv_grad_input(dy: np.ndarray, w: np.ndarray, strides, x_shape) -> np.ndarray:
    """dX of :func:`conv`: ``W^T @ dY`` at the sampled positions, zero elsewhere."""
    n, m = dy.shape[:2]
    wt = np.ascontiguousarray(w.reshape(m, w.shape[1]).T)
    g = matmul(wt, np.ascontiguousarray(dy).reshape(n, m, -1))
    if all(int(s) == 1 for s in strides):
        return g.reshape(x_shape)
    dx = np.zeros(x_shape, dy.dtype)
    dx[_every(strides)] = g.reshape((n, w.shape[1], *dy.shape[2:]))
    return dx
