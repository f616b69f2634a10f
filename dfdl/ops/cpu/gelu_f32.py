"""float32 GELU kernels (``approximate="none"``) on an ``exp`` and ``erfc`` that LLVM can
vectorize inside numba loops.

numba here has no SVML, so a loop that calls ``math.exp`` or ``math.erfc`` makes one
scalar libm call per element. The pieces here are arithmetic only, so a loop over them
compiles to AVX-512/AVX2 code: :func:`exp_parts` splits ``exp(a)`` into a polynomial on
``[-ln2/2, ln2/2]`` and ``2**k``, built from its float32 bit pattern by
:func:`float_from_bits` (an LLVM bitcast: numba itself cannot reinterpret a scalar's
bits); :func:`erfc_exp_arg` gives ``t`` and ``b`` with ``erfc(a) = t * exp(b)`` for
``a >= 0`` (the Chebyshev fit of Press et al., Numerical Recipes 6.2, fractional error
below 1.2e-7). :func:`gelu` and :func:`gelu_grad` ask LLVM for 512-bit vectors
(:mod:`dfdl.ops.cpu.vector_width`).

Guarantees: against float64 libm, :func:`gelu` and :func:`gelu_grad` are within 2e-6
relative or 1e-6 absolute (``tests/ops/cpu``). Below :data:`EXP_MIN`, :func:`exp_parts`
gives exactly 0, so ``x * exp(-x * x)`` is 0 for huge ``x``; NaN passes through. The
helpers and the kernels share this module on purpose: numba's cache is invalidated by
the source file of the cached function, not by the files of functions it inlines.

Example:
    >>> x = np.array([-1.0, 0.0, 2.0], np.float32); out = np.empty_like(x)
    >>> gelu(x, out); out.round(4)
    array([-0.1587,  0.    ,  1.9545], dtype=float32)

Measurements: ``docs/design/gelu-f32.md``, ``wide-vectors.md``.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from dfdl.ops.cpu.vector_width import prefer_wide_vectors

_f32 = np.float32

#: exp of arguments below this is 0 (float32's smallest normal is exp(-87.34))
EXP_MIN = _f32(-87.0)

_LOG2E = _f32(1 / math.log(2))
# ln2 split so that k * _LN2_HI is exact for |k| < 2**8
_LN2_HI = _f32(0.693145751953125)
_LN2_LO = _f32(math.log(2) - 0.693145751953125)
_HALF = _f32(0.5)
_ONE = _f32(1.0)
_ZERO = _f32(0.0)
_INV_SQRT2 = _f32(1 / math.sqrt(2))
_INV_SQRT_2PI = _f32(1 / math.sqrt(2 * math.pi))
# Taylor terms 1/2! .. 1/7! of exp(r): 2.4e-8 relative on |r| <= ln2/2
_P2, _P3, _P4, _P5, _P6, _P7 = (_f32(1 / math.factorial(k)) for k in range(2, 8))
_ERFC = tuple(
    _f32(c)
    for c in (
        -1.26551223,
        1.00002368,
        0.37409196,
        0.09678418,
        -0.18628806,
        0.27886807,
        -1.13520398,
        1.48851587,
        -0.82215223,
        0.17087277,
    )
)
_E0, _E1, _E2, _E3, _E4, _E5, _E6, _E7, _E8, _E9 = _ERFC


@intrinsic
def float_from_bits(typingctx, bits):
    """The float32 whose bit pattern is ``bits`` (an integer, taken as int32; inside numba
    functions)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@numba.njit(inline="always")
def exp_parts(a):
    """``(p, s)`` with ``exp(a) = p * s`` and ``s = 2**k``; ``p`` is 0 for
    ``a < EXP_MIN``. ``a`` must be at most 88 (or NaN).
    """
    tail = a < EXP_MIN
    a = EXP_MIN if tail else a  # keeps k in float32's exponent range
    k = math.floor(a * _LOG2E + _HALF)
    r = a - k * _LN2_HI - k * _LN2_LO
    p = _ONE + r * (_ONE + r * (_P2 + r * (_P3 + r * (_P4 + r * (_P5 + r * (_P6 + r * _P7))))))
    s = float_from_bits((np.int32(k) + np.int32(127)) << np.int32(23))
    return (_ZERO if tail else p), s


@numba.njit(inline="always")
def erfc_exp_arg(a):
    """``(t, b)`` with ``erfc(a) = t * exp(b)``, for ``a >= 0`` (b unclamped)."""
    t = _ONE / (_ONE + _HALF * a)
    poly = _E8 + t * _E9
    poly = _E7 + t * poly
    poly = _E6 + t * poly
    poly = _E5 + t * poly
    poly = _E4 + t * poly
    poly = _E3 + t * poly
    poly = _E2 + t * poly
    poly = _E1 + t * poly
    return t, -a * a + _E0 + t * poly


# error_model="numpy": no ZeroDivisionError checks in the loops
_jit = numba.njit(cache=True, nogil=True, error_model="numpy")


@_jit
def gelu(x, out):
    """out = x * Phi(x), for flat float32 x."""
    prefer_wide_vectors()
    for j in range(x.size):
        v = x[j]
        t, b = erfc_exp_arg(abs(v) * _INV_SQRT2)
        p, s = exp_parts(b)
        h = _HALF * (p * t) * s  # Phi(-|v|)
        out[j] = v * (_ONE - h if v >= 0 else h)


@_jit
def gelu_grad(dy, x, out):
    """out = dy * (Phi(x) + x * phi(x)), for flat float32 dy and x."""
    prefer_wide_vectors()
    for j in range(x.size):
        v = x[j]
        a = abs(v) * _INV_SQRT2
        t, b = erfc_exp_arg(a)
        p, s = exp_parts(b)
        h = _HALF * (p * t) * s  # Phi(-|v|)
        p, s = exp_parts(-a * a)
        pdf = _INV_SQRT_2PI * p * s
        out[j] = dy[j] * ((_ONE - h if v >= 0 else h) + v * pdf)
