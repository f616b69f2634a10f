"""Per-thread scratch arrays that a kernel reuses from one call to the next.

A kernel's large temporary array (the padded input grid of a direct convolution) is
fresh memory on every call: glibc hands a large block back to the system when it is
freed, and the next call faults every page in again. :func:`scratch` keeps one buffer
per name per thread and hands out a view of it, so a worker thread running the same
kernels step after step touches the same pages.

Contract: the contents are whatever the last call left, so a caller writes every value
it reads (results never depend on the buffer's history). Buffers over
:data:`MAX_BYTES` are not kept (a plain ``np.empty``), so the memory Dask's accounting
of tiles does not see stays below ``MAX_BYTES`` per name and worker thread; dfdl's
worker preload lowers ``MAX_BYTES`` with :func:`fit_to_worker` so that all of a
worker's scratch, task threads and gang helpers together, stays within
:data:`WORKER_SHARE` of its memory limit.

Example:
    >>> a = scratch("example", (4, 8), np.float32)
    >>> a.shape, a.dtype.name
    ((4, 8), 'float32')
    >>> scratch("example", (2, 8), np.float32).ctypes.data == a.ctypes.data
    True

Measurements: ``docs/design/scratch-memory.md``.
"""

from __future__ import annotations

import threading

import numpy as np

#: largest scratch buffer kept per name and thread
MAX_BYTES = 64 * 2**20
#: share of a worker's memory limit that the scratch of all its threads may hold
WORKER_SHARE = 1 / 32
#: scratch names a worker thread may keep (the direct convolutions' grid and dY)
NAMES = 2

_local = threading.local()


def scratch(name: str, shape: tuple, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array of ``shape`` and ``dtype``, on memory this
    thread reuses for every call with the same ``name``.

    Example:
        >>> scratch("grid", (3,), np.float64).size
        3
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes > MAX_BYTES:
        return np.empty(shape, dtype)
    buffers = _local.__dict__.setdefault("buffers", {})
    buf = buffers.get(name)
    if buf is None or buf.nbytes < nbytes + 64:
        # a quarter more than asked, so slightly larger tiles do not regrow it
        buf = np.empty(min(MAX_BYTES, nbytes + nbytes // 4) + 64, np.uint8)
        buffers[name] = buf
    # 64-byte aligned view: the kernels' vectors do not split cache lines at its start
    start = -buf.ctypes.data % 64
    return buf[start : start + nbytes].view(dtype).reshape(shape)


def worker_cap(memory_limit: int | None, threads: int) -> int:
    """The :data:`MAX_BYTES` that keeps ``threads`` threads' buffers of :data:`NAMES`
    names within :data:`WORKER_SHARE` of ``memory_limit`` (never above the current one).

    Example:
        >>> worker_cap(256 * 2**20, 2) // 2**20
        2
    """
    if not memory_limit:
        return MAX_BYTES
    return min(MAX_BYTES, int(memory_limit * WORKER_SHARE) // (max(1, threads) * NAMES))


def fit_to_worker(memory_limit: int | None, threads: int) -> int:
    """Set :data:`MAX_BYTES` in this process to :func:`worker_cap`; returns it.

    Example:
        >>> fit_to_worker(None, 2) == MAX_BYTES
        True
    """
    global MAX_BYTES
    MAX_BYTES = worker_cap(memory_limit, threads)
    return MAX_BYTES
