"""Ask LLVM for 512-bit vectors in one numba kernel.

LLVM tunes Intel CPUs with AVX-512 to prefer 256-bit vectors (``prefer-256-bit``), and
numba compiles every kernel with the host's tuning; a kernel bound by its fused
multiply-adds does twice the work per instruction with 512-bit vectors. Calling
:func:`prefer_wide_vectors` first thing in a ``@numba.njit`` function sets LLVM's
per-function ``prefer-vector-width`` attribute on it, so only that kernel changes. On a
CPU without AVX-512 LLVM keeps the widest legal vectors and the call does nothing; on
AMD's Zen 4 and 5, which LLVM already tunes for 512-bit vectors, it changes nothing
either.

numba's cache keys a kernel on its own source file: a change here does not recompile
kernels cached with ``cache=True`` elsewhere (clear their ``__pycache__`` ``*.nbi``).

Example:
    >>> @numba.njit
    ... def axpy(a, x, y):
    ...     prefer_wide_vectors()
    ...     for i in range(x.size):
    ...         y[i] += a * x[i]

Measurements: ``docs/design/wide-vectors.md``.
"""

from __future__ import annotations

import numba  # noqa: F401  (the example's decorator)
from numba.core import types
from numba.extending import intrinsic

#: the LLVM function attribute (llvmlite's attribute set checks names against a fixed
#: list of flag attributes, which key="value" attributes are not on: added as a string)
ATTRIBUTE = '"prefer-vector-width"="512"'


@intrinsic
def prefer_wide_vectors(typingctx):
    """Set ``prefer-vector-width=512`` on the numba function that calls this."""

    def codegen(context, builder, signature, args):
        attributes = builder.function.attributes
        if isinstance(attributes, set):  # a hint: without it the kernel is only slower
            set.add(attributes, ATTRIBUTE)
        return context.get_dummy_value()

    return types.void(), codegen
