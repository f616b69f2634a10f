"""Shorter message batching between scheduler and workers, for fine-grained graphs.

Dask batches scheduler-to-worker messages every 5 ms and worker-to-scheduler messages
every 2 ms; a training step is a chain of hundreds of dependent tile tasks, and every
dependency waits for one message each way. :class:`SchedulerLatency` and
:class:`WorkerLatency` set both intervals to :data:`INTERVAL_S` (0.5 ms) on dfdl's
embedded cluster; install them on your own cluster with :func:`install`. Only message
timing changes, never a message or a value; on a Dask without the batched streams'
``interval`` the plugins do nothing.

Example:
    >>> install(Client("tcp://scheduler:8786"))  # doctest: +SKIP

Measurements: ``docs/design/latency.md``.
"""

from __future__ import annotations

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

#: message batching interval dfdl uses (seconds)
INTERVAL_S = 0.0005


def _set(stream, interval: float) -> None:
    # BatchedSend reads ``interval`` before every send; absent on other versions: no-op
    if stream is not None and hasattr(stream, "interval"):
        stream.interval = interval


class SchedulerLatency(SchedulerPlugin):
    """Sets the scheduler's batching interval towards every worker."""

    name = "dfdl-latency-scheduler"

    def __init__(self, interval: float = INTERVAL_S):
        self.interval = interval

    def start(self, scheduler) -> None:
        for stream in getattr(scheduler, "stream_comms", {}).values():
            _set(stream, self.interval)

    def add_worker(self, scheduler=None, worker=None, **kwargs) -> None:
        _set(getattr(scheduler, "stream_comms", {}).get(worker), self.interval)


class WorkerLatency(WorkerPlugin):
    """Sets a worker's batching interval towards the scheduler."""

    name = "dfdl-latency-worker"

    def __init__(self, interval: float = INTERVAL_S):
        self.interval = interval

    def setup(self, worker) -> None:
        _set(getattr(worker, "batched_stream", None), self.interval)


def install(client, interval: float = INTERVAL_S) -> None:
    """Install both plugins on ``client``'s cluster (workers started later get it too).

    Args:
        client: a ``distributed.Client``.
        interval: the batching interval in seconds.

    Example:
        >>> install(Client("tcp://scheduler:8786"))  # doctest: +SKIP
    """
    client.register_plugin(SchedulerLatency(interval))
    client.register_plugin(WorkerLatency(interval))
