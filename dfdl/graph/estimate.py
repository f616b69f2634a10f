"""Pre-flight memory estimate of a plan: working set, peak per worker, spilled bytes.

The *working set* of a training step is what must exist at once for the step to finish
without recomputation: the carried tensors (weights, optimizer state, buffers), the
batch, the forward activations the backward pass reads, and the weights' gradients.
(An inference pass has no backward: its working set is every tensor it makes, an upper
bound, since Dask frees a tile once its consumers are done.)

On ``workers`` worker processes with a memory limit each, Dask keeps up to ``target``
(``distributed.worker.memory.target``, 0.6 by default) of the limit in memory and
spills tiles beyond it to disk. The estimate spreads the working set evenly over the
workers, so the tile memory a worker holds at its peak is its share, capped at
``target * limit``, plus the memory of the tasks it runs at once; the bytes beyond
the workers' capped shares are spilled (written once, read back once) every step.
The worker process's own footprint (the interpreter, libraries: about 150-250 MB) comes
on top and is not part of the estimate.

Example:
    >>> est = estimate_memory(plan, workers=2)  # doctest: +SKIP
    >>> est.peak_per_worker                     # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

#: Dask's default ``distributed.worker.memory.target``
DASK_TARGET = 0.6


@dataclass(frozen=True)
class MemoryEstimate:
    """What :func:`estimate_memory` predicts, in bytes."""

    working_set: int
    peak_per_worker: int
    spilled_per_step: int
    workers: int
    memory_limit: int | None

    def lines(self) -> list[str]:
        from dfdl.graph.tiling import format_bytes

        if self.memory_limit:
            times = self.working_set / (self.workers * self.memory_limit)
            where = f"{times:.1f}x the {self.workers} worker(s)' limits of "
            where += f"{format_bytes(self.memory_limit)}"
        else:
            where = f"{self.workers} worker(s), no memory limit"
        return [
            f"working set: {format_bytes(self.working_set)} ({where})",
            f"predicted peak tile memory per worker: {format_bytes(self.peak_per_worker)} "
            "(above the worker process's own footprint)",
            f"predicted bytes spilled per step: {format_bytes(self.spilled_per_step)}",
        ]


def node_flops(node, types: Mapping) -> int:
    """Forward FLOPs of one node from static shapes: two per multiply-add for Gemm,
    MatMul, Conv and ConvTranspose, one per output element for any other op.

    Example:
        >>> sum(node_flops(n, plan.graph.types) for n in plan.graph.nodes)  # doctest: +SKIP
    """

    def shape(name: str) -> tuple[int, ...]:
        return tuple(types[name].shape)

    out = math.prod(shape(node.outputs[0])) if node.outputs and node.outputs[0] else 0
    op = node.op_type if not node.domain else ""
    if op == "Gemm":
        a = shape(node.inputs[0])
        return 2 * out * (a[0] if node.attrs.get("transA", 0) else a[1])
    if op == "MatMul":
        return 2 * out * shape(node.inputs[0])[-1]
    if op == "Conv":
        return 2 * out * math.prod(shape(node.inputs[1])[1:])
    if op == "ConvTranspose":
        return 2 * math.prod(shape(node.inputs[0])) * math.prod(shape(node.inputs[1])[1:])
    return out


def working_set(plan) -> int:
    """Bytes that must coexist for one pass of the plan (see the module docstring).

    With recomputation (:mod:`dfdl.graph.recompute`) the checkpoints count, and of the
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
    target: float = DASK_TARGET,
) -> MemoryEstimate:
    """Predict working set, peak tile memory per worker and bytes spilled per step.

    Args:
        plan: a :class:`~dfdl.graph.tiling.Plan`.
        workers: worker processes.
        threads_per_worker: tasks one worker runs at once.
        memory_limit: bytes per worker (default: the plan's).
        target: share of the limit Dask keeps in memory before spilling.

    Example:
        >>> estimate_memory(plan, workers=2, memory_limit=2**30).spilled_per_step  # doctest: +SKIP
    """
    limit = memory_limit if memory_limit is not None else plan.memory_limit
    ws = working_set(plan)
    share = ws / max(1, workers)
    if limit:
        share = min(share, target * limit)
    peak = int(share + threads_per_worker * plan.peak_task()[1])
    spilled = max(0, int(ws - workers * target * limit)) if limit else 0
    return MemoryEstimate(ws, peak, spilled, workers, limit)
