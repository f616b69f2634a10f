"""Give freed tile memory back to the system, so a worker's resident memory follows its tiles.

Tiles under glibc's mmap threshold (kept high, :data:`dfdl.runtime.cluster.DASK_CONFIG`)
live in the malloc heap, and glibc gives freed heap memory back only from the top of
the heap: once small long-lived tiles (weights, optimizer state) sit between freed
activation tiles, the worker keeps the freed memory resident, and Dask counts it as
unmanaged memory it cannot spill. :class:`HeapTrimmer` is a worker plugin that checks,
every ``interval`` seconds (``idle_interval`` while the process is under half the
floor), whether the process's resident memory is above
:func:`trim_floor` (half of Dask's lowest process-memory threshold), and only then the
free heap (``mallinfo2``), which it trims (``malloc_trim(0)``) when it exceeds
:func:`trim_threshold` of the worker's memory limit. It also trims before each of Dask's
own memory measurements, so Dask's spill loop does not evict far more than it needs.

Guarantees: tiles and values are untouched (only free pages go back); on a system
without glibc it does nothing. Every worker of dfdl's clusters has it, also after the
nanny restarts it (:mod:`dfdl.runtime.worker_setup` installs it); for other clusters,
preload that module or call :func:`install`.

Example:
    >>> trim_threshold(2**30) // 2**20
    32
    >>> install(Client("tcp://scheduler:8786"))  # doctest: +SKIP

Measurements: ``docs/design/worker-memory.md``.
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
#: ... and while the resident memory is under half the trim floor: each check wakes the
#: worker's event loop, which cost 0.8% of a core at 50 Hz on the development VM, and far
#: under the floor there is nothing to trim (``docs/design/worker-memory.md``)
IDLE_INTERVAL_S = 0.1
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

    Trimming costs the next step its page faults again, and far below every threshold
    free heap held resident cannot make Dask spill, pause or restart the worker
    (measurements: ``docs/design/worker-memory.md``).

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

    def __init__(self, interval: float = INTERVAL_S, idle_interval: float = IDLE_INTERVAL_S):
        self.interval = interval
        self.idle_interval = max(interval, idle_interval)
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
        # resident size first: ``mallinfo2`` walks the free lists under the malloc
        # arena's lock, which the task threads wait on (docs/design/worker-memory.md)
        rss = self._rss()
        if self._callback is not None:  # the next check's period, from this one on
            far = rss < self.floor // 2
            self._callback.callback_time = 1000 * (self.idle_interval if far else self.interval)
        if rss <= self.floor:
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
