"""Dense matrix products on the CPU: Intel MKL's sequential GEMM when MKL is installed
(``pip install dfdl[mkl]``), numpy's BLAS otherwise.

Every CPU matrix product of dfdl's kernels (Gemm, MatMul and its gradients, the
convolutions' im2col products) goes through :func:`matmul`, which calls MKL's
``cblas_?gemm`` on the operands in place (transposed views, output views, ``+=`` into
an output without a temporary) and numpy's matmul for whatever MKL cannot take as it is
(integer or mixed dtypes, no unit stride, an output overlapping an input, empty axes).
The library is chosen once per process, at its first product, from ``DFDL_BLAS``:
``auto`` (the default: MKL when ``libmkl_rt`` is found, the CPU is Intel's and PyTorch
is not imported in the process, else numpy), ``mkl`` (MKL or an error) or ``numpy``;
:func:`backend` says which. MKL runs on its sequential layer (parallelism comes from
tiles, one thread per task) and is loaded lazily, so a process that only plans never
loads it. A process that imported torch runs on numpy (``auto``) or stops with an
error (``mkl``): the two MKLs take each other's symbols.

Guarantees: results are bit-identical from run to run as long as the library is the
same (MKL's sequential results do not depend on the arrays' alignment); MKL and
OpenBLAS sum in different orders, so give all workers of a cluster the same library.

Example:
    >>> a = np.ones((2, 3), np.float32)
    >>> matmul(a, np.ones((3, 4), np.float32))[0]
    array([3., 3., 3., 3.], dtype=float32)

Measurements: ``docs/design/blas.md``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
import platform
import sys
import threading

import numpy as np

from dfdl.errors import DfdlError

#: environment variable that picks the BLAS: ``auto``, ``mkl`` or ``numpy``
ENV = "DFDL_BLAS"

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_MKL_THREADING_SEQUENTIAL = 1


def _find_mkl() -> str | None:
    """Path of MKL's single dynamic library: the pip wheel's (``<prefix>/lib``), then
    the loader's search path."""
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix, os.environ.get("CONDA_PREFIX"))):
        if prefix:
            found = sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")))
            if found:
                return found[0]
    return ctypes.util.find_library("mkl_rt")


_XERBLA = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int)
_rejected = threading.local()


def _record_rejection(name, info, _length) -> None:
    _rejected.last = (name.decode(errors="replace").strip(), info[0])


# one handler for the process's life: MKL keeps the pointer, so it must never be freed
_XERBLA_HANDLER = _XERBLA(_record_rejection)


