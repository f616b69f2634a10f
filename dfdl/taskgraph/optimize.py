"""The task-graph optimizer: one pass over a lowered submission, with explicit options.

:func:`dfdl.taskgraph.lower.lower` makes one Dask task per node tile. Every task costs
the scheduler and the worker milliseconds, and every dependency a round trip between
them, so before a submission goes to the cluster :func:`optimize` groups tasks where
that cannot change a value and the plan allows it:

1. Fusion (:mod:`dfdl.taskgraph.fuse`): a task whose one reader is a single task runs
   inside it; light tasks, tiny merges and partials follow the finer rules of
   :class:`~dfdl.taskgraph.fuse.FuseRules`. Only where every step's plan ``fits``
   (:class:`dfdl.plan.compile.StepPlan`): a fused task holds its members' inputs until it
   runs, which a plan sized to a per-task memory budget does not count.
2. On a cluster of one worker process, where tiles never move: each training step runs
   as one task (:mod:`dfdl.taskgraph.step_tasks`); where a step cannot (its tasks would
   pass the step budget, or steps would form a cycle), siblings run in gangs and chains
   (:mod:`dfdl.taskgraph.gang`). On several processes, each worker's share of a step
   (:mod:`dfdl.taskgraph.partition`: its batch shard, slab or weight shard) runs as one
   task per stage between exchanges, pinned to that worker by the trainer
   (:func:`worker_restrictions`).
3. Always: data nodes run inside the tasks that read them (:func:`~dfdl.taskgraph.fuse.
   inline_data`) and large task bodies are pickled once (:mod:`dfdl.taskgraph.pack`).

Every choice is a field of :class:`GraphOptions`; the defaults are the measured best
(``docs/design/``), and ``bench/ab.py`` measures one field against another.

Example:
    >>> dsk = optimize(dsk, keep, plans, token=token, nthreads=lambda: [2])  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from dfdl.ops import lookup
from dfdl.plan.compile import StepPlan
from dfdl.plan.estimate import DASK_TARGET
from dfdl.plan.tiling import TASK_MEMORY_FRACTION
from dfdl.taskgraph import gang, partition, step_tasks
from dfdl.taskgraph.fuse import (
    LIGHT_BYTES,
    TINY_BYTES,
    FuseRules,
    fuse_into_consumers,
    inline_data,
)
from dfdl.taskgraph.lower import task_name
from dfdl.taskgraph.pack import pack_bodies


@dataclass(frozen=True)
class GraphOptions:
    """The task-graph optimizer's choices (all on: the measured best).

    Attributes:
        fuse: group tasks at all (fusion, step tasks, gangs) where the plans fit.
        rules: fusion's finer rules (:class:`~dfdl.taskgraph.fuse.FuseRules`).
        step_tasks: on one worker process, each training step as one task.
        gangs: on one worker process, gangs and chains where a step cannot be one task.
        inline_data: data nodes run inside the tasks that read them.
        pack: large task bodies are pickled once when the graph is built.
        steps_per_task: with step tasks, how many consecutive steps of a submission
            (from its first step on) run as one task (None: ``dfdl.train`` takes its
            ``unroll`` on a GPU worker and on several processes, else 1): on a GPU
            worker, whose steps take milliseconds, a step task per step would wait for a
            scheduler round trip between steps; on several worker processes exchanging
            directly, one share per worker of those steps, so a worker starts the next
            step's layers as soon as their weights are updated, not once the previous
            step ended everywhere.
        worker_tasks: on several worker processes, each worker's share of a step
            (:mod:`dfdl.taskgraph.partition`) runs as one task per stage between
            exchanges with the other workers (:func:`~dfdl.taskgraph.step_tasks.group_steps`
            with ``place``).
        exchange: with ``worker_tasks``, and where the workers' addresses are known,
            what one worker's tiles read from another's in the same step passes
            between them directly (:mod:`dfdl.taskgraph.exchange`): one task per worker
            and step; otherwise a task per stage between exchanges.
        programs: a submitted group of steps is compiled once per shape into one task
            and later groups of that shape reuse it (:mod:`dfdl.taskgraph.program`):
            on a GPU worker building each step's graph would set the pace.
    """

    fuse: bool = True
    rules: FuseRules = FuseRules()
    step_tasks: bool = True
    gangs: bool = True
    inline_data: bool = True
    pack: bool = True
    steps_per_task: int | None = None
    worker_tasks: bool = True
    exchange: bool = True
    programs: bool = False


def optimize(
    dsk: dict,
    keep: Collection[Hashable],
    plans: Iterable[StepPlan],
    *,
    token: str,
    nthreads: Callable[[], Sequence[int] | Mapping[str, int]],
    options: GraphOptions = GraphOptions(),
) -> dict:
    """The submission ``dsk`` with its tasks grouped (see the module docstring).

    Args:
        dsk: the lowered graph of one submission (``dask.task_spec`` nodes).
        keep: the requested keys (each stays a key with the same value).
        plans: the step plans the graph was lowered from (for the size of each node's
            tasks and which ops are contractions).
        token: the run token in the graph's keys (:func:`dfdl.taskgraph.lower.new_token`).
        nthreads: called once, only if tasks are grouped: each worker process's threads
            (by address: then values may pass between workers directly).
        options: which groupings apply.

    Returns:
        A graph with the same requested keys and values.
    """
    plans = list(plans)
    keep = list(keep)
    if options.fuse and all(sp.fits for sp in plans):
        roster = nthreads()
        threads = list(roster.values() if isinstance(roster, Mapping) else roster)
        peers = list(roster) if isinstance(roster, Mapping) and options.exchange else None
        one_worker = len(threads) == 1
        tiny = _tiny_outputs(plans, token)
        parts = None if one_worker else partition.tile_parts(plans, token, len(threads))
        dsk = fuse_into_consumers(
            dsk,
            keep=keep,
            stays=_contractions(plans, token),
            light=_light(plans, token),
            small=_small_contractions(plans, token),
            # one worker process only: elsewhere each reader would fetch every tile's
            # packed output (activation and partial) instead of one merge fetching them
            tiny=tiny if one_worker else None,
            rules=options.rules,
            # several: no tile's work fused into a task of another worker (a merge)
            place=parts if options.worker_tasks else None,
        )
        grouped = None
        if options.step_tasks and one_worker:
            grouped = step_tasks.group_steps(
                dsk,
                keep=keep,
                name=_group_name(dsk, token, options.steps_per_task),
                weight=_task_memory(plans, token),
                budget=_step_budget(plans),
            )
        elif options.worker_tasks and not one_worker:
            budget = _step_budget(plans)
            placed, place = partition.replicate_merges(dsk, keep, parts, tiny)
            direct = peers if max(threads) == 1 else None
            # direct exchange only: with stages, two steps' shares would form cycles
            per_task = options.steps_per_task if direct else 1
            grouped = step_tasks.group_steps(
                placed,
                keep=keep,
                name=_group_name(placed, token, per_task),
                weight=_task_memory(plans, token),
                budget=None if budget is None else budget * len(threads),
                place=place,
                parts=len(threads),
                strip=lambda k: partition.stripped(k, token),
                serial=max(threads) == 1,
                peers=direct,
            )
        if grouped is not None:
            dsk = grouped
        elif options.gangs and one_worker:
            dsk = gang.gang_siblings(
                dsk,
                keep=keep,
                width=threads[0],
                fits=_gang_fits(plans, token),
                joins=_tiny_outputs(plans, token),
                weight=_task_memory(plans, token),
                budget=_chain_budget(plans, threads[0]),
            )
    if options.inline_data:
        dsk = inline_data(dsk, keep=keep)
    if options.pack:
        dsk = pack_bodies(dsk)
    return dsk


def _group_name(dsk: Mapping, token: str, per_task: int | None) -> Callable:
    """The key name of step ``s``'s task: ``(f"train-step-{token}", first)``, ``first``
    the first step of its group of ``per_task`` consecutive steps, counted from the
    submission's first step (a submission may start anywhere: after a checkpoint, a
    validation; two submissions' groups never share a key).

    Example:
        >>> name = _group_name({("a", 5, 0): None, ("a", 6, 0): None}, "ab12cd34", 4)
        >>> name(5), name(8), name(9)
        (('train-step-ab12cd34', 5), ('train-step-ab12cd34', 5), ('train-step-ab12cd34', 9))
    """
    per_task = max(1, per_task or 1)
    first = min(
        (k[1] for k in dsk if isinstance(k, tuple) and len(k) > 1 and type(k[1]) is int),
        default=0,
    )
    return lambda s: (
        task_name(step_tasks.STEP_NAME, token),
        s - (s - first) % per_task,
    )


def _node_tasks(plans: list[StepPlan], token: str, pick: Callable) -> Callable:
    """Whether a task key is a tile task (or partial) of a node for which
    ``pick(op, node, plan)`` holds."""
    names = set()
    for sp in plans:
        for n in sp.plan.graph.nodes:
            op = lookup(n.op_type, n.domain)
            if op is not None and pick(op, n, sp.plan):
                base = f"{n.name}-{n.phase}"
                names |= {task_name(base, token), task_name(f"{base}-partial", token)}
    return lambda key: isinstance(key, tuple) and key[0] in names


def _contractions(plans, token: str) -> Callable:
    """Whether a task key is a contraction's tile task (never fused, dfdl.taskgraph.fuse)."""
    return _node_tasks(plans, token, lambda op, n, plan: op.contraction)


