"""Surviving lost workers: what counts as lost data, and the anchor training rolls back to.

Dask recomputes a lost tile from its task when the task's inputs can still be had: the
intermediate tiles of the steps in flight, and the constants and small batch tiles,
which travel inside the graph. What it cannot rebuild is data that was handed to it
rather than computed: the weights scattered at the start, a large batch tile, or a
carried tile whose lineage the scheduler has already forgotten. Then the step's futures
are cancelled, and the trainer rolls back to its :class:`Anchor` (the initial weights,
the latest checkpoint it wrote, or the latest copy it gathered by itself as
:class:`AnchorPolicy` allows), sends it again and replays the steps since. Every
step is a pure function of the previous state, the step's batch and its seeds, so the
replayed run ends with the same weights, bit for bit, as one that never lost a worker.

A worker its nanny restarts for memory (above ``distributed.worker.memory.terminate``
of its limit) is not routine: dfdl plans every task to end under
:data:`dfdl.plan.estimate.HEADROOM` of the workers' limit, so memory outside the plan
filled it. When such a restart loses data, training stops with a
:func:`memory_restart_error` naming the worker, its limit and what to do; when Dask
rebuilt everything, the run goes on and the restart is logged as a warning.

Example:
    >>> from distributed.client import FutureCancelledError
    >>> is_lost_data(FutureCancelledError("k", reason="lost dependencies"))
    True
    >>> is_lost_data(ValueError("a bug"))
    False
"""

from __future__ import annotations

import time
from concurrent.futures import CancelledError
from dataclasses import dataclass

import dask
import numpy as np
from dask.utils import format_bytes
from distributed.comm.core import CommClosedError

from dfdl.errors import TrainingError
from dfdl.taskgraph.exchange import PeerLostError

#: rollbacks one ``dfdl.train`` call makes before it gives up; each one needs a worker
#: to die again, so more than a few means the cluster itself is failing
MAX_ROLLBACKS = 5

#: seconds to wait for at least one worker after a loss (a nanny restarts a killed
#: worker within seconds; a job queue may take longer to replace a node)
WORKER_WAIT_S = 300.0


#: the topic of the event a nanny logs when it restarts its worker for memory
MEMORY_RESTART_TOPIC = "worker-restart-memory"

#: seconds to wait for a nanny's restart event after data was lost (the nanny logs it
#: in the background while it terminates the worker)
MEMORY_EVENT_WAIT_S = 1.0


def is_lost_data(exc: BaseException) -> bool:
    """Whether ``exc`` means data died with a worker (as opposed to a failing task),
    or a worker's share of a step lost the worker it was exchanging values with."""
    return isinstance(exc, (CancelledError, CommClosedError, PeerLostError))


@dataclass
class Anchor:
    """A step the trainer can restart from: the carried tensors after ``step`` steps,
    held on the client (the initial values, then each checkpoint as it is written)."""

    step: int
    arrays: dict[str, np.ndarray]


def wait_for_workers(client, timeout: float = WORKER_WAIT_S) -> None:
    """Block until the cluster has a running worker again, or raise TrainingError."""
    try:
        client.wait_for_workers(1, timeout=timeout)
    except TimeoutError:
        raise TrainingError(
            f"every worker was lost and none came back within {timeout:.0f} s; training "
            "stopped. Restart the workers and resume from the latest checkpoint "
            "(resume=True with checkpoint_dir)."
        ) from None


def rollback_error(exc: BaseException, rollbacks: int) -> TrainingError:
    """The error once workers have been lost more often than :data:`MAX_ROLLBACKS`."""
    return TrainingError(
        f"workers were lost {rollbacks} times during this run (last: {exc}); training "
        "stopped. Check the workers' logs for why they die (memory limits, node "
        "failures), then resume from the latest checkpoint (resume=True)."
    )


class MemoryRestarts:
    """The workers that nannies restarted for memory since this object was made.

    Example:
        >>> restarts = MemoryRestarts(client)  # doctest: +SKIP
        >>> restarts.new()  # doctest: +SKIP
        [{'worker': 'tcp://127.0.0.1:40211', 'pid': 4312, 'rss': 514215936}]
    """

    def __init__(self, client):
        self.client = client
        self.seen = {_event_key(e) for e in self._events()}
        self.limits = {
            addr: int(w.get("memory_limit") or 0)
            for addr, w in client.scheduler_info()["workers"].items()
        }

    def _events(self) -> list[dict]:
        try:
            events = self.client.get_events(MEMORY_RESTART_TOPIC)
        except Exception:  # noqa: BLE001 - a scheduler that cannot answer: none known
            return []
        return [dict(msg) for _, msg in events if isinstance(msg, dict)]

    def new(self, wait: float = 0.0) -> list[dict]:
        """Restart events not seen before, waiting up to ``wait`` seconds for one; each
        is returned once, with the worker's ``memory_limit`` added where known."""
        deadline = time.monotonic() + wait
        while True:
            found = [e for e in self._events() if _event_key(e) not in self.seen]
            if found or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        self.seen.update(_event_key(e) for e in found)
        for e in found:
            e.setdefault("memory_limit", self.limits.get(e.get("worker"), 0))
        return found


def _event_key(event: dict) -> tuple:
    return event.get("worker"), event.get("pid")


