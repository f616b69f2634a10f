"""Pre-flight memory estimate of a plan: working set, peak per worker, spilled bytes.

The *working set* of a training step (:func:`working_set`) is what must exist at once
for it to finish without recomputation: the carried tensors (weights, optimizer state,
buffers), the batch, the forward activations the backward pass reads, and the weights'
gradients (an inference pass: every tensor it makes, an upper bound). On ``workers``
processes, :func:`estimate_memory` spreads it evenly: a worker's peak is its share,
capped at Dask's ``target`` of the limit, plus the tasks it runs at once, and the bytes
beyond the capped shares are spilled (written once, read back once) every step.

When Dask's process-memory thresholds are on (spill 0.7, pause 0.8, restart 0.95 of
the limit, on resident memory), the limit bounds the whole process, so its own
*footprint* (:data:`DEFAULT_FOOTPRINT`, or dask config ``dfdl.memory.worker-footprint``)
counts too, and the planner keeps one task within :data:`HEADROOM` - ``pause`` of the
limit (:func:`task_budget`, :func:`start_line`). Guarantee: a plan that fits keeps a
worker's estimated peak under :data:`HEADROOM` of its limit, below Dask's restart
threshold. dfdl's own clusters pause at the spill line
(:func:`dfdl.runtime.cluster.pause_at_spill`) and :func:`dfdl.train` reads the
thresholds from the workers; with them off the limit bounds only the tiles Dask
manages, and the footprint is 0.

Example:
    >>> task_budget(2**30, 0, 0.25) // 2**20
    256
    >>> format_bytes(3 * 2**20)
    '3.0 MiB'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dask.utils import parse_bytes

from dfdl.plan.scoped_config import config_get

#: Dask's default ``distributed.worker.memory.target``
DASK_TARGET = 0.6
#: resident memory of an idle dfdl worker process with its kernels loaded (Linux x86-64,
#: Python 3.11: 200-215 MiB measured after one training step; ``dfdl.memory.worker-footprint``
#: in dask config overrides it)
DEFAULT_FOOTPRINT = 224 * 2**20
#: share of the limit a worker's planned peak stays under: below Dask's restart
#: threshold (0.95), with room for what the estimate does not count (transfer buffers)
HEADROOM = 0.9
#: Dask's default ``distributed.worker.memory.spill``
DASK_SPILL = 0.7


def format_bytes(n: int) -> str:
    """Bytes for people: ``format_bytes(3 * 2**20) == "3.0 MiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def process_limited() -> bool:
    """Whether Dask's process-memory thresholds are on in this process's dask config, so
    that a worker's memory limit bounds its whole resident memory (see the module
    docstring).

    Example:
        >>> with dask.config.set({"distributed.worker.memory.terminate": False,
        ...                       "distributed.worker.memory.pause": False,
        ...                       "distributed.worker.memory.spill": False}):
        ...     process_limited()
        False
    """
    keys = ("spill", "pause", "terminate")
    return any(config_get(f"distributed.worker.memory.{k}", 0.9) for k in keys)


def managed_target() -> float:
    """Dask's ``distributed.worker.memory.target`` (share of the limit kept in memory)."""
    t = config_get("distributed.worker.memory.target", DASK_TARGET)
    return float(t) if t else 1.0


def spill_threshold() -> float:
    """Share of the limit where Dask spills on process memory (``...memory.spill``; the
    managed target when that is off)."""
    s = config_get("distributed.worker.memory.spill", DASK_SPILL)
    return float(s) if s else managed_target()


def start_line() -> float:
    """Share of the limit below which a worker still starts tasks: Dask's pause threshold
    (``...memory.pause``), at least the spill line; the spill line when pausing is off.

    Example:
        >>> with dask.config.set({"distributed.worker.memory.spill": 0.7,
        ...                       "distributed.worker.memory.pause": 0.8}):
        ...     start_line()
        0.8
    """
    pause = config_get("distributed.worker.memory.pause", 0.8)
    return max(spill_threshold(), float(pause)) if pause else spill_threshold()


def worker_footprint() -> int:
    """The worker process's own resident bytes counted against its limit: dask config
    ``dfdl.memory.worker-footprint`` (bytes or a string like ``"300MiB"``), else
    :data:`DEFAULT_FOOTPRINT`, when :func:`process_limited`; else 0.

    Example:
        >>> with dask.config.set({"dfdl.memory.worker-footprint": "300MiB"}):
        ...     worker_footprint() // 2**20 if process_limited() else 300
        300
    """
    if not process_limited():
        return 0
    value = config_get("dfdl.memory.worker-footprint", None)
    if value is None:
        return DEFAULT_FOOTPRINT
    return int(parse_bytes(value) if isinstance(value, str) else value)