def _within_light_bytes(n, plan) -> bool:
    """Whether node ``n``'s largest tile task reads and writes at most ``LIGHT_BYTES``."""
    return plan.task_bytes.get(n.name, LIGHT_BYTES + 1) <= LIGHT_BYTES


def _small_contractions(plans, token: str) -> Callable:
    """Whether a task key is a contraction's tile task whose tile reads and writes at
    most ``LIGHT_BYTES``: it may run inside a light consumer (:mod:`dfdl.taskgraph.fuse`)."""
    return _node_tasks(
        plans, token, lambda op, n, plan: op.contraction and _within_light_bytes(n, plan)
    )


def _light(plans, token: str) -> Callable:
    """Whether a task key is a light tile task: not a contraction, and its node's largest
    tile reads and writes at most ``LIGHT_BYTES`` (:mod:`dfdl.taskgraph.fuse`)."""
    return _node_tasks(
        plans, token, lambda op, n, plan: not op.contraction and _within_light_bytes(n, plan)
    )


def _gang_fits(plans, token: str) -> Callable:
    """Whether a task key is a tile task whose node's tiles read and write at most
    ``LIGHT_BYTES``: it may run in a gang (:mod:`dfdl.taskgraph.gang`)."""
    return _node_tasks(plans, token, lambda op, n, plan: _within_light_bytes(n, plan))


