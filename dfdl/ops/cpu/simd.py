"""Explicit 512-bit vectors in numba kernels: one register of 16 float32 or 8 float64.

A kernel that keeps a block of accumulators in registers across a long reduction (a
convolution's 16 positions x 16 output channels) cannot be written as a loop numba
vectorizes: LLVM will not promote an array of accumulators to registers when other
arrays might alias it. These intrinsics give a kernel SSA vector values instead:
:func:`vzero`, :func:`vload`/:func:`vstore` of one vector at a flat index, :func:`vadd`,
and :func:`vfma_bcast` (one array element broadcast to every lane, times a vector, plus
an accumulator: a single ``vfmadd231ps (mem){1to16}`` on AVX-512; without AVX-512 LLVM
splits each vector into two or four legal ones).

Guarantees: the fused multiply-add rounds once, as the ``contract`` fast-math flag makes
numba's scalar ``s += a * b`` do, so a kernel written with these intrinsics gives the
same bits as a scalar loop with the same summation order. numba's cache keys a kernel
on its own source file: a change here does not recompile kernels cached with
``cache=True`` elsewhere (clear their ``__pycache__`` ``*.nbi``).

Example:
    >>> @numba.njit
    ... def dot16(x, w):
    ...     acc = vzero(w)
    ...     for i in range(x.size):
    ...         acc = vfma_bcast(acc, x, i, vload(w, 16 * i))
    ...     out = np.empty(16, w.dtype)
    ...     vstore(out, 0, acc)
    ...     return out
    >>> x, w = np.ones(3, np.float32), np.arange(48, dtype=np.float32)
    >>> dot16(x, w)[:3].tolist()
    [48.0, 51.0, 54.0]
"""

from __future__ import annotations

import numba  # noqa: F401  (the example's decorator)
import numpy as np  # noqa: F401  (the example)
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic, models, register_model

#: vector width in bytes (one AVX-512 register)
BYTES = 64


class Vector(types.Type):
    """numba type of one vector of ``64 // itemsize`` lanes of ``dtype``."""

    def __init__(self, dtype: types.Float):
        self.dtype = dtype
        self.lanes = BYTES * 8 // dtype.bitwidth
        super().__init__(name=f"vector({dtype}x{self.lanes})")


VECTORS = {types.float32: Vector(types.float32), types.float64: Vector(types.float64)}


def _llvm(vt: Vector) -> ir.VectorType:
    scalar = ir.FloatType() if vt.dtype == types.float32 else ir.DoubleType()
    return ir.VectorType(scalar, vt.lanes)


@register_model(Vector)
class _VectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _llvm(fe_type))


def _vector_of(arr) -> Vector | None:
    if isinstance(arr, types.Array) and arr.dtype in VECTORS:
        return VECTORS[arr.dtype]
    return None


def _address(context, builder, arr_type, arr, index):
    data = context.make_array(arr_type)(context, builder, arr).data
    return builder.gep(data, [index])


@intrinsic
def vzero(typingctx, like):
    """A vector of zeros of ``like``'s dtype (an array)."""
    vt = _vector_of(like)
    if vt is None:
        return None

    def codegen(context, builder, signature, args):
        return ir.Constant(_llvm(vt), [0.0] * vt.lanes)

    return vt(like), codegen


@intrinsic
def vload(typingctx, arr, index):
    """The vector ``arr.flat[index : index + lanes]`` (C-contiguous ``arr``; unaligned)."""
    vt = _vector_of(arr)
    if vt is None or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ptr = _address(context, builder, signature.args[0], args[0], args[1])
        return builder.load(builder.bitcast(ptr, _llvm(vt).as_pointer()), align=1)

    return vt(arr, index), codegen


@intrinsic
def vstore(typingctx, arr, index, value):
    """``arr.flat[index : index + lanes] = value`` (C-contiguous ``arr``; unaligned)."""
    vt = _vector_of(arr)
    if vt is None or value != vt or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ptr = _address(context, builder, signature.args[0], args[0], args[1])
        builder.store(args[2], builder.bitcast(ptr, _llvm(vt).as_pointer()), align=1)
        return context.get_dummy_value()

    return types.void(arr, index, value), codegen


@intrinsic
def vadd(typingctx, a, b):
    """``a + b`` lane by lane."""
    if not isinstance(a, Vector) or a != b:
        return None

    def codegen(context, builder, signature, args):
        return builder.fadd(args[0], args[1])

    return a(a, b), codegen


