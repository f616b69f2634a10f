"""Give freed tile memory back to the system, so a worker's resident memory follows its tiles.

Tiles under glibc's mmap threshold (dfdl keeps it high: fresh mmaps made the kernels
1.7x slower, :data:`dfdl.runtime.cluster.DASK_CONFIG`) live in the malloc heap. glibc
gives freed heap memory back only from the top of the heap, so once small long-lived
tiles (weights, optimizer state) sit between the freed activation tiles, the worker
keeps the freed memory resident. Dask counts it as unmanaged memory it cannot spill:
measured on a 3-D U-Net with 1 GiB workers, 470 MiB of a worker's 764 MiB were free
heap, the worker paused at 80% with nothing left to spill, and Dask's nanny killed it at
95%. ``malloc_trim(0)`` (which also frees the pages in the middle of the heap and in the
other threads' arenas) brought the same worker to 295 MiB.

:class:`HeapTrimmer` is a worker plugin that checks, every ``interval`` seconds, whether
the process's resident memory is above :func:`trim_floor` (half of Dask's lowest
process-memory threshold), and only then the free heap (``mallinfo2``: 8 µs on a quiet
heap, more during a step, under the malloc lock), which it trims when it exceeds
:func:`trim_threshold` of the worker's memory limit. Under the floor the free heap
cannot make Dask spill or pause, and trimming it only costs the next step its page
faults again. It also trims before each of Dask's own memory measurements:
Dask's spill loop evicts one tile at a time until the process's resident memory falls
below its target, and an evicted tile that stays in the heap does not lower it, so
without a trim there the loop evicts far more than it needs (for up to 0.5 s, the event
loop blocked) and the worker pauses with nothing left to spill.

Every worker of dfdl's clusters has it, also after the nanny restarts it: they preload
:mod:`dfdl.runtime.worker_setup`, which installs it. For other clusters, start the
workers with ``dask worker --preload dfdl.runtime.worker_setup`` (dask-jobqueue:
``worker_extra_args=["--preload", "dfdl.runtime.worker_setup"]``) or call
:func:`install`.
On a system without glibc it does nothing.

Example:
    >>> install(Client("tcp://scheduler:8786"))  # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

import dask
import psutil
from distributed.diagnostics.plugin import WorkerPlugin

logger = logging.getLogger(__name__)

#: free heap kept before a trim, as a share of the worker's memory limit
TRIM_FRACTION = 1 / 32
#: ... and at least this many bytes (trimming less costs more page faults than it saves)
TRIM_MIN_BYTES = 16 * 2**20
#: how often the free heap is checked (seconds); Dask's memory monitor runs every 0.1 s
INTERVAL_S = 0.02
#: no trim while the process's resident memory is under this share of the lowest
#: process-memory threshold Dask acts on (:func:`trim_floor`)
TRIM_ABOVE = 0.5


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _glibc():
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        lib.mallinfo2.restype = _Mallinfo2
        lib.malloc_trim.argtypes = [ctypes.c_size_t]
        return lib
    except (OSError, AttributeError):  # not glibc, or glibc before 2.33
        return None


_LIBC = _glibc()


def free_heap_bytes() -> int | None:
    """Bytes that malloc holds free in its arenas (None without glibc >= 2.33).

    Example:
        >>> free_heap_bytes() >= 0
        True
    """
    if _LIBC is None:
        return None
    return int(_LIBC.mallinfo2().fordblks)


def release_free_heap() -> bool:
    """Return the free heap's whole pages to the system (``malloc_trim(0)``).

    Returns whether memory was released.

    Example:
        >>> release_free_heap() in (True, False)
        True
    """
    if _LIBC is None:
        return False
    return bool(_LIBC.malloc_trim(0))


def trim_threshold(memory_limit: int | None) -> int:
    """Free heap bytes a worker with ``memory_limit`` keeps before trimming.

    Example:
        >>> trim_threshold(2**30) // 2**20
        32
    """
    if not memory_limit:
        return 2**62  # no limit: leave glibc alone
    return max(TRIM_MIN_BYTES, int(memory_limit * TRIM_FRACTION))


def trim_floor(memory_limit: int | None, fractions=(0.7, 0.8, 0.95)) -> int:
    """Resident bytes under which a worker with ``memory_limit`` never trims:
    :data:`TRIM_ABOVE` of the lowest of the process-memory ``fractions`` Dask acts on
    (spill, pause, terminate; None or False for one that is off).

    Trimming costs the next step its page faults again: the zoo's transformer trimmed
    20 times per step on the embedded cluster (790 MiB of free heap between its forward
    and backward passes), faulting 25,600 pages per step back in; without the trims
    4,400, and its step took 1.75 s instead of 1.96 s (its kernels 13% less time). Far
    below every threshold, free heap held resident cannot make Dask spill, pause or
    restart the worker, and the next step allocates it again anyway.

    Example:
        >>> trim_floor(2**30, (0.7, 0.7, 0.95)) // 2**20
        358
    """
    if not memory_limit:
        return 2**62
    lowest = min((f for f in fractions if f), default=1.0)
    return int(memory_limit * lowest * TRIM_ABOVE)


class HeapTrimmer(WorkerPlugin):
    """Trims a worker's free heap when it exceeds :func:`trim_threshold` of its limit and
    the process's resident memory exceeds :func:`trim_floor`."""

    name = "dfdl-heap"

    def __init__(self, interval: float = INTERVAL_S):
        self.interval = interval
        self.trims = 0
        self.floor = 0
        self._process = None  # the worker's, made in setup (the plugin is pickled)
        self._callback = None
        self._measure = None

    def setup(self, worker) -> None:
        from tornado.ioloop import PeriodicCallback

        if _LIBC is None:
            return
        self._process = psutil.Process()
        manager = getattr(worker, "memory_manager", None)
        limit = getattr(manager, "memory_limit", None)
        self.threshold = trim_threshold(limit)
        self.floor = trim_floor(
            limit,
            [getattr(manager, f"memory_{k}_fraction", None) for k in ("spill", "pause")]
            + [dask.config.get("distributed.worker.memory.terminate", False)],
        )
        if self.threshold >= 2**62:
            return
        self._callback = PeriodicCallback(self._check, self.interval * 1000)
        self._callback.start()
        monitor = getattr(worker, "monitor", None)
        if monitor is not None:
            self._measure = (monitor, monitor.get_process_memory)
            monitor.get_process_memory = self._trimmed_memory

    def _trimmed_memory(self) -> int:
        # what Dask pauses and spills on: the process as it is once freed tiles are gone
        self._check()
        return self._measure[1]()

    def _check(self) -> None:
        # resident size first: ``mallinfo2`` walks the free lists under the one malloc
        # arena's lock, which the task threads wait on. During a ResNet step it was 7%
        # of the event loop's py-spy samples, and checking the resident size first
        # (under the floor on most workers) took the loop's CPU from 0.158 to 0.146 s
        # per step (bench/cpu_use.py, 5 alternating fresh clusters)
        if self._rss() <= self.floor:
            return
        free = free_heap_bytes()
        if free is not None and free > self.threshold:
            release_free_heap()
            self.trims += 1

    def _rss(self) -> int:
        return self._process.memory_info().rss

    def teardown(self, worker) -> None:
        if self._callback is not None:
            self._callback.stop()
            self._callback = None
        if self._measure is not None:
            monitor, measure = self._measure
            monitor.get_process_memory = measure
            self._measure = None


def install(client) -> None:
    """Install :class:`HeapTrimmer` on every worker of ``client``'s cluster (and on the
    workers that join later); installing again replaces it.

    Example:
        >>> install(Client("tcp://scheduler:8786"))  # doctest: +SKIP
    """
    client.register_plugin(HeapTrimmer(), name=HeapTrimmer.name)