def _raise_rejected(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    """Raises when MKL rejected the arguments of this thread's last call."""
    got = getattr(_rejected, "last", None)
    if got is not None:
        _rejected.last = None
        raise DfdlError(
            f"MKL rejected argument {got[1]} of {got[0]} for {a.shape} @ {b.shape} into "
            f"{c.shape} (strides {a.strides}, {b.strides}, {c.strides}): a dfdl bug, please "
            f"report it; {ENV}=numpy works around it"
        )


class _Mkl:
    """ctypes bindings of MKL's CBLAS ``?gemm`` and ``?gemm_batch_strided``."""

    def __init__(self, path: str):
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
        # must precede MKL's first computation; a process whose numpy already runs
        # MKL keeps that layer (the call then returns the one in force)
        lib.MKL_Set_Threading_Layer(_MKL_THREADING_SEQUENTIAL)
        # MKL reports a bad argument through xerbla (by default: a line on stdout, the
        # output left unwritten); this one records it for :func:`_raise_rejected`
        lib.mkl_set_xerbla(_XERBLA_HANDLER)
        i, p = ctypes.c_int, ctypes.c_void_p
        self.gemm = {}
        self.batch = {}
        for dtype, prefix, real in (
            (np.float32, "s", ctypes.c_float),
            (np.float64, "d", ctypes.c_double),
        ):
            f = getattr(lib, f"cblas_{prefix}gemm")
            f.argtypes = [i, i, i, i, i, i, real, p, i, p, i, real, p, i]
            f.restype = None
            self.gemm[np.dtype(dtype)] = f
            fb = getattr(lib, f"cblas_{prefix}gemm_batch_strided", None)
            if fb is not None:
                fb.argtypes = [i, i, i, i, i, i, real, p, i, i, p, i, i, real, p, i, i, i]
                fb.restype = None
                self.batch[np.dtype(dtype)] = fb


@functools.cache
def cpu_vendor() -> str | None:
    """The CPU's vendor string (``"GenuineIntel"``, ``"AuthenticAMD"``...) where the
    system says it (Linux's ``/proc/cpuinfo``, else ``platform.processor()``), else None.

    Example:
        >>> cpu_vendor()  # doctest: +SKIP
        'AuthenticAMD'
    """
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id":
                    return value.strip() or None
    except OSError:
        pass
    name = platform.processor()
    for vendor in ("GenuineIntel", "AuthenticAMD"):
        if vendor in name:
            return vendor
    return None


def _choice() -> str:
    choice = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if choice not in ("auto", "mkl", "numpy"):
        raise DfdlError(f"{ENV}={choice!r}: use 'auto', 'mkl' or 'numpy'")
    return choice


def _load() -> _Mkl | None:
    choice = _choice()
    if choice == "numpy":
        return None
    path = _find_mkl()
    if path is None:
        if choice == "mkl":
            raise DfdlError(
                f"{ENV}=mkl but Intel MKL's libmkl_rt was not found: "
                "install it with `pip install dfdl[mkl]` (or `pip install mkl`), "
                f"or set {ENV}=auto"
            )
        return None
    if choice == "auto" and cpu_vendor() not in ("GenuineIntel", None):
        return None
    if "torch" in sys.modules:
        if choice == "mkl":
            raise DfdlError(
                f"{ENV}=mkl in a process that imported torch: PyTorch's own MKL and this "
                "one take each other's symbols (PyTorch's GEMMs ran on one thread, and MKL "
                f"crashed on a bad argument). Set {ENV}=auto (numpy here), or keep torch "
                "out of this process: dfdl's workers import what the script imports at its "
                "top level"
            )
        return None
    try:
        return _Mkl(path)
    except (OSError, AttributeError) as exc:
        if choice == "mkl":
            raise DfdlError(f"{ENV}=mkl but {path} could not be loaded: {exc}") from exc
        return None


_choice()  # a bad DFDL_BLAS fails at import, not in the first task
_UNSET = object()
_MKL = _UNSET  # loaded by the process's first product (see backend())
_LOCK = threading.Lock()


def _lib() -> _Mkl | None:
    global _MKL
    if _MKL is _UNSET:
        with _LOCK:
            if _MKL is _UNSET:
                _MKL = _load()
    return _MKL


def backend() -> str:
    """The library this process's products run on: ``"mkl"`` or ``"numpy"`` (loads
    MKL if it is to be used and not loaded yet).

    Example:
        >>> backend() in ("mkl", "numpy")
        True
    """
    return "numpy" if _lib() is None else "mkl"


#: smallest ``m * n * k`` sent to MKL; smaller products cost more in the ctypes call
#: (about 2 us) than they gain
MIN_WORK = 4096


def _operand(x: np.ndarray) -> tuple[int, int] | None:
    """``(transpose flag, leading dimension)`` of a 2-D operand BLAS reads in place
    (row-major, or the transpose of a row-major array), else None."""
    item = x.itemsize
    rows, cols = x.shape
    s0, s1 = x.strides
    if (s1 == item or cols == 1) and s0 % item == 0 and (rows == 1 or s0 >= cols * item):
        return _NO_TRANS, max(s0 // item if rows > 1 else cols, cols, 1)
    if (s0 == item or rows == 1) and s1 % item == 0 and (cols == 1 or s1 >= rows * item):
        return _TRANS, max(s1 // item if cols > 1 else rows, rows, 1)
    return None


def _out_ld(c: np.ndarray) -> int | None:
    """Leading dimension of an output BLAS writes in place (row-major only), else None."""
    got = _operand(c)
    return got[1] if got is not None and got[0] == _NO_TRANS else None


def _usable(a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> bool:
    dtype = a.dtype
    lib = _lib()
    if lib is None or dtype not in lib.gemm or b.dtype != dtype:
        return False
    if out is not None and (
        out.dtype != dtype or np.may_share_memory(out, a) or np.may_share_memory(out, b)
    ):
        return False
    m, k = a.shape[-2:]
    n = b.shape[-1]
    return m * n * k >= MIN_WORK and min(m, n, k) > 0


def matmul(
    a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, *, accumulate: bool = False
) -> np.ndarray:
    """``a @ b`` (numpy's matmul semantics for 2-D and stacked operands), into ``out``
    when given; ``accumulate=True`` adds the product to ``out`` instead (``out += a @ b``
    without a temporary).

    Args:
        a: ``(..., M, K)`` array.
        b: ``(..., K, N)`` array; batch axes broadcast against ``a``'s.
        out: optional output of the product's shape and dtype.
        accumulate: add into ``out`` (which must then be given).

    Returns:
        ``out`` if given, else a new array.

    Example:
        >>> y = np.zeros((2, 2), np.float32)
        >>> matmul(np.eye(2, dtype=np.float32), np.ones((2, 2), np.float32), y, accumulate=True)
        array([[1., 1.],
               [1., 1.]], dtype=float32)
    """
    if accumulate and out is None:
        raise ValueError("matmul: accumulate=True needs an output array")
    if a.ndim >= 2 and b.ndim >= 2 and _usable(a, b, out):
        if a.ndim == 2 and b.ndim == 2:
            if out is None:
                out = np.empty((a.shape[0], b.shape[1]), a.dtype)
            if out.shape == (a.shape[0], b.shape[1]) and _gemm(a, b, out, accumulate):
                return out
        else:
            done = _batched(a, b, out, accumulate)
            if done is not None:
                return done
    if accumulate:
        out += np.matmul(a, b)
        return out
    return np.matmul(a, b, out=out) if out is not None else np.matmul(a, b)


def _gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray, accumulate: bool) -> bool:
    ta, tb, ldc = _operand(a), _operand(b), _out_ld(c)
    if ta is None or tb is None or ldc is None:
        return False
    m, k = a.shape
    n = b.shape[1]
    _lib().gemm[a.dtype](
        _ROW_MAJOR, ta[0], tb[0], m, n, k, 1.0,
        a.ctypes.data, ta[1], b.ctypes.data, tb[1],
        1.0 if accumulate else 0.0, c.ctypes.data, ldc,
    )  # fmt: skip
    _raise_rejected(a, b, c)
    return True


def _batched(a, b, out, accumulate) -> np.ndarray | None:
    """Stacked products as one ``?gemm_batch_strided`` call: batch axes that flatten to
    one stride per operand (broadcast axes have stride 0). None when they do not."""
    m, k = a.shape[-2:]
    n = b.shape[-1]
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        return None
    f = _lib().batch.get(a.dtype)
    count = int(np.prod(batch))
    if f is None or count == 0:
        return None
    av = np.broadcast_to(a, (*batch, m, k))
    bv = np.broadcast_to(b, (*batch, k, n))
    if out is None:
        out = np.empty((*batch, m, n), a.dtype)
    elif out.shape != (*batch, m, n):
        return None
    a0, b0, c0 = av[(0,) * len(batch)], bv[(0,) * len(batch)], out[(0,) * len(batch)]
    if count == 1:  # MKL rejects the batch call's output stride 0 of a one-item stack
        return out if _gemm(a0, b0, c0, accumulate) else None
    sa, sb, sc = _flat_stride(av), _flat_stride(bv), _flat_stride(out)
    if sa is None or sb is None or sc is None:
        return None
    ta, tb, ldc = _operand(a0), _operand(b0), _out_ld(c0)
    # outputs that overlap one another would race (numpy handles them), and MKL checks
    # stridec >= m * ldc
    if ta is None or tb is None or ldc is None or sc < m * ldc:
        return None
    f(
        _ROW_MAJOR, ta[0], tb[0], m, n, k, 1.0,
        av.ctypes.data, ta[1], sa, bv.ctypes.data, tb[1], sb,
        1.0 if accumulate else 0.0, out.ctypes.data, ldc, sc, count,
    )  # fmt: skip
    _raise_rejected(av, bv, out)
    return out


def _flat_stride(x: np.ndarray) -> int | None:
    """Element stride of ``x``'s batch axes taken as one axis (row-major order), or None
    when they do not flatten to one stride."""
    shape, strides = x.shape[:-2], x.strides[:-2]
    step = None
    expect = None
    for size, stride in zip(reversed(shape), reversed(strides), strict=True):
        if size == 1:
            continue
        if stride % x.itemsize or stride < 0:
            return None
        if step is None:
            step = stride
        elif stride != expect:
            return None
        expect = stride * size
    return 0 if step is None else step // x.itemsize
