"""Matrix products: Gemm and MatMul, their numpy forwards, VJPs and costs.

Both contract one axis; tiles of that axis give partial products that the planner
sums with a tree reduction (``reduce={"k": "sum"}``). The gradients are matrix products
again (Gemm with transposition flags, batched MatMul against a Transpose); batched
MatMul gradients keep the broadcast batch shape and the autodiff driver sums them down.
The common dense layer ``(..., M, K) @ (K, N)`` (a torch ``nn.Linear`` on a sequence)
takes its weight gradient from ``dfdl.MatMulGradB``: one GEMM over all ``... x M`` rows
of a tile, with ``prod(...)`` times less memory than a batched product summed down.
``dfdl.MatMulT`` is MatMul with transpose flags: the training graph's products of a
Transpose of the last two axes read that operand in place
(:mod:`dfdl.training.passes.fold_transpose`).

The CPU kernels (BLAS through :func:`dfdl.ops.cpu.blas.matmul`) are in
:mod:`dfdl.ops.cpu.linalg`; they receive :func:`gemm_params`' resolved flags.

Example:
    >>> from dfdl.ops import REGISTRY
    >>> REGISTRY["MatMul"].forward(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32))[0]
    array([3., 3., 3., 3.], dtype=float32)

Measurements: ``docs/design/matmul-grad-b.md``.
"""

from __future__ import annotations

import numpy as np

from dfdl.errors import ShapeError, UnsupportedOpError
from dfdl.ops.common import letters
from dfdl.ops.registry import (
    Cost,
    TensorType,
    TileContext,
    TileSpec,
    defvjp,
    io_bytes,
    register,
)

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


def gemm_params(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0) -> dict:
    """The Gemm kernels' parameters: ``alpha``, ``beta`` as floats, the flags as bools."""
    return {
        "alpha": float(alpha),
        "beta": float(beta),
        "trans_a": bool(transA),
        "trans_b": bool(transB),
    }


def _gemm_cost(inputs, outputs, *, transA=0, **attrs) -> Cost:
    a = inputs[0].shape
    return Cost(2 * outputs[0].size * (a[0] if transA else a[1]), io_bytes(inputs, outputs))