@intrinsic
def vfma_bcast(typingctx, acc, arr, index, w):
    """``acc + arr.flat[index] * w`` with one rounding, ``arr.flat[index]`` in every lane."""
    vt = _vector_of(arr)
    if vt is None or acc != vt or w != vt or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        lt = _llvm(vt)
        scalar = builder.load(_address(context, builder, signature.args[1], args[1], args[2]))
        lane0 = builder.insert_element(ir.Constant(lt, ir.Undefined), scalar, ir.IntType(32)(0))
        zeros = ir.Constant(ir.VectorType(ir.IntType(32), vt.lanes), [0] * vt.lanes)
        splat = builder.shuffle_vector(lane0, ir.Constant(lt, ir.Undefined), zeros)
        suffix = f"v{vt.lanes}f{vt.dtype.bitwidth}"
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(lt, [lt, lt, lt]), f"llvm.fma.{suffix}"
        )
        return builder.call(fma, [splat, args[3], args[0]])

    return vt(acc, arr, index, w), codegen


@intrinsic
def vtranspose(typingctx, rows):
    """A tuple of vectors, transposed in blocks of ``lanes`` x ``lanes``: with ``rows[k]``
    holding lanes ``m`` of item ``k``, the result's vector ``h*lanes + m`` holds lane ``m``
    of items ``h*lanes .. h*lanes + lanes`` (16 float32 rows: a 16x16 transpose; 16
    float64 rows: two 8x8 ones). Shuffles in registers, no memory.
    """
    if not isinstance(rows, types.UniTuple) or not isinstance(rows.dtype, Vector):
        return None
    vt = rows.dtype
    if rows.count % vt.lanes:
        return None

    def codegen(context, builder, signature, args):
        vec = [builder.extract_value(args[0], k) for k in range(rows.count)]
        h = vt.lanes // 2
        while h:
            # swap bit h of the row index with bit h of the lane index, for every row
            # pair (r, r + h): after all bits, row and lane have traded places
            low = [j if not j & h else vt.lanes + j - h for j in range(vt.lanes)]
            high = [j + h if not j & h else vt.lanes + j for j in range(vt.lanes)]
            for r in range(rows.count):
                if r & h:
                    continue
                a, b = vec[r], vec[r + h]
                vec[r] = builder.shuffle_vector(a, b, _indices(low))
                vec[r + h] = builder.shuffle_vector(a, b, _indices(high))
            h //= 2
        return context.make_tuple(builder, signature.return_type, vec)

    return rows(rows), codegen


def _indices(values: list[int]) -> ir.Constant:
    return ir.Constant(ir.VectorType(ir.IntType(32), len(values)), values)


@intrinsic
def vstore_lanes(typingctx, arr, index, value, lo, hi):
    """``arr.flat[index + k] = value[k]`` for the lanes ``lo <= k < hi`` only (a masked
    store: the other lanes' addresses are not touched, and may lie outside ``arr``)."""
    vt = _vector_of(arr)
    ints = (index, lo, hi)
    if vt is None or value != vt or not all(isinstance(v, types.Integer) for v in ints):
        return None

    def codegen(context, builder, signature, args):
        lt = _llvm(vt)
        i64 = ir.IntType(64)
        lane = ir.Constant(ir.VectorType(i64, vt.lanes), list(range(vt.lanes)))
        lo_v, hi_v = (
            _splat(builder, context.cast(builder, v, t, types.int64), i64, vt.lanes)
            for v, t in zip(args[3:], signature.args[3:])
        )
        mask = builder.and_(
            builder.icmp_signed(">=", lane, lo_v), builder.icmp_signed("<", lane, hi_v)
        )
        ptr = _address(context, builder, signature.args[0], args[0], args[1])
        ptr = builder.bitcast(ptr, lt.as_pointer())
        fnty = ir.FunctionType(ir.VoidType(), [lt, ptr.type, ir.IntType(32), mask.type])
        store = cgutils.get_or_insert_function(
            builder.module, fnty, f"llvm.masked.store.v{vt.lanes}f{vt.dtype.bitwidth}.p0"
        )
        builder.call(store, [args[2], ptr, ir.IntType(32)(1), mask])
        return context.get_dummy_value()

    return types.void(arr, index, value, lo, hi), codegen


def _splat(builder, value, scalar: ir.Type, lanes: int):
    lane0 = builder.insert_element(
        ir.Constant(ir.VectorType(scalar, lanes), ir.Undefined), value, ir.IntType(32)(0)
    )
    zeros = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)
    return builder.shuffle_vector(
        lane0, ir.Constant(ir.VectorType(scalar, lanes), ir.Undefined), zeros
    )