def _tiny_outputs(plans, token: str) -> Callable:
    """Whether a task key is a tile task of a node whose largest output tile is at most
    ``TINY_BYTES`` (per-channel sums: :mod:`dfdl.taskgraph.fuse` runs a merge of them
    inside its readers)."""
    return _node_tasks(
        plans,
        token,
        lambda op, n, plan: plan.output_bytes.get(n.name, TINY_BYTES + 1) <= TINY_BYTES,
    )


def _task_memory(plans, token: str) -> Callable:
    """Bytes a task uses (its node's largest tile task, ``Plan.task_memory``)."""
    sizes: dict = {}
    for sp in plans:
        for n in sp.plan.graph.nodes:
            b = sp.plan.task_memory.get(n.name, 0)
            base = f"{n.name}-{n.phase}"
            for name in (task_name(base, token), task_name(f"{base}-partial", token)):
                sizes[name] = max(sizes.get(name, 0), b)
    return lambda key: sizes.get(key[0], 0) if isinstance(key, tuple) else 0


def _memory_limit(plans) -> int | None:
    """The smallest worker memory limit the plans were made for (None: no limit)."""
    return min((sp.plan.memory_limit for sp in plans if sp.plan.memory_limit), default=None)


def _chain_budget(plans, threads: int) -> int | None:
    """The most bytes the tasks of one chain of gangs may use (:mod:`dfdl.taskgraph.gang`):
    what the planner grants the tasks running at once on one worker's threads."""
    limit = _memory_limit(plans)
    return None if limit is None else int(limit * TASK_MEMORY_FRACTION * threads)


def _step_budget(plans) -> int | None:
    """The most bytes the tasks of one step task may use (:mod:`dfdl.taskgraph.step_tasks`):
    the worker's memory up to Dask's spill target, which the plan's estimate of the
    whole step already had to fit for the optimizer to group at all."""
    limit = _memory_limit(plans)
    return None if limit is None else int(limit * DASK_TARGET)


def worker_restrictions(
    dsk: Mapping[Hashable, object], token: str, addresses: Sequence[str]
) -> dict[Hashable, list[str]]:
    """The worker of each per-worker step task of an optimized graph: the task of part
    ``p`` (its key ``(name, step, p, stage)``) goes to ``addresses[p]``, and so do the
    tasks that read only that task (the values taken out of its outputs).

    Example:
        >>> worker_restrictions({("train-step-ab12cd34", 0, 1, 0): None}, "ab12cd34",
        ...                     ["tcp://a:1", "tcp://b:2"])
        {('train-step-ab12cd34', 0, 1, 0): ['tcp://b:2']}
    """
    name = task_name(step_tasks.STEP_NAME, token)
    placed = {
        k: [addresses[k[2]]]
        for k in dsk
        if isinstance(k, tuple) and len(k) == 4 and k[0] == name and k[2] < len(addresses)
    }
    # a value taken out of a step task's outputs is taken where they are: elsewhere the
    # whole tuple would travel
    for k, node in dsk.items():
        deps = getattr(node, "dependencies", ())
        if k not in placed and len(deps) == 1:
            (d,) = deps
            if d in placed:
                placed[k] = placed[d]
    return placed