@register(
    "Gemm",
    shape=_gemm_shape,
    tile=_gemm_tile,
    contraction=True,
    params=gemm_params,
    cost=_gemm_cost,
)
def Gemm(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    """General matrix product ``alpha * A' @ B' + beta * C`` (ONNX Gemm).

    Linear in (A, B) and in C separately, so partial products over K tiles plus C
    given to one tile sum to the full result.
    """
    a = A.T if transA else A
    b = B.T if transB else B
    y = np.asarray(np.matmul(a, b))
    if alpha != 1.0:
        np.multiply(y, alpha, out=y, casting="unsafe")
    if C is not None and beta != 0.0:
        np.add(y, C * beta if beta != 1.0 else C, out=y, casting="unsafe")
    return y.astype(A.dtype, copy=False)


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


def _matmul_cost(inputs, outputs, **attrs) -> Cost:
    return Cost(2 * outputs[0].size * inputs[0].shape[-1], io_bytes(inputs, outputs))


@register("MatMul", shape=_matmul_shape, tile=_matmul_tile, contraction=True, cost=_matmul_cost)
def MatMul(A, B):
    """Numpy-style matrix product with broadcast batch dimensions (ONNX MatMul).

    Example:
        >>> MatMul(np.ones((2, 3, 4), np.float32), np.ones((4, 5), np.float32)).shape
        (2, 3, 5)
    """
    return np.asarray(np.matmul(A, B)).astype(A.dtype, copy=False)


# ---------------------------------------------------------------------- dfdl.MatMulT


def _swapped(t: TensorType, flag: int, name: str) -> tuple[int, ...]:
    if not flag:
        return t.shape
    if t.rank < 2:
        raise ShapeError(f"MatMulT: trans{name} needs a rank >= 2 operand, got {t.shape}")
    return (*t.shape[:-2], t.shape[-1], t.shape[-2])


def _matmul_t_shape(inputs, consts, *, transA=0, transB=0):
    a, b = inputs
    dtype = _check_dtype("MatMulT", a, b)
    return [TensorType(_matmul_dims(_swapped(a, transA, "A"), _swapped(b, transB, "B")), dtype)]


def _matmul_t_tile(ctx: TileContext) -> TileSpec:
    spec = _matmul_tile(ctx)
    a_spec, b_spec = spec.inputs
    # a transposed operand is stored with its last two axes the other way round
    if ctx.attrs.get("transA", 0):
        a_spec = a_spec[:-2] + a_spec[-1] + a_spec[-2]
    if ctx.attrs.get("transB", 0):
        b_spec = b_spec[:-2] + b_spec[-1] + b_spec[-2]
    return TileSpec(inputs=(a_spec, b_spec), outputs=spec.outputs, reduce=spec.reduce)


def matmul_t_params(A, B, *, transA=0, transB=0) -> dict:
    """The MatMulT kernels' parameters: the transpose flags as bools."""
    return {"trans_a": bool(transA), "trans_b": bool(transB)}


def _matmul_t_cost(inputs, outputs, *, transA=0, **attrs) -> Cost:
    a = inputs[0].shape
    return Cost(2 * outputs[0].size * (a[-2] if transA else a[-1]), io_bytes(inputs, outputs))


@register(
    "MatMulT",
    domain="dfdl",
    shape=_matmul_t_shape,
    tile=_matmul_t_tile,
    contraction=True,
    differentiable=False,
    params=matmul_t_params,
    cost=_matmul_t_cost,
)
def MatMulT(A, B, *, transA=0, transB=0):
    """``A' @ B'`` with numpy matmul semantics, where ``A'`` is A with its last two axes
    swapped when ``transA`` (likewise B): a MatMul that reads a transposed operand in
    place (BLAS's transpose flags) instead of after a Transpose task copied it.
    :mod:`dfdl.training.passes.fold_transpose` writes it into training graphs.

    Example:
        >>> a, b = np.ones((2, 4, 3), np.float32), np.ones((4, 5), np.float32)
        >>> MatMulT(a, b, transA=1).shape
        (2, 3, 5)
    """
    a = np.swapaxes(A, -1, -2) if transA else A
    b = np.swapaxes(B, -1, -2) if transB else B
    return np.asarray(np.matmul(a, b)).astype(A.dtype, copy=False)


# ------------------------------------------------------------------- dfdl.MatMulGradB


def _grad_b_shape(inputs, consts):
    a, dy = inputs
    dtype = _check_dtype("MatMulGradB", a, dy)
    if a.rank < 2 or a.shape[:-1] != dy.shape[:-1]:
        raise ShapeError(
            f"MatMulGradB: A {a.shape} and dY {dy.shape} must agree on all axes but the last"
        )
    return [TensorType((a.shape[-1], dy.shape[-1]), dtype)]


def _grad_b_tile(ctx: TileContext) -> TileSpec:
    rows = letters(ctx.inputs[0].rank - 1, offset=2)  # "k" and "n" are a, b
    return TileSpec(
        inputs=(rows + "a", rows + "b"),
        outputs=("ab",),
        reduce={ch: "sum" for ch in rows},
    )


def _grad_b_cost(inputs, outputs, **attrs) -> Cost:
    return Cost(
        2 * outputs[0].size * (inputs[0].size // inputs[0].shape[-1]), io_bytes(inputs, outputs)
    )


@register(
    "MatMulGradB",
    domain="dfdl",
    shape=_grad_b_shape,
    tile=_grad_b_tile,
    contraction=True,
    differentiable=False,
    cost=_grad_b_cost,
)
def MatMulGradB(A, dY):
    """``sum over ... and M of A^T dY`` for A ``(..., M, K)``, dY ``(..., M, N)``: the
    gradient of ``A @ B`` with respect to a 2-D B, as one ``(K, rows) @ (rows, N)`` GEMM.

    Example:
        >>> a, dy = np.ones((2, 3, 4), np.float32), np.ones((2, 3, 5), np.float32)
        >>> MatMulGradB(a, dy)[0, :3]
        array([6., 6., 6.], dtype=float32)
    """
    a = A.reshape(-1, A.shape[-1])
    dy = dY.reshape(-1, dY.shape[-1])
    return np.asarray(np.matmul(a.T, dy)).astype(A.dtype, copy=False)


# ----------------------------------------------------------------------------- VJPs


@defvjp("Gemm")
def _gemm_vjp(b, node, dys):
    a, bm = node.inputs[:2]
    c = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    dy = dys[0]
    alpha = float(node.attrs.get("alpha", 1.0))
    beta = float(node.attrs.get("beta", 1.0))
    ta, tb = int(node.attrs.get("transA", 0)), int(node.attrs.get("transB", 0))
    # with A' = op(A), B' = op(B): dA' = alpha dY B'^T and dB' = alpha A'^T dY; a
    # transposed operand takes the transpose, which swaps the factors of the product
    if ta:
        da = b.op("Gemm", [bm, dy], {"alpha": alpha, "transA": tb, "transB": 1})
    else:
        da = b.op("Gemm", [dy, bm], {"alpha": alpha, "transB": 1 - tb})
    if tb:
        db = b.op("Gemm", [dy, a], {"alpha": alpha, "transA": 1, "transB": ta})
    else:
        db = b.op("Gemm", [a, dy], {"alpha": alpha, "transA": 1 - ta})
    dc = None
    if c is not None and beta != 0.0:  # beta = 0: C is ignored, no gradient
        dc = dy if beta == 1.0 else b.op("Mul", [dy, b.const(beta, b.type(dy).dtype, "beta")])
    return [da, db, dc]


def _swap_last(b, name: str) -> str:
    """Transpose of the last two axes."""
    r = b.type(name).rank
    return b.op("Transpose", [name], {"perm": [*range(r - 2), r - 1, r - 2]})


def _unsqueeze(b, name: str, axis: int) -> str:
    """Insert a size-1 axis at ``axis`` (negative counts from the end of the result)."""
    r = b.type(name).rank + 1
    return b.op("Unsqueeze", [name, b.const([axis % r], np.int64, "axes")])


@defvjp("MatMul")
def _matmul_vjp(b, node, dys):
    a, bm = node.inputs
    dy = dys[0]
    ra, rb = b.type(a).rank, b.type(bm).rank
    if ra == 1 and rb == 1:  # dot product: dY is a scalar
        return [b.op("Mul", [dy, bm]), b.op("Mul", [dy, a])]
    if ra == 2 and rb == 2:
        return [b.op("Gemm", [dy, bm], {"transB": 1}), b.op("Gemm", [a, dy], {"transA": 1})]
    if rb == 1:  # Y (..., M) = A (..., M, K) @ b (K): dA = dY b^T, db = dY^T A
        da = b.op("MatMul", [_unsqueeze(b, dy, -1), _unsqueeze(b, bm, 0)])
        db = b.op("MatMul", [_unsqueeze(b, dy, -2), a])  # (..., 1, K), summed by the driver
        return [da, db]
    if ra == 1:  # Y (..., N) = a (K) @ B (..., K, N): da = dY B^T, dB = a dY
        dyr = _unsqueeze(b, dy, -2)  # (..., 1, N)
        da = b.op("MatMul", [dyr, _swap_last(b, bm)])  # (..., 1, K), summed by the driver
        db = b.op("MatMul", [_unsqueeze(b, a, 1), dyr])
        return [da, db]
    if rb == 2:  # a dense layer: one GEMM over all rows, nothing to sum down
        return [
            b.op("MatMul", [dy, _swap_last(b, bm)]),
            b.op("MatMulGradB", [a, dy], domain="dfdl"),
        ]
    # batched: results keep the broadcast batch shape; the driver sums them down
    return [b.op("MatMul", [dy, _swap_last(b, bm)]), b.op("MatMul", [_swap_last(b, a), dy])]
