"""Matrix products: Gemm and MatMul (numpy BLAS; no numba kernel needed).

Both contract one axis; tiles of that axis give partial products that the planner
sums with a tree reduction (``reduce={"k": "sum"}``).
"""

from __future__ import annotations

import numpy as np

from dfdl.errors import ShapeError, UnsupportedOpError
from dfdl.ops.common import letters
from dfdl.ops.registry import TensorType, TileContext, TileSpec, register

_MATMUL_DTYPES = frozenset(
    np.dtype(t)
    for t in (np.float16, np.float32, np.float64, np.int32, np.int64, np.uint32, np.uint64)
)


def _check_dtype(op: str, *types: TensorType | None) -> np.dtype:
    dtype = types[0].dtype
    if dtype not in _MATMUL_DTYPES:
        raise UnsupportedOpError(f"{op}: dtype {dtype} is not supported", op_type=op)
    for t in types[1:]:
        if t is not None and t.dtype != dtype:
            raise ShapeError(f"{op}: input dtypes differ ({dtype} vs {t.dtype})")
    return dtype


# ----------------------------------------------------------------------------- Gemm


def _gemm_shape(inputs, consts, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    a, b, c = (list(inputs) + [None])[:3]
    dtype = _check_dtype("Gemm", a, b, c)
    if a.rank != 2 or b.rank != 2:
        raise ShapeError(f"Gemm: A and B must be 2-D, got {a.shape} and {b.shape}")
    m, ka = a.shape[::-1] if transA else a.shape
    kb, n = b.shape[::-1] if transB else b.shape
    if ka != kb:
        raise ShapeError(f"Gemm: inner dimensions differ ({ka} vs {kb})", expected=ka, given=kb)
    if c is not None:
        try:
            if np.broadcast_shapes(c.shape, (m, n)) != (m, n):
                raise ValueError
        except ValueError:
            raise ShapeError(
                f"Gemm: C of shape {c.shape} does not broadcast to {(m, n)}", name="C"
            ) from None
    return [TensorType((m, n), dtype)]


def _gemm_tile(ctx: TileContext) -> TileSpec:
    a, b, c = (list(ctx.inputs) + [None])[:3]
    trans_a = ctx.attrs.get("transA", 0)
    trans_b = ctx.attrs.get("transB", 0)
    # C is right-aligned against "ij"; its size-1 axes are broadcast by the planner.
    c_spec = None if c is None else "ij"[2 - c.rank :]
    return TileSpec(
        inputs=("ki" if trans_a else "ik", "jk" if trans_b else "kj", c_spec),
        outputs=("ij",),
        reduce={"k": "sum"},
        first_only={2},
    )


@register("Gemm", shape=_gemm_shape, tile=_gemm_tile)
def Gemm(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    """General matrix product ``alpha * A' @ B' + beta * C`` (ONNX Gemm).

    Linear in (A, B) and in C separately, so partial products over K tiles plus C
    given to one tile sum to the full result.
    """
    dtype = A.dtype
    a = A.T if transA else A
    b = B.T if transB else B
    y = np.matmul(a, b)
    if alpha != 1.0:
        y = y * alpha
    if C is not None and beta != 0.0:
        y = y + (C * beta if beta != 1.0 else C)
    return np.asarray(y).astype(dtype, copy=False)


# --------------------------------------------------------------------------- MatMul


def _matmul_dims(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Output shape of numpy/ONNX matmul (1-D operands promoted, then squeezed)."""
    if not a or not b:
        raise ShapeError(f"MatMul: operands must have rank >= 1, got {a} and {b}")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ShapeError(
            f"MatMul: inner dimensions differ ({a} @ {b})", expected=a2[-1], given=b2[-2]
        )
    try:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        raise ShapeError(f"MatMul: batch dimensions of {a} and {b} do not broadcast") from None
    out = (*batch, *(a2[-2:-1] if len(a) > 1 else ()), *(b2[-1:] if len(b) > 1 else ()))
    return tuple(out)


def _matmul_shape(inputs, consts):
    a, b = inputs
    dtype = _check_dtype("MatMul", a, b)
    return [TensorType(_matmul_dims(a.shape, b.shape), dtype)]


def _matmul_tile(ctx: TileContext) -> TileSpec:
    a, b = ctx.inputs
    nb = max(a.rank - 2, b.rank - 2, 0)
    batch = letters(nb, offset=3)  # "a"=rows of A, "b"=columns of B, "c"=contracted
    a_spec = (batch[nb - (a.rank - 2) :] + "a" if a.rank >= 2 else "") + "c"
    b_spec = (
        (batch[nb - (b.rank - 2) :] if b.rank >= 2 else "") + "c" + ("b" if b.rank >= 2 else "")
    )
    out = batch + ("a" if a.rank >= 2 else "") + ("b" if b.rank >= 2 else "")
    return TileSpec(inputs=(a_spec, b_spec), outputs=(out,), reduce={"c": "sum"})


@register("MatMul", shape=_matmul_shape, tile=_matmul_tile)
def MatMul(A, B):
    """Numpy-style matrix product with broadcast batch dimensions (ONNX MatMul)."""
    return np.asarray(np.matmul(A, B)).astype(A.dtype, copy=False)
