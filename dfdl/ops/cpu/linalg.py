"""CPU kernels of the matrix products (Gemm, MatMul, dfdl.MatMulT, dfdl.MatMulGradB).

Every product goes through :func:`dfdl.ops.cpu.blas.matmul` (MKL's sequential GEMM or
numpy's BLAS). A stack of rows times one matrix (a dense layer: A ``(..., M, K)``, B
``(K, N)``) runs as one ``(rows, K) @ (K, N)`` GEMM, where numpy's batched matmul would
call BLAS once per leading index.

Example:
    >>> a = np.ones((2, 3, 4), np.float32)
    >>> matmul_(a, np.ones((4, 5), np.float32)).shape
    (2, 3, 5)

Measurements: ``docs/design/matmul-grad-b.md``.
"""

from __future__ import annotations

import numpy as np

from dfdl.ops.cpu.blas import matmul
from dfdl.ops.registry import kernel


def _product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b``, a stack of C-ordered rows times one matrix as one GEMM."""
    if a.ndim > 2 and b.ndim == 2 and a.flags.c_contiguous:
        return np.asarray(matmul(a.reshape(-1, a.shape[-1]), b)).reshape(*a.shape[:-1], b.shape[-1])
    return np.asarray(matmul(a, b))


@kernel("Gemm")
def gemm(A, B, C=None, *, alpha: float, beta: float, trans_a: bool, trans_b: bool):
    """``alpha * A' @ B' + beta * C`` on BLAS."""
    a = A.T if trans_a else A
    b = B.T if trans_b else B
    y = np.asarray(matmul(a, b))
    # in place: the product is a fresh array, and a second output-sized allocation
    # costs page faults on every call (a dense layer's output is 16-64 MiB)
    if alpha != 1.0:
        np.multiply(y, alpha, out=y, casting="unsafe")
    if C is not None and beta != 0.0:
        np.add(y, C * beta if beta != 1.0 else C, out=y, casting="unsafe")
    return y.astype(A.dtype, copy=False)


@kernel("MatMul")
def matmul_(A, B):
    """``A @ B`` (numpy semantics) on BLAS."""
    return _product(A, B).astype(A.dtype, copy=False)


@kernel("MatMulT", domain="dfdl")
def matmul_t(A, B, *, trans_a: bool, trans_b: bool):
    """``A' @ B'`` on BLAS, reading a transposed operand in place."""
    a = np.swapaxes(A, -1, -2) if trans_a else A
    b = np.swapaxes(B, -1, -2) if trans_b else B
    return _product(a, b).astype(A.dtype, copy=False)


@kernel("MatMulGradB", domain="dfdl")
def matmul_grad_b(A, dY):
    """``A^T dY`` over all rows of A ``(..., M, K)`` and dY ``(..., M, N)``: one GEMM."""
    a = A.reshape(-1, A.shape[-1])
    dy = dY.reshape(-1, dY.shape[-1])
    return np.asarray(matmul(a.T, dy)).astype(A.dtype, copy=False)
