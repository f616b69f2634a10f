"""Clusters: the embedded LocalCluster dfdl starts when no client is given.

The embedded cluster has one single-threaded worker process per core (BLAS and numba
run one thread per task; parallelism comes from tiles) and the scheduler's queuing
off (``worker-saturation: inf``), which measured 4x lower per-task overhead here.

Example:
    >>> with connect(None) as client:  # doctest: +SKIP
    ...     client.nthreads()
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import dask

#: dask settings dfdl's embedded cluster runs with
DASK_CONFIG = {
    "distributed.scheduler.worker-saturation": float("inf"),
    "distributed.worker.daemon": False,
}


def default_workers() -> int:
    """Worker processes for the embedded cluster: the usable cores."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def local_cluster(n_workers: int | None = None, **kwargs):
    """Start dfdl's embedded ``distributed.LocalCluster`` (worker processes).

    Args:
        n_workers: worker processes; default one per core.
        **kwargs: passed to ``distributed.LocalCluster`` (memory_limit, local_directory...).

    Example:
        >>> cluster = local_cluster(2)  # doctest: +SKIP
    """
    from distributed import LocalCluster

    kwargs.setdefault("threads_per_worker", 1)
    kwargs.setdefault("processes", True)
    kwargs.setdefault("dashboard_address", None)
    with dask.config.set(DASK_CONFIG):
        return LocalCluster(n_workers=n_workers or default_workers(), **kwargs)


@contextlib.contextmanager
def connect(client=None) -> Iterator:
    """Yield ``client`` unchanged, or an embedded cluster's client, shut down on exit."""
    if client is not None:
        yield client
        return
    from distributed import Client

    with local_cluster() as cluster, Client(cluster) as c:
        yield c


def total_threads(client) -> int:
    """Worker threads of the client's cluster (at least 1)."""
    try:
        return max(1, sum(client.nthreads().values()))
    except Exception:
        return 1
