"""Gangs and chains: a level's sibling tile tasks run as one Dask task, side by side on
threads, and successive gangs run one after another in that same task.

A training step's tasks come as siblings: the tiles of one node at one level of the
graph, such as the two batch tiles of a ResNet convolution on a 2-thread worker. On
one worker process each costs the scheduler and the worker their per-task CPU (about
2.2 ms on the 2-core development machine, for kernels of 5-10 ms), taken from the same
cores as the kernels, and each dependency a round trip through the scheduler with
both threads idle (2.2-4 ms per level there). A *gang* is one task that runs all its
members at once: one on the task's own thread, the others on the worker's helper
threads (:func:`run_gang`). A *chain* runs several gangs one after another in one
task, each reading the one before from memory: the layers of a ResNet stage, or a
ReLU gradient, the BatchNorm gradient sums that merge its tiles, and the
convolution's gradients after them. Each reader outside a chain takes its member's
value (``operator.getitem``) inside its own task. A ResNet step's graph goes from 115
tasks to 56 (its data tiles included), the U-Net's from 109 to 69 and the
transformer's from 273 to 199; the MLP's keeps its 58.

The trainer now runs each whole step as one task on such a cluster
(:mod:`dfdl.taskgraph.step_tasks`), which measured faster on every benchmark workload; gangs
and chains are its fallback, where a step's tasks would use more than its byte budget
or the steps cannot be cut out of the graph (a cycle).

Siblings form a gang (:func:`gang_siblings`) where

* their keys share the node, phase and step, they sit at the same topological level
  (so neither reads the other), none is requested, their readers are plain tasks and
  their nodes' tiles read and write at most ``LIGHT_BYTES`` (the trainer's ``fits``);
* all of the level's siblings fit in one gang (at most ``width``, the worker's task
  threads). The MLP's four partial products of one layer are left alone: two gangs of
  two would run four GEMMs at once on two cores;
* every input that not all of them read comes from data or from another gang, so all
  members are ready at about the same time. The MLP's next-step forward tiles read
  their own weight tile's update, and the updates end tens of ms apart: ganged, the
  first tile waited for the second's weight (the MLP's step measured 7% slower before
  this rule, 0.600 against 0.560 s).

A gang joins the chain of the gang it reads one level down (:func:`_chains`) where
everything else it reads comes from before the chain starts, the chain has fewer than
:data:`MAX_PHASES` gangs, and the bytes its tasks use (``Plan.task_memory``) stay
within ``budget`` (the trainer passes what the planner grants a worker's threads at
once). A lone task with tiny outputs (a merge of per-channel sums; the trainer's
``joins``) is a gang of one there. A chain is cut where a task outside it reads a
value of an earlier gang and would hold up work by waiting for the chain's end
(:func:`_soon`); a BatchNorm's merged moments, kept for the backward pass, can wait,
and so can a task that reads the chain's last gang, directly or not: it waits for
the end anyway.

Chains follow the critical path (switch :data:`CRITICAL_PATH`): of the gangs of one
level that could continue a chain, the one with the longest path of readers to the
step's end is taken first. ResNet's loss gradient used to continue the forward chain
with the head's weight gradient, a dead end, and the ReLU gradient that the backward
pass goes on with began a chain of its own. With both rules a ResNet step's longest
chain of dependent tasks is 14 instead of 15 (the stem's last gradients now join the
backward chain before them). ``python bench/ab.py WORKLOAD
dfdl.taskgraph.gang.CRITICAL_PATH --a False --b True --steps 6 --fresh`` (same losses),
off against on: ResNet 0.473 against 0.436 s per step (8 rounds) and, swapped, 0.482
against 0.484 s (8 rounds, a slower hour); U-Net 0.715 against 0.723 s and
transformer 1.368 against 1.375 s (4 rounds each): within noise but for one run.
Also exempting a reader of an earlier gang whose own readers wait for the last gang
anyway made chains longer still but measured slower (0.439 against 0.469 s): the
partner tile of the stem's gradient sums then waited for the chain's end. Letting a
gang join the last link of a chain at its own level (a shortcut convolution beside
the block's first, the merged moments beside the next convolution) cut the chains on
ResNet's critical path from 14 to about 6 and the time with both threads idle from
16% to 8%, but not the step (0.448 against 0.443 s, 8 rounds): the time with one
thread idle rose from 18% to 24%, so it stays out.

The helpers are :data:`HELPERS` threads per worker process (one fewer than its task
threads, set by the worker preload), created when first needed. A member is run by
whichever thread claims it first, the gang's own thread or a helper, so a gang never
waits behind a helper busy with another gang's member. The helpers run kernels at the
task threads' nice value (:func:`dfdl.taskgraph.tile_exec.run_tile` sets it per thread).

Only on a cluster of one worker process, and only where the trainer fuses tasks (the
step's estimate fits in memory): on several workers the members' inputs would all be
fetched to one worker and the siblings' tiles could not spread; a beyond-memory plan
sizes each task to a budget that a chain would exceed.

``python bench/ab.py WORKLOAD dfdl.taskgraph.gang.GANG --a False --b True --steps 6
--rounds 4 --fresh`` (alternating fresh embedded clusters on the 2-core AMD
development machine, 2026-11-26, the same losses in both arms), A without, B with
gangs and chains: ResNet 0.585 against 0.444 s per step (its first rounds shared the
CPU with a short script; in a quiet run, ``dfdl.taskgraph.gang.MAX_PHASES --a 1 --b 8``:
0.518 against 0.446 s), U-Net 0.773 against 0.694 s, transformer 1.417 against 1.315
s, MLP 0.600 against 0.597 s. Gangs alone (``MAX_PHASES`` 1) against neither: ResNet
0.501 against 0.489 s and 0.513 against 0.481 s (6 rounds), U-Net 0.772 against
0.741 s, transformer 1.441 against 1.388 s. Running tiny merges at the end of the gang
that produces their partials, without chains, measured slower (ResNet 0.518 against
0.529 s): dropped.

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