def describe_memory_restart(event: dict) -> str:
    """``"worker tcp://... (memory limit 512.00 MiB) was restarted by its nanny at 96%
    of its limit (492.00 MiB resident)"``.

    Example:
        >>> text = describe_memory_restart(
        ...     {"worker": "tcp://w:1", "rss": 492 * 2**20, "memory_limit": 512 * 2**20})
        >>> text.split(" was ")[1]
        'restarted by its nanny at 96% of its limit (492.00 MiB resident)'
    """
    limit = int(event.get("memory_limit") or 0)
    rss = int(event.get("rss") or 0)
    terminate = dask.config.get("distributed.worker.memory.terminate", 0.95)
    at = f"{rss / limit:.0%} of its limit" if limit else f"its terminate line ({terminate})"
    return (
        f"worker {event.get('worker')} (memory limit "
        f"{format_bytes(limit) if limit else 'unknown'}) was restarted by its nanny at {at} "
        f"({format_bytes(rss)} resident)"
    )


#: what to do about a worker restarted for memory
MEMORY_RESTART_ADVICE = (
    "dfdl plans each task to end under 90% of the workers' memory limit and pauses the "
    "workers at their spill line, so memory outside the plan filled the worker: another "
    "program or Dask work on the same workers, a worker with more threads than the plan "
    "was made for, or an estimate that is too low. Give the workers more memory "
    "(memory_limit), keep other work off them, and resume from the latest checkpoint "
    "(resume=True with checkpoint_dir); if it happens again, report it with the "
    "worker's log."
)


def memory_restart_error(events: list[dict], killed_task=None) -> TrainingError:
    """The error when workers restarted for memory lost data training needs
    (``killed_task``: the key of Dask's ``KilledWorker``, when it gave up on a task)."""
    what = "; ".join(describe_memory_restart(e) for e in events)
    if killed_task is not None:
        what += f"; {describe_key(killed_task)} was running on every worker that died"
    return TrainingError(f"{what}; training stopped. {MEMORY_RESTART_ADVICE}")


class AnchorPolicy:
    """When the trainer gathers the carried tensors to the client as a new anchor.

    Gathering costs a pause of the pipeline and a transfer of every weight, so anchors
    are taken only when the time since the last one is at least ``1 / overhead`` times
    what the last one cost (at most ``overhead`` of the run, 5% by default), and the
    first one after ``first_after`` seconds. The dask config keys
    ``dfdl.recovery.anchor-overhead`` and ``dfdl.recovery.first-anchor-s`` set both
    (an overhead of 0 turns self-taken anchors off; checkpoints are anchors anyway).

    Example:
        >>> policy = AnchorPolicy(overhead=0.5, first_after=0.0)
        >>> policy.due()
        True
        >>> policy.taken(cost=10.0)
        >>> policy.due()  # the next one after 10 / 0.5 = 20 s
        False
    """

    def __init__(self, overhead: float | None = None, first_after: float | None = None):
        if overhead is None:
            overhead = dask.config.get("dfdl.recovery.anchor-overhead", 0.05)
        if first_after is None:
            first_after = dask.config.get("dfdl.recovery.first-anchor-s", 60.0)
        self.overhead = float(overhead)
        self.wait = float(first_after)
        self.t_last = time.perf_counter()

    def due(self) -> bool:
        """Whether an anchor should be taken now."""
        return self.overhead > 0 and time.perf_counter() - self.t_last >= self.wait

    def taken(self, cost: float) -> None:
        """Record an anchor that took ``cost`` seconds."""
        self.t_last = time.perf_counter()
        self.wait = cost / self.overhead if self.overhead > 0 else float("inf")


#: the phases in dfdl task names (``f"{node}-{phase}[-partial|-sum...]-{token}"``)
PHASES = ("fwd", "loss", "bwd", "update", "recompute")


def describe_key(key) -> str:
    """``"node 'conv1' (bwd) of step 3"`` for a dfdl task key, else the key itself.

    Example:
        >>> describe_key(("layers.1-fwd-partial-0123abcd", 1, 0, 0, 2))
        "node 'layers.1' (fwd, partial) of step 1"
    """
    if not (isinstance(key, tuple) and key and isinstance(key[0], str)):
        return f"task {key!r}"
    parts = key[0].rsplit("-", 1)[0].split("-")  # without the run's token
    at = next((i for i in range(len(parts) - 1, 0, -1) if parts[i] in PHASES), None)
    if at is None:  # data movement: f"{tensor}-{input|rechunk|ready|const...}"
        at = len(parts) - 1 if len(parts) > 1 else None
    if at is None:
        return f"task {key!r}"
    node, what = "-".join(parts[:at]), ", ".join(parts[at:])
    step = f" of step {key[1]}" if len(key) > 1 and isinstance(key[1], int) else ""
    return f"node {node!r} ({what}){step}"


def killed_worker_error(exc) -> TrainingError:
    """A TrainingError for Dask's ``KilledWorker``: a task whose workers all died."""
    return TrainingError(
        f"{describe_key(exc.task)} was running on {exc.allowed_failures + 1} workers that "
        f"all died (the last: {exc.last_worker.address}); training stopped. A task that "
        "kills every worker it runs on usually needs more memory than a worker has (the "
        "nanny restarts workers above distributed.worker.memory.terminate) or crashed in "
        "native code: read the workers' logs, give the workers more memory (dfdl plans "
        "tiles for the workers' memory_limit), then resume from the latest checkpoint "
        "(resume=True)."
    )
