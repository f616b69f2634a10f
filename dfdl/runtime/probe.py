"""Measured speeds of the workers, for choosing between spilling and recomputing.

``memory="auto"`` weighs recomputing a segment (its forward FLOPs at the workers' kernel
rate) against spilling its activations (written to and read back from the spill
directory). Both rates are measured on every worker, the way tasks run there (one BLAS
thread per task, files written without fsync as Dask's spill writes them, so the page
cache counts as it does for spilling), and the slowest worker's count. On hardware you
know, pin them with dask config: ``dfdl.speeds.flops-per-s`` and
``dfdl.speeds.disk-bytes-per-s`` (either or both). The speeds choose between spilling
and recomputing only: either way a step computes the same values.

Example:
    >>> speeds = cluster_speeds(client)  # doctest: +SKIP
    >>> speeds.disk_bytes_per_s > 0      # doctest: +SKIP
    True
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from dfdl.ops.cpu.blas import matmul

#: bytes written and read back to measure the spill directory
DISK_PROBE_BYTES = 64 * 2**20
#: size of the float32 matmul timed for the kernel rate
MATMUL_PROBE_N = 512


@dataclass(frozen=True)
class Speeds:
    """Rates one worker thread reaches: FLOP/s of float32 matmul, spill directory
    bytes/s (the slower of writing and reading back)."""

    flops_per_s: float
    disk_bytes_per_s: float


def measure(folder: str | None = None) -> Speeds:
    """Time a float32 matmul and a write + read of ``DISK_PROBE_BYTES`` in
    ``folder`` (default: the worker's local directory when run in a worker, else the
    temporary directory).

    Example:
        >>> measure().flops_per_s > 0  # doctest: +SKIP
        True
    """
    folder = folder or _spill_folder()
    n = MATMUL_PROBE_N
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    matmul(a, a)  # warm up BLAS
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        matmul(a, a)
        best = min(best, time.perf_counter() - t0)
    flops = 2 * n**3 / max(best, 1e-9)
    block = np.random.default_rng(1).bytes(4 * 2**20)
    fd, path = tempfile.mkstemp(prefix="dfdl-disk-probe-", dir=folder)
    try:
        t0 = time.perf_counter()
        with os.fdopen(fd, "wb") as f:
            for _ in range(DISK_PROBE_BYTES // len(block)):
                f.write(block)
        write = time.perf_counter() - t0
        t0 = time.perf_counter()
        with open(path, "rb") as f:
            while f.read(len(block)):
                pass
        read = time.perf_counter() - t0
    finally:
        os.remove(path)
    return Speeds(flops, DISK_PROBE_BYTES / max(write, read, 1e-9))


def _spill_folder() -> str:
    try:
        from distributed import get_worker

        return get_worker().local_directory
    except ValueError:  # not in a worker
        import dask

        return dask.config.get("temporary-directory", None) or tempfile.gettempdir()


_cache: dict[tuple, Speeds] = {}


def cluster_speeds(client) -> Speeds:
    """The slowest worker's :func:`measure`, measured once per set of workers; the dask
    config ``dfdl.speeds.flops-per-s`` / ``dfdl.speeds.disk-bytes-per-s`` replace what is
    set.

    Example:
        >>> cluster_speeds(client).flops_per_s  # doctest: +SKIP
    """
    import dask

    flops = dask.config.get("dfdl.speeds.flops-per-s", None)
    disk = dask.config.get("dfdl.speeds.disk-bytes-per-s", None)
    if flops is not None and disk is not None:
        return Speeds(float(flops), float(disk))
    key = tuple(sorted(client.scheduler_info()["workers"]))
    if key not in _cache:
        got = client.run(measure).values()
        _cache[key] = Speeds(min(s.flops_per_s for s in got), min(s.disk_bytes_per_s for s in got))
    measured = _cache[key]
    return Speeds(
        float(flops) if flops is not None else measured.flops_per_s,
        float(disk) if disk is not None else measured.disk_bytes_per_s,
    )