def task_budget(memory_limit: int, footprint: int, fraction: float) -> int:
    """Bytes one task may use on a worker with ``memory_limit``: ``fraction`` of it, and
    with a ``footprint`` (process thresholds on) at most :data:`HEADROOM` - the
    :func:`start_line` of it, so that a task started just below the pause line ends
    under the headroom. (dfdl's clusters pause at the spill line:
    :func:`dfdl.runtime.cluster.pause_at_spill`.)

    Example:
        >>> task_budget(2**30, 0, 0.25) // 2**20
        256
        >>> with dask.config.set({"distributed.worker.memory.spill": 0.7,
        ...                       "distributed.worker.memory.pause": 0.7}):
        ...     task_budget(2**30, 224 * 2**20, 0.25) // 2**20
        204
    """
    if footprint:
        fraction = min(fraction, HEADROOM - start_line())
    return int(fraction * memory_limit)


def smallest_limit(need: int, footprint: int, fraction: float) -> int:
    """The smallest memory limit whose :func:`task_budget` holds a task of ``need`` bytes
    and, with a ``footprint``, keeps footprint + one such task under the spill threshold.

    Example:
        >>> smallest_limit(2**28, 0, 0.25) // 2**20
        1024
    """
    if footprint:
        fraction = min(fraction, HEADROOM - start_line())
    smallest = math.ceil(need / fraction)
    if footprint:
        smallest = max(smallest, math.ceil((need + footprint) / spill_threshold()))
    return smallest


@dataclass(frozen=True)
class MemoryEstimate:
    """What :func:`estimate_memory` predicts, in bytes."""

    working_set: int
    peak_per_worker: int
    spilled_per_step: int
    workers: int
    memory_limit: int | None
    footprint: int = 0  # the worker process's own, included in peak_per_worker

    def lines(self) -> list[str]:
        if self.memory_limit:
            times = self.working_set / (self.workers * self.memory_limit)
            where = f"{times:.1f}x the {self.workers} worker(s)' limits of "
            where += f"{format_bytes(self.memory_limit)}"
        else:
            where = f"{self.workers} worker(s), no memory limit"
        return [
            f"working set: {format_bytes(self.working_set)} ({where})",
            f"predicted peak memory per worker: {format_bytes(self.peak_per_worker)} "
            + (
                f"(with the worker process's own {format_bytes(self.footprint)})"
                if self.footprint
                else "(tiles and tasks; Dask's process-memory thresholds are off)"
            ),
            f"predicted bytes spilled per step: {format_bytes(self.spilled_per_step)}",
        ]


def working_set(plan) -> int:
    """Bytes that must coexist for one pass of the plan (see the module docstring).

    With recomputation (:mod:`dfdl.training.passes.recompute`) the checkpoints count, and of the
    recomputed activations only the largest segment's: one segment is rebuilt at a time.
    """
    g = plan.graph
    producer = {o: n for n in g.nodes for o in n.outputs if o}
    phases = {n.phase for n in g.nodes}
    if "bwd" not in phases:  # inference: every tensor, an upper bound
        names = set(g.inputs) | set(producer) | set(g.initializers)
        return sum(g.types[n].nbytes for n in names if n in g.types)
    needed = set(g.inputs)  # carried tensors and the batch
    rebuilt: dict[tuple, set[str]] = {}
    for node in g.nodes:
        for name in node.inputs:
            src = producer.get(name)
            if src is None:
                continue
            if node.phase in ("bwd", "recompute") and src.phase in ("fwd", "loss"):
                needed.add(name)  # an activation (or checkpoint) kept for the backward pass
            if node.phase == "bwd" and src.phase == "recompute":
                rebuilt.setdefault(tuple(src.after), set()).add(name)
            if node.phase == "update" and src.phase == "bwd":
                needed.add(name)  # a weight's gradient
    total = sum(g.types[n].nbytes for n in needed if n in g.types)
    return total + max((sum(g.types[n].nbytes for n in s) for s in rebuilt.values()), default=0)


def estimate_memory(
    plan,
    workers: int,
    *,
    threads_per_worker: int = 1,
    memory_limit: int | None = None,
    target: float | None = None,
    footprint: int | None = None,
) -> MemoryEstimate:
    """Predict working set, peak memory per worker and bytes spilled per step.

    Args:
        plan: a :class:`~dfdl.plan.tiling.Plan`.
        workers: worker processes.
        threads_per_worker: tasks one worker runs at once.
        memory_limit: bytes per worker (default: the plan's).
        target: share of the limit Dask keeps in memory before spilling (default:
            dask config ``distributed.worker.memory.target``).
        footprint: the worker process's own bytes (default: the plan's, which is
            :func:`worker_footprint` when it was planned for a limit).

    Example:
        >>> estimate_memory(plan, workers=2, memory_limit=2**30).spilled_per_step  # doctest: +SKIP
    """
    limit = memory_limit if memory_limit is not None else plan.memory_limit
    target = managed_target() if target is None else target
    if footprint is None:
        footprint = getattr(plan, "footprint", 0) if limit else 0
    ws = working_set(plan)
    resident = ws / max(1, workers)
    if limit:
        resident = min(resident, target * limit)
    resident += footprint
    if limit and footprint:  # Dask spills when the process passes the spill threshold
        resident = min(resident, spill_threshold() * limit)
    peak = int(resident + threads_per_worker * plan.peak_task()[1])
    spilled = max(0, int(ws - workers * target * limit)) if limit else 0
    return MemoryEstimate(ws, peak, spilled, workers, limit, footprint)
