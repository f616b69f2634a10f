"""Gangs and chains: a level's sibling tile tasks run as one Dask task, side by side on
threads, and successive gangs run one after another in that same task.

On a cluster of one worker process, the task-graph optimizer
(:mod:`dfdl.taskgraph.optimize`) runs each training step as one task
(:mod:`dfdl.taskgraph.step_tasks`); gangs and chains are its fallback where a step cannot
be one task (its tasks would pass the step's byte budget, or steps would form a cycle
with the tasks outside them). Measured there, they still win: ResNet's step with step
tasks off ran 0.708 s with gangs against 0.808 s without (``docs/design/
gangs-and-chains.md``).

Contract (:func:`gang_siblings`): the same requested keys with the same values, fewer
tasks. A *gang* is one task running sibling tiles at once (same node, phase, step and
topological level, none requested, all light, at most ``width``), one on the task's own
thread, the others on the worker's helper threads (:func:`run_gang`; :data:`HELPERS`
threads per process, created when first needed, running kernels at the task threads'
nice value). A *chain* runs successive gangs in one task, each reading the one before
from memory, within :data:`MAX_PHASES` gangs and the bytes ``budget``; it follows the
critical path (``critical_path``) and is cut where a task outside it would wait for its
end. A reader outside a gang or chain takes its member's value (``operator.getitem``)
inside its own task. :data:`TRACE` (when a list) records each member's run for the
benchmarks. Only for one worker process: elsewhere members' inputs would all be
fetched to one worker.

Measurements: ``docs/design/gangs-and-chains.md``, ``docs/design/critical-path-chains.md``.

Example:
    >>> from dask.task_spec import Task, TaskRef
    >>> g = {("a", 0, 0): Task(("a", 0, 0), abs, -1), ("a", 0, 1): Task(("a", 0, 1), abs, -2),
    ...      "s": Task("s", max, TaskRef(("a", 0, 0)), TaskRef(("a", 0, 1)))}
    >>> out = gang_siblings(g, keep=["s"], width=2)
    >>> sorted(map(str, out))
    ["('a', 0, 0)", 's']
    >>> out[("a", 0, 0)]({})
    (1, 2)
"""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

from dask.task_spec import Task, TaskRef

from dfdl.taskgraph.fuse import heights, structure
from dfdl.taskgraph.tile_exec import Outputs

#: the most gangs one task runs one after another (:func:`_chains`)
MAX_PHASES = 8
#: helper threads per worker process (the worker preload sets its task threads - 1)
HELPERS = 1
#: name prefix of the helper threads (``bench/cpu_use.py`` counts them as kernels)
THREAD_PREFIX = "dfdl-gang"
#: a list to record every member's run in, ``(key, thread name, start, stop)`` with
#: ``time.time()``, or None: the benchmarks' task streams show a chain as one task
TRACE: list | None = None

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _helpers() -> ThreadPoolExecutor | None:
    global _pool
    with _pool_lock:
        if _pool is None and HELPERS > 0:
            _pool = ThreadPoolExecutor(HELPERS, thread_name_prefix=THREAD_PREFIX)
        return _pool


def gang_siblings(
    dsk: Mapping[Hashable, object],
    keep: Iterable[Hashable],
    width: int,
    fits: Callable[[Hashable], bool] | None = None,
    joins: Callable[[Hashable], bool] | None = None,
    weight: Callable[[Hashable], int] | None = None,
    budget: int | None = None,
    critical_path: bool = True,
) -> dict:
    """The graph with sibling tasks run in gangs and successive gangs in chains (see the
    module docstring).

    Args:
        dsk: a Dask graph of ``dask.task_spec`` nodes, as :mod:`dfdl.taskgraph.fuse`
            leaves it; keys ``(name, step, *tile)`` can be siblings.
        keep: requested keys: never members of a gang.
        width: the most members of a gang (the worker's task threads).
        fits: keys for which it returns False never join a gang (the trainer passes
            the tasks of nodes whose tiles read and write at most ``LIGHT_BYTES``).
        joins: keys of lone tasks, for which it returns True, that may run in a chain
            between two gangs (the trainer passes nodes with tiny outputs).
        weight: bytes a task uses; with ``budget``, the most bytes the tasks of one
            chain may use together.
        budget: see ``weight``; None: no limit.
        critical_path: chains follow the critical path (the gang with the longest path
            to the step's end continues a chain; a reader of the chain's last gang does
            not cut it); False takes gangs in key order.

    Returns:
        A new graph with the same requested keys and values. A chain takes its first
        member's key (in ``str`` order); its value is the tuple of the values of its
        members that tasks outside it read.

    Example:
        >>> gang_siblings({}, keep=[], width=2)
        {}
    """
    keep = set(keep)
    deps, readers, _, level = structure(dsk)
    groups: dict = {}
    for k, node in dsk.items():
        if (
            k in keep
            or type(node) is not Task
            or not isinstance(k, tuple)
            or len(k) < 3
            or (fits is not None and not fits(k))
            or any(type(dsk[r]) is not Task for r in readers[k])
        ):
            continue
        groups.setdefault((k[0], k[1], level[k]), []).append(k)
    slot: dict = {}  # member -> its gang's key
    gangs: dict = {}  # gang key -> members
    for _, members in sorted(groups.items(), key=lambda g: g[0][2]):  # by level
        if not 2 <= len(members) <= width:
            continue
        shared = set.intersection(*(deps[m] for m in members))
        if any(
            d not in shared and d not in slot and type(dsk[d]) is Task
            for m in members
            for d in deps[m]
        ):
            continue  # an input of its own from a lone task: ready at another time
        members.sort(key=str)
        gangs[members[0]] = members
        slot.update(dict.fromkeys(members, members[0]))
    if not gangs:
        return dict(dsk)
    if joins is not None:  # lone tasks that may run between two gangs of a chain
        for k, node in dsk.items():
            if (
                k not in slot
                and k not in keep
                and type(node) is Task
                and joins(k)
                and all(type(dsk[r]) is Task for r in readers[k])
            ):
                gangs[k] = [k]
                slot[k] = k
    chains = {
        c: gs
        for c, gs in _chains(
            dsk, gangs, slot, deps, readers, level, weight, budget, critical_path
        ).items()
        if len(gs) > 1 or len(gangs[c]) > 1
    }
    in_chain = {m: c for c, gs in chains.items() for g in gs for m in gangs[g]}
    exports: dict = {}  # chain -> members read outside it, in order
    subs: dict = {}  # reader outside -> {member: the member's value taken from its chain}
    for c, gs in chains.items():
        exports[c] = []
        for m in (m for g in gs for m in gangs[g]):
            outside = [r for r in readers[m] if in_chain.get(r) != c]
            if outside:
                value = Task(m, operator.getitem, TaskRef(c), len(exports[c]))
                for r in outside:
                    subs.setdefault(r, {})[m] = value
                exports[c].append(m)
    nodes = {k: (v.substitute(subs[k]) if k in subs else v) for k, v in dsk.items()}
    out = {}
    for k, node in nodes.items():
        if k in in_chain and k not in chains:
            continue
        if k in chains:
            phases = tuple(tuple(nodes[m] for m in gangs[g]) for g in chains[k])
            inner = [t for p in phases for t in p]
            own = {t.key for t in inner}
            outside = tuple(sorted({d for t in inner for d in t.dependencies} - own, key=str))
            node = Task(
                k,
                run_gang,
                phases,
                tuple(exports[k]),
                outside,
                *(TaskRef(d) for d in outside),
                _data_producer=any(t.data_producer for t in inner),
            )
        out[k] = node
    return out


def _soon(r, at, readers, level) -> bool:
    """Whether a task ``r`` outside a chain that reaches level ``at`` would hold work up
    if it waited for the chain: it comes by the level after, and so does a reader of
    it (a merge kept for the backward pass can wait)."""
    return level[r] <= at + 1 and any(level[q] <= at + 2 for q in readers[r])


def _after(members, readers, level, top: int) -> set:
    """The tasks up to level ``top`` that read ``members``, directly or not."""
    seen: set = set()
    todo = [r for m in members for r in readers[m]]
    while todo:
        r = todo.pop()
        if r not in seen and level[r] <= top:
            seen.add(r)
            todo.extend(readers[r])
    return seen


def _chains(
    dsk, gangs, slot, deps, readers, level, weight=None, budget=None, critical_path=True
) -> dict:
    """Gangs that run one after another in one task: ``{first gang: [gangs]}``.

    A gang joins the chain of the gangs it reads one level down where everything else
    it reads comes from before the chain starts, within :data:`MAX_PHASES` gangs and
    ``budget`` bytes; of a level's gangs that could, the one on the longest path to the
    step's end (:func:`dfdl.taskgraph.fuse.heights`) is taken first. Chains are then cut to
    their longest valid prefixes (:func:`_valid_prefix`)."""
    chains: dict = {}
    chain_of: dict = {}
    held: dict = {}  # chain -> bytes its members' tasks use
    height = heights(readers, level) if critical_path else {}
    # at each level the gang on the longest path to the step's end claims a chain first
    for g in sorted(gangs, key=lambda g: (level[g], -height.get(g, 0))):
        inputs = {d for m in gangs[g] for d in deps[m] if type(dsk[d]) is Task}
        below = {chain_of[slot[d]] for d in inputs if d in slot and level[d] == level[g] - 1}
        c = next(iter(below)) if len(below) == 1 else None
        size = sum(weight(m) for m in gangs[g]) if weight is not None else 0
        if c is not None and (
            len(chains[c]) >= MAX_PHASES
            or (budget is not None and held[c] + size > budget)
            or level[chains[c][-1]] != level[g] - 1
            or any(
                level[d] >= level[c] and not (d in slot and chain_of.get(slot[d]) == c)
                for d in inputs
            )
        ):
            c = None
        if c is None:
            chains[g] = [g]
            chain_of[g] = g
            held[g] = size
        else:
            chains[c].append(g)
            chain_of[g] = c
            held[c] += size
    out: dict = {}
    for gs in chains.values():
        while gs:
            n = _valid_prefix(gs, gangs, readers, level, critical_path)
            out[gs[0]] = gs[:n]
            gs = gs[n:]
    return out


def _valid_prefix(gs: list, gangs, readers, level, critical_path: bool = True) -> int:
    """The most leading gangs of ``gs`` that one task can run: no task outside them
    that reads their members (but the last gang's) would hold work up by waiting for
    the task's end (:func:`_soon`). Tasks that read the last gang, directly or not,
    wait for the end anyway."""
    for n in range(len(gs), 1, -1):
        inside = {m for g in gs[:n] for m in gangs[g]}
        at = level[gs[n - 1]]
        after = _after(gangs[gs[n - 1]], readers, level, at + 2) if critical_path else set()
        if not any(  # the last gang's values come when they would have come anyway
            r not in inside and r not in after and _soon(r, at, readers, level)
            for g in gs[: n - 1]
            for m in gangs[g]
            for r in readers[m]
        ):
            return n
    return 1


def run_gang(phases: tuple, exports: tuple, outside: tuple, *values) -> Outputs:
    """Runs the gangs of a chain one after another, each gang's members side by side;
    returns the values of the members named in ``exports``.

    Each member is claimed by the first free thread, this one or a helper, so a gang
    never waits for a helper busy elsewhere. A member's exception is raised here, on
    the task's thread, after every claimed member has finished.

    Example:
        >>> from dask.task_spec import Task, TaskRef
        >>> run_gang(((Task("a", abs, -1), Task("b", abs, -2)),), ("a", "b"), ())
        (1, 2)
        >>> run_gang(((Task("a", abs, -1),), (Task("c", abs, TaskRef("a")),)), ("c",), ())
        (1,)
    """
    cache = dict(zip(outside, values, strict=True))
    for members in phases:
        cache.update(zip((m.key for m in members), _side_by_side(members, cache)))
    return Outputs(cache[k] for k in exports)


def _side_by_side(members: tuple, cache: dict) -> list:
    n = len(members)
    results: list = [None] * n
    errors: list = [None] * n
    done = [threading.Event() for _ in range(n)]
    todo = iter(range(n))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            start = time.time()
            try:
                results[i] = members[i](cache)
            except BaseException as e:  # raised again on the task's own thread
                errors[i] = e
            if TRACE is not None:
                TRACE.append((members[i].key, threading.current_thread().name, start, time.time()))
            done[i].set()

    pool = _helpers() if n > 1 else None
    if pool is not None:
        for _ in range(min(HELPERS, n - 1)):
            pool.submit(work)
    work()
    for i in range(n):
        done[i].wait()
        if errors[i] is not None:
            raise errors[i]
    return results
