"""The training loop: weights and optimizer state live on the cluster between steps.

:func:`run_steps` submits ``unroll`` steps as one task graph: step ``k+1`` reads step
``k``'s new parameters by task reference, batch tiles of at most :data:`EMBED_BYTES`
travel inside the graph (larger ones are scattered; on several workers each tile is
scattered to the workers whose shares read it), and the submission asks only for
the last step's carried values (as Futures, which stay on the workers in
:class:`ClusterState`) and every step's loss. The next submission is made before the
previous one finishes, so the scheduler overlaps them; losses are gathered a
submission late, in bulk (:class:`LossCollector`), never with a round trip per step.

Guarantees: a step is a pure function of the carried state, its batch and its seeds,
and the task-graph optimizer's ``options`` change only how tasks are grouped, so the
losses and weights are the same bit for bit whatever the options. A
cluster whose workers all stay paused for memory is a
:class:`~dfdl.errors.TrainingError` (:func:`gather_watching`), not a hang.

Example:
    >>> state, losses = run_steps(client, plans, steps, state, constants,  # doctest: +SKIP
    ...                           seed=0, token=new_token())
"""

from __future__ import annotations

import dataclasses
import math
import operator
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from dask.task_spec import DataNode, Task, TaskRef

from dfdl.data.sources import FileRows, read_rows
from dfdl.errors import TrainingError
from dfdl.ops.gpu.device import to_host
from dfdl.plan.compile import StepPlan
from dfdl.plan.tiling import Plan
from dfdl.runtime import stored, submit
from dfdl.runtime.cluster import byte_batches, gather_budget, transfer_budget
from dfdl.taskgraph import program
from dfdl.taskgraph.lower import Picked, lower, new_token, split_tiles, task_name, tile_regions
from dfdl.taskgraph.optimize import GraphOptions, optimize, worker_restrictions
from dfdl.taskgraph.step_tasks import STEP_NAME
from dfdl.taskgraph.tile_exec import assemble_task

#: batch tiles above this size are scattered rather than embedded in the graph
EMBED_BYTES = 4 * 2**20


@dataclass
class ClusterState:
    """Where the carried tensors (params, optimizer state, buffers) live now.

    ``refs[name]`` maps tile index to a Future (or :class:`Picked` Future);
    ``chunks[name]`` is the chunking of those tiles.
    """

    refs: dict[str, dict[tuple[int, ...], Any]]
    chunks: dict[str, tuple]
    keep: list = field(default_factory=list)
    #: the workers' device: values on a GPU worker are copied to the host to be gathered
    device: str = "cpu"
    #: where the training's tasks and scattered tiles go (:func:`dfdl.runtime.cluster.placement`)
    placement: dict = field(default_factory=dict)

    @classmethod
    def scatter(
        cls,
        client,
        values: Mapping[str, np.ndarray],
        chunks: Mapping[str, tuple],
        placement: Mapping | None = None,
    ):
        """The tiles of ``values`` in ``chunks`` scattered to the workers (to the GPU
        workers of a hybrid cluster, ``placement``), in batches of a share of the
        workers' memory. Values that are :mod:`~dfdl.runtime.stored` descriptions (a
        file's tensor, zeros) are not read here: each tile is a task that reads or makes
        it on a worker."""
        data, where, loads = {}, {}, {}
        token = new_token()
        for name, v in values.items():
            source = stored.source_of(v)
            if source is not None:
                for idx, region in tile_regions(chunks[name]).items():
                    loads[(task_name(f"{name}-init", token), *idx)] = (source, region)
                    where[(name, idx)] = (task_name(f"{name}-init", token), *idx)
                continue
            for idx, tile in split_tiles(np.asarray(v), chunks[name]).items():
                key = (task_name(f"{name}-init", token), *idx)
                data[key] = tile
                where[(name, idx)] = key
        # in batches a share of the workers' memory: each batch can be spilled before the next
        keys = list(data)
        workers = (placement or {}).get("workers")
        futures = {}
        for part in byte_batches([data[k].nbytes for k in keys], transfer_budget(client)):
            if len(part):
                try:
                    batch = {keys[i]: data[keys[i]] for i in part}
                    futures.update(client.scatter(batch, hash=False, workers=workers))
                except TimeoutError:  # the scheduler found no running worker to take them
                    workers = client.scheduler_info()["workers"]
                    paused = {a: w for a, w in workers.items() if w.get("status") == "paused"}
                    if paused and len(paused) == len(workers):
                        raise paused_error(paused, "while the weights were sent") from None
                    raise
        for key, (source, region) in loads.items():
            futures[key] = client.submit(
                stored.read_tile,
                source,
                region,
                key=key,
                pure=False,
                workers=workers,
                resources=(placement or {}).get("resources"),
            )
        refs: dict[str, dict] = {n: {} for n in values}
        for (name, idx), key in where.items():
            refs[name][idx] = futures[key]
        kept = list(futures.values())
        return cls(refs, {n: chunks[n] for n in values}, kept, placement=dict(placement or {}))

    def store(self, client, folder: str | os.PathLike, types) -> dict[str, stored.Stored]:
        """The carried tensors written by the workers into one ``.npy`` file each in
        ``folder`` (created), a tile per task, never through the client; returns where
        they are, once every tile is on disk.

        Example:
            >>> state.store(client, "/shared/run/step-100", tg.graph.types)  # doctest: +SKIP
            {'w': Stored(path='/shared/run/step-100/0000-w.npy', offset=128, ...)}
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        out, writes = {}, []
        token = new_token()
        for i, (name, tiles) in enumerate(self.refs.items()):
            target = stored.create(
                folder / stored_file_name(i, name), types[name].shape, types[name].dtype
            )
            out[name] = target
            regions = tile_regions(self.chunks[name])
            for idx, r in tiles.items():
                ref = r.ref if isinstance(r, Picked) else r
                writes.append(
                    client.submit(
                        stored.write_tile,
                        ref,
                        target,
                        regions[idx],
                        r.pos if isinstance(r, Picked) else None,
                        key=(task_name(f"{name}-store", token), *idx),
                        pure=False,
                        # on the (GPU) workers that hold the tiles, not any worker
                        resources=self.placement.get("resources"),
                    )
                )
        try:
            client.gather(writes)
        finally:
            for f in writes:
                f.release()
        return out

    def gather(self, client, types) -> dict[str, np.ndarray]:
        """The carried tensors as numpy arrays, gathered in batches of a share of each
        worker's memory (a worker reads spilled tiles back to send them:
        :func:`~dfdl.runtime.cluster.gather_budget`)."""
        flat = [(n, idx, r) for n, tiles in self.refs.items() for idx, r in tiles.items()]
        regions = {n: tile_regions(self.chunks[n]) for n in self.refs}
        sizes = [
            types[n].dtype.itemsize * math.prod(s.stop - s.start for s in regions[n][idx])
            for n, idx, _ in flat
        ]
        futures = [r.ref if isinstance(r, Picked) else r for _, _, r in flat]
        budget = gather_budget(client)
        owners = None
        if budget is not None:  # each worker sends at most the budget per batch
            holders = client.who_has(futures)
            owners = [min(holders.get(f.key) or [""]) for f in futures]
        out = {}
        for part in byte_batches(sizes, budget, owners):
            batch = [flat[i] for i in part]
            wanted = [futures[i] for i in part]
            if self.device != "cpu":
                wanted = client.map(
                    to_host,
                    wanted,
                    key=[f"to-host-{f.key}" for f in wanted],
                    resources=self.placement.get("resources"),
                )
            got = client.gather(wanted)
            for (name, idx, r), v in zip(batch, got):
                if name not in out:
                    out[name] = np.empty(types[name].shape, dtype=types[name].dtype)
                out[name][regions[name][idx]] = v[r.pos] if isinstance(r, Picked) else v
        return out


def stored_file_name(i: int, name: str) -> str:
    """The file of the ``i``-th carried tensor, ``name``, in a folder of stored tensors
    (ONNX names may hold any character)."""
    return f"{i:04d}-{stored.safe_name(name)[:100]}.npy"


def _batch_sources(plan: Plan, arrays: Mapping[str, Any], step: int, dsk, big, token: str):
    """Batch tiles: embedded data, tasks reading rows on a worker, or refs to tiles
    larger than :data:`EMBED_BYTES`, which are added to ``big`` (key -> tile) to be
    scattered once the graph is built (:func:`_send_batches`)."""
    sources = {}
    for name, value in arrays.items():
        refs = {}
        base = task_name(f"{name}-input", token)
        if isinstance(value, FileRows):
            for idx, region in tile_regions(plan.chunks[name]).items():
                key = (base, step, *idx)
                rows = value.indices[region[0]] if region else value.indices
                dsk[key] = Task(key, read_rows, value.path, value.kind, rows, region[1:])
                refs[idx] = TaskRef(key)
            sources[name] = refs
            continue
        for idx, tile in split_tiles(value, plan.chunks[name]).items():
            key = (base, step, *idx)
            if tile.nbytes > EMBED_BYTES:
                big[key] = tile
            else:
                dsk[key] = DataNode(key, tile)
            refs[idx] = TaskRef(key)
        sources[name] = refs
    return sources


def _send_batches(
    client, dsk: dict, big: Mapping, batch_keys, pinned: dict | None, workers=None
) -> list:
    """Send the batch tiles to the workers that read them; returns the futures of the
    scattered ones, which the graph reads by key (keep them until it ran).

    With ``pinned`` (the worker of each worker's share, :func:`worker_restrictions`), a
    tile that only pinned tasks read goes straight to their workers: its data (embedded
    or large) is scattered to each of them, and a task reading rows from a file runs on
    each, a copy under a key of its own per worker where several read it. Otherwise, as
    before: data stays in the graph and large tiles are scattered to ``workers`` (None:
    any). The values are the same either way; a tile already on the worker of the share
    that reads it is not fetched from another worker when that share starts.
    """
    send: dict = {}  # worker (None: any) -> {key: tile}
    done: set = set()
    roster = sorted({w for ws in (pinned or {}).values() for w in ws})
    for key, readers in _pinned_readers(dsk, batch_keys, pinned).items():
        node = dsk.get(key)
        where = sorted({pinned[r][0] for r in readers})
        for w in where:
            copy = key if len(where) == 1 else (*key, roster.index(w))
            if isinstance(node, Task):  # reads rows from a file on its worker
                dsk[copy] = node.substitute({}, key=copy)
                pinned[copy] = [w]
            else:
                send.setdefault(w, {})[copy] = big[key] if node is None else node.value
            if copy != key:
                for r in readers:
                    if pinned[r][0] == w:
                        dsk[r] = dsk[r].substitute({key: copy})
        if len(where) > 1 or not isinstance(node, Task):
            dsk.pop(key, None)
        done.add(key)
    rest = {k: v for k, v in big.items() if k not in done}
    if rest:
        send.setdefault(None, {}).update(rest)
    futures = []
    for w, tiles in send.items():
        try:
            got = client.scatter(tiles, hash=False, workers=[w] if w else workers)
        except (KeyError, TimeoutError):  # that worker left: any other takes them (its
            if w is None:  # share runs elsewhere, raises PeerLostError, and the steps replay)
                raise
            got = client.scatter(tiles, hash=False, workers=workers)
        futures.extend(got.values())
    return futures


def _pinned_readers(dsk: Mapping, keys, pinned: Mapping | None) -> dict:
    """The readers in ``dsk`` of each of ``keys`` that only tasks in ``pinned`` read."""
    if not pinned:
        return {}
    readers: dict = {}
    for k, node in dsk.items():
        for d in getattr(node, "dependencies", ()):
            if d in keys:
                readers.setdefault(d, []).append(k)
    return {k: rs for k, rs in readers.items() if all(r in pinned for r in rs)}


@dataclass
class StepInput:
    """Everything one step needs from the host."""

    step: int
    arrays: dict[str, Any]  # batch data and labels: numpy arrays or FileRows
    scalars: dict[str, float]


def run_steps(
    client,
    plans: Callable[[int], StepPlan],
    steps: list[StepInput],
    state: ClusterState,
    constants: Constants,
    *,
    seed: int,
    token: str,
    timings: dict[str, float] | None = None,
    options: GraphOptions = GraphOptions(),
    device: str = "cpu",
    programs: dict | None = None,
) -> tuple[ClusterState, list[tuple[int, Any]]]:
    """Submit ``steps`` as one graph; returns the new state and (step, loss future) pairs.
    ``device``: the workers' (their tile kernels'); on a GPU each loss is copied to the
    host on its worker, so the client receives numpy values. ``programs``: a cache of
    compiled step groups (:mod:`dfdl.taskgraph.program`) kept across calls; with it a
    group of the shape of an earlier one runs that group's program on its own inputs.

    The graph is lowered step by step and grouped by the task-graph optimizer
    (:func:`dfdl.taskgraph.optimize.optimize` with ``options``). ``timings`` (if given)
    accumulates seconds spent building the graph (``graph_s``) and handing it to the
    scheduler (``submit_s``) on the client.
    """
    t0 = time.perf_counter()
    if programs is not None:
        done = _run_program(
            client, plans, steps, state, constants, seed, token, options, device, programs
        )
        if done is not None:
            if timings is not None:
                timings["graph_s"] = timings.get("graph_s", 0.0) + time.perf_counter() - t0
            return done
    dsk: dict = {}
    keep: list = []
    refs = dict(state.refs)
    chunks = dict(state.chunks)
    loss_keys: list[tuple[int, Any]] = []
    used: dict[int, StepPlan] = {}
    big: dict = {}  # batch tiles to scatter once the graph is built
    batch_keys: set = set()
    for s in steps:
        sp = plans(len(next(iter(s.arrays.values()))))
        used[id(sp)] = sp
        tg, plan = sp.tg, sp.plan
        sources = _batch_sources(plan, s.arrays, s.step, dsk, big, token)
        batch_keys.update(r.key for refs in sources.values() for r in refs.values())
        for name, value in s.scalars.items():
            if name not in plan.chunks:  # read by no node (Adam gets lr via step_size)
                continue
            key = (task_name(f"{name}-input", token), s.step)
            dsk[key] = DataNode(key, np.asarray(value, dtype=np.float32))
            sources[name] = {(): TaskRef(key)}
        for name in tg.carried():
            sources[name] = _rechunked(
                refs[name],
                chunks[name],
                plan.chunks[name],
                task_name(f"{name}-rechunk", token),
                dsk,
                s.step,
            )
        for name in _read_constants(plan):
            sources[name] = constants.tiles(
                name, plan.graph.initializers[name], plan.chunks[name], dsk
            )
        tasks, outs = lower(
            plan, sources, step=s.step, attrs=tg.seeds(seed, s.step), token=token, device=device
        )
        dsk.update(tasks)
        for name in tg.carried():
            new = tg.new[name]
            refs[name] = {
                idx: TaskRef(key) if pos is None else Picked(TaskRef(key), pos)
                for idx, (key, pos) in outs[new].items()
            }
            chunks[name] = plan.chunks[new]
        ((_, (lkey, lpos)),) = outs[tg.loss].items()
        if device != "cpu":
            host = (task_name("loss-to-host", token), s.step)
            dsk[host] = Task(host, to_host, TaskRef(lkey))
            lkey = host
        loss_keys.append((s.step, (lkey, lpos)))
    wanted = sorted(
        {_key(r) for tiles in refs.values() for r in tiles.values()}
        | {k for _, (k, _) in loss_keys},
        key=str,
    )
    roster: dict = {}

    def nthreads() -> dict[str, int]:
        # one round trip to the scheduler, only when tasks are grouped; the workers in
        # address order, so that a worker keeps its share from submission to submission
        roster.update(sorted(client.nthreads().items()))
        return dict(roster)

    # a hybrid cluster's placement (its GPU workers) has the last word: no shares
    hybrid = bool(state.placement.get("workers"))
    if hybrid:
        options = dataclasses.replace(options, worker_tasks=False)
    dsk = optimize(dsk, wanted, used.values(), token=token, nthreads=nthreads, options=options)
    t1 = time.perf_counter()
    resources = state.placement.get("resources")
    pinned = worker_restrictions(dsk, token, list(roster)) if roster and not hybrid else None
    keep.extend(_send_batches(client, dsk, big, batch_keys, pinned, state.placement.get("workers")))
    futures = dict(
        zip(wanted, submit.get(client, dsk, wanted, resources=resources, workers=pinned))
    )
    if timings is not None:
        timings["graph_s"] = timings.get("graph_s", 0.0) + t1 - t0
        timings["submit_s"] = timings.get("submit_s", 0.0) + time.perf_counter() - t1
    new_refs = {
        name: {idx: _as_future(r, futures) for idx, r in tiles.items()}
        for name, tiles in refs.items()
    }
    losses = [(step, (futures[k], pos)) for step, (k, pos) in loss_keys]
    return ClusterState(new_refs, chunks, keep, device, state.placement), losses


def _pick(value: Any, pos: int | None, host: bool) -> Any:
    """``value`` (output ``pos`` of it), copied to the host when ``host``."""
    value = value if pos is None else value[pos]
    return to_host(value) if host else value


def _run_program(client, plans, steps, state, constants, seed, token, options, device, programs):
    """:func:`run_steps` for a group of steps as one task running a compiled step program
    (compiled on the first group of its shape); None where the group cannot run so."""
    if any(isinstance(v, FileRows) for s in steps for v in s.arrays.values()):
        return None
    sps = [plans(len(next(iter(s.arrays.values())))) for s in steps]
    shape = (
        tuple(map(id, sps)),
        tuple(tuple(sorted(s.scalars)) for s in steps),
        tuple(sorted((n, state.chunks[n]) for n in state.refs)),
    )
    if shape not in programs:
        programs[shape] = _compile_program(client, sps, steps, state, constants, options, device)
    if programs[shape] is None:
        return None
    compiled, ptok, out_chunks = programs[shape]
    inputs: dict = {}
    for j, (s, sp) in enumerate(zip(steps, sps)):
        for name, value in s.arrays.items():
            for idx, tile in split_tiles(value, sp.plan.chunks[name]).items():
                inputs[program.placeholder(ptok, "batch", name, j, *idx)] = tile
        for name, value in s.scalars.items():
            inputs[program.placeholder(ptok, "scalar", name, j)] = np.asarray(value, np.float32)
        for node, attrs in sp.tg.seeds(seed, s.step).items():
            inputs[program.placeholder(ptok, "seed", node, j)] = attrs["seed"]
    for name, tiles in state.refs.items():
        for idx, r in tiles.items():
            ph = program.placeholder(ptok, "carried", name, *idx)
            inputs[ph] = (r.ref, r.pos) if isinstance(r, Picked) else r
    key = (task_name(STEP_NAME, token), steps[0].step)
    dsk, export = program.instantiate(compiled, key, inputs)
    loss_keys = []
    for j, s in enumerate(steps):
        lk = (task_name("loss", token), s.step)
        pos = export(program.placeholder(ptok, "loss", j))
        dsk[lk] = Task(lk, operator.getitem, TaskRef(key), pos)
        loss_keys.append(lk)
    wanted = [key, *loss_keys]
    resources = state.placement.get("resources")
    futures = dict(zip(wanted, submit.get(client, dsk, wanted, resources=resources)))
    last = len(steps) - 1
    refs = {
        name: {
            idx: Picked(futures[key], export(program.placeholder(ptok, "out", last, name, *idx)))
            for idx in tile_regions(ch)
        }
        for name, ch in out_chunks.items()
    }
    chunks = dict(out_chunks)
    losses = [(s.step, (futures[lk], None)) for s, lk in zip(steps, loss_keys)]
    return ClusterState(refs, chunks, list(futures.values()), device, state.placement), losses


def _compile_program(client, sps, steps, state, constants, options, device):
    """The step program of a group shaped as ``steps``: its graph built from
    placeholders, optimized into one task; with the placeholder token and the chunks
    of the carried tensors at the group's end. None where it is not one task."""
    ptok = new_token()
    dsk: dict = {}
    fixed: dict = {}
    refs = {
        name: {
            idx: TaskRef(program.placeholder(ptok, "carried", name, *idx))
            for idx in tile_regions(state.chunks[name])
        }
        for name in state.refs
    }
    chunks = dict(state.chunks)
    wanted: list = []
    step_values: list = []
    for j, (s, sp) in enumerate(zip(steps, sps)):
        tg, plan = sp.tg, sp.plan
        sources: dict = {}
        for name in s.arrays:
            sources[name] = {
                idx: TaskRef(program.placeholder(ptok, "batch", name, j, *idx))
                for idx in tile_regions(plan.chunks[name])
            }
        for name in s.scalars:
            if name in plan.chunks:
                sources[name] = {(): TaskRef(program.placeholder(ptok, "scalar", name, j))}
        for name in tg.carried():
            sources[name] = _rechunked(
                refs[name], chunks[name], plan.chunks[name], task_name(f"{name}-rechunk", ptok),
                dsk, j,
            )  # fmt: skip
        for name in _read_constants(plan):
            sources[name] = constants.tiles(
                name, plan.graph.initializers[name], plan.chunks[name], dsk
            )
            fixed.update((r.key, r) for r in sources[name].values() if not isinstance(r, TaskRef))
        seeds = {}
        for node in tg.seeds(0, 0):
            ph = program.placeholder(ptok, "seed", node, j)
            seeds[node] = {"seed": program.StepValue(ph)}
            step_values.append(ph)
        tasks, outs = lower(plan, sources, step=j, attrs=seeds, token=ptok, device=device)
        dsk.update(tasks)
        for name in tg.carried():
            refs[name] = {
                idx: TaskRef(k) if pos is None else Picked(TaskRef(k), pos)
                for idx, (k, pos) in outs[tg.new[name]].items()
            }
            chunks[name] = plan.chunks[tg.new[name]]
        ((_, (lkey, lpos)),) = outs[tg.loss].items()
        ph = program.placeholder(ptok, "loss", j)
        dsk[ph] = Task(ph, _pick, TaskRef(lkey), lpos, device != "cpu")
        wanted.append(ph)
    last = len(steps) - 1
    for name, tiles in refs.items():
        for idx, r in tiles.items():
            ph = program.placeholder(ptok, "out", last, name, *idx)
            ref, pos = (r.ref, r.pos) if isinstance(r, Picked) else (r, None)
            dsk[ph] = Task(ph, _pick, ref, pos, False)
            wanted.append(ph)

    def optimized(graph, keep):
        return optimize(
            graph,
            keep,
            sps,
            token=ptok,
            nthreads=lambda: list(client.nthreads().values()),
            options=program.group_options(options, len(steps)),
        )

    compiled = program.compile_group(
        dsk, wanted, optimized, tuple(step_values), fixed, serial=device != "cpu"
    )
    if compiled is None:
        return None
    return compiled, ptok, {name: chunks[name] for name in refs}


class Constants:
    """Constant tensors (folded constants, frozen weights), keyed once per chunking.

    Tiles up to :data:`EMBED_BYTES` travel inside every graph that reads them, under the
    same keys each time: the scheduler keeps the tiles it has, and can rebuild one that
    died with a worker. Larger tiles are scattered once (a lost one makes training roll
    back, see :mod:`dfdl.runtime.recovery`), and a file's tensor (``weights_dir``) is
    read by the workers once, a task per tile.
    """

    def __init__(self, client, placement: Mapping | None = None):
        self.client = client
        self.placement = placement
        self.token = new_token()
        self.cache: dict[tuple, dict] = {}
        self.embedded: dict[tuple, dict] = {}

    def tiles(self, name: str, value: np.ndarray, chunks: tuple, dsk: dict) -> dict:
        """Refs to the tiles of ``value`` in ``chunks``; adds embedded ones to ``dsk``."""
        key = (name, tuple(chunks))
        if key in self.cache:
            return self.cache[key]
        if key not in self.embedded:
            if stored.of_memmap(value) is not None:  # a file's tensor: read on the workers
                self.cache[key] = ClusterState.scatter(
                    self.client, {name: value}, {name: chunks}, self.placement
                ).refs[name]
                return self.cache[key]
            tiles = split_tiles(np.asarray(value), chunks)
            if max(t.nbytes for t in tiles.values()) > EMBED_BYTES:
                self.cache[key] = ClusterState.scatter(
                    self.client, {name: value}, {name: chunks}, self.placement
                ).refs[name]
                return self.cache[key]
            base = task_name(f"{name}-const-{len(self.embedded)}", self.token)
            self.embedded[key] = {idx: DataNode((base, *idx), t) for idx, t in tiles.items()}
        nodes = self.embedded[key]
        for node in nodes.values():
            dsk[node.key] = node
        return {idx: TaskRef(node.key) for idx, node in nodes.items()}


def _read_constants(plan: Plan) -> list[str]:
    """Initializers that some node reads as tiles (not as whole plan-time parameters)."""
    g = plan.graph
    out = []
    for np_ in plan.nodes:
        for name, spec in zip(np_.node.inputs, np_.spec.inputs):
            if name in g.initializers and spec is not None and name not in out:
                out.append(name)
    return out


def _key(r) -> Any:
    r = r.ref if isinstance(r, Picked) else r
    return r.key


def _as_future(r, futures):
    if isinstance(r, Picked):
        return Picked(futures[r.ref.key], r.pos)
    return futures[r.key]


def _rechunked(tiles, have, want, name, dsk, step):
    """Tiles of a carried tensor in the chunking the plan wants (assembled if needed)."""
    if tuple(have) == tuple(want):
        return tiles
    have_regions = tile_regions(have)
    out = {}
    for idx, region in tile_regions(want).items():
        pieces, args = [], []
        for hidx, hreg in have_regions.items():
            inter = [(max(a.start, b.start), min(a.stop, b.stop)) for a, b in zip(region, hreg)]
            if any(lo >= hi for lo, hi in inter):
                continue
            ref = tiles[hidx]
            args.append(ref.ref if isinstance(ref, Picked) else ref)
            src = tuple(slice(lo - h.start, hi - h.start) for (lo, hi), h in zip(inter, hreg))
            dst = tuple(slice(lo - r.start, hi - r.start) for (lo, hi), r in zip(inter, region))
            pieces.append((len(args) - 1, ref.pos if isinstance(ref, Picked) else None, src, dst))
        shape = tuple(r.stop - r.start for r in region)
        key = (name, step, *idx)
        dsk[key] = Task(key, assemble_task, shape, tuple(pieces), *args)
        out[idx] = TaskRef(key)
    return out


def spill_totals(dask_worker) -> tuple[float, float, float, float]:
    """(bytes written to, bytes read from) the worker's spill directory so far, then
    (bytes moved off, back onto) its device (a GPU worker with a device memory limit,
    :mod:`dfdl.runtime.device_memory`; else 0)."""
    data = dask_worker.data
    metrics = getattr(data, "cumulative_metrics", None) or {}
    off, back = getattr(data, "device_spilled", (0, 0)), getattr(data, "device_unspilled", (0, 0))
    return (
        metrics.get(("disk-write", "bytes"), 0.0),
        metrics.get(("disk-read", "bytes"), 0.0),
        float(off[1]),
        float(back[1]),
    )


class SpillMeter:
    """Bytes the workers spilled to and read back from disk, and moved off and back onto
    their devices, since the last reading.

    Readings cost a round trip to every worker, so :meth:`due` allows one per
    ``interval`` seconds.
    """

    def __init__(self, client, interval: float = 1.0):
        self.client = client
        self.interval = interval
        self.t_last = time.perf_counter()
        self.last: dict[str, tuple] = {}
        self.last = self._read()

    def due(self) -> bool:
        return time.perf_counter() - self.t_last >= self.interval

    def _read(self) -> dict[str, tuple]:
        try:
            return self.client.run(spill_totals)
        except Exception:  # a worker lost mid-call: count it next time
            return dict(self.last)

    def delta(self) -> tuple[int, int, int, int]:
        """(written, read, off the device, back onto it) bytes over all workers since
        the previous call."""
        now = self._read()
        self.t_last = time.perf_counter()
        out = []
        for i in range(4):
            moved = sum(v[i] - self.last.get(a, (0.0,) * 4)[i] for a, v in now.items())
            out.append(max(0, int(moved)))
        self.last = now
        return tuple(out)


#: seconds every worker may stay paused by Dask's memory monitor (process memory above
#: ``distributed.worker.memory.pause`` of its limit) before training gives up: paused
#: workers whose memory is not Dask's to spill never resume
PAUSED_GIVE_UP_S = 120.0


def gather_watching(client, futures, *, poll: float = 5.0, give_up: float | None = None):
    """``client.gather(futures)``, but a :class:`TrainingError` instead of a hang when
    every worker stays paused for memory for ``give_up`` seconds; the first task that
    fails raises its error at once, without waiting for the others."""
    give_up = PAUSED_GIVE_UP_S if give_up is None else give_up
    remaining, lock, done = [len(futures)], threading.Lock(), threading.Event()

    def one_done(future) -> None:
        with lock:
            remaining[0] -= 1
            # a failed task ends the wait at once: the recovery may have to replay, and a
            # share waiting for the failed one's values only ends once cancelled
            if remaining[0] <= 0 or future.status != "finished":
                done.set()

    if not futures:
        done.set()
    try:
        for f in futures:
            f.add_done_callback(one_done)  # called once finished, erred or cancelled
        return _wait_gather(client, futures, done, poll, give_up)
    except (KeyboardInterrupt, SystemExit, TrainingError):
        # a pending done-callback holds its future on the client's event loop until the
        # task ends: cancel them, or an interrupted run's tasks stay wanted and keep running
        # (a task's own error instead goes to the recovery, which may still need them)
        _cancel_quietly(client, futures)
        raise


def _cancel_quietly(client, futures) -> None:
    """Cancel ``futures`` on the cluster, ignoring a client already closed."""
    try:
        client.cancel([f for f in futures if not f.done()])
    except Exception:  # noqa: BLE001 - closing or closed client: its futures went with it
        pass


def _wait_gather(client, futures, done, poll: float, give_up: float):
    paused_since = None
    while True:
        if done.wait(poll):
            return client.gather(futures)  # raises the task's error if one failed
        workers = client.scheduler_info()["workers"]
        paused = {a: w for a, w in workers.items() if w.get("status") == "paused"}
        if not workers or len(paused) < len(workers):
            paused_since = None
            continue
        paused_since = paused_since or time.perf_counter()
        if time.perf_counter() - paused_since >= give_up:
            raise paused_error(paused, f"for {give_up:.0f} s")


def paused_error(paused: dict, how_long: str) -> TrainingError:
    """The error for workers that Dask's memory monitor paused and that do not resume."""
    detail = ", ".join(
        f"{a} at {w['metrics'].get('memory', 0) / 2**20:.0f} MiB of "
        f"{(w.get('memory_limit') or 0) / 2**20:.0f} MiB"
        for a, w in sorted(paused.items())
    )
    return TrainingError(
        f"every worker has been paused by Dask's memory monitor {how_long} ({detail}); "
        "training stopped instead of waiting forever. The memory above the pause threshold "
        "is not tiles Dask can spill (the worker process itself, buffers): give the workers "
        "larger memory limits (the idle worker process alone takes about 200 MB), or fewer, "
        "larger workers."
    )


class LossCollector:
    """Gathers loss futures in bulk, a submission late; raises on a non-finite loss.

    With a :class:`SpillMeter`, each gathered step also gets the bytes spilled to and
    read from disk, and moved off and back onto the workers' devices: the workers'
    totals since the previous reading, shared evenly by
    the steps gathered since (their tasks overlap on the cluster). Readings are taken
    at most once a second, and always by the final ``collect(final=True)``.
    """

    def __init__(
        self,
        client,
        on_loss: Callable[[int, float], None],
        spill: SpillMeter | None = None,
    ):
        self.client = client
        self.pending: list[tuple[int, Any]] = []
        self.on_loss = on_loss
        self.values: dict[int, float] = {}
        self.spill = spill
        self.spilled: dict[int, tuple[int, ...]] = {}
        self.unmetered: list[int] = []
        self.total = [0, 0, 0, 0]  # bytes written, read, off and onto devices: so far

    def add(self, losses: list[tuple[int, Any]]) -> None:
        self.pending.extend(losses)

    def drop_pending(self) -> None:
        """Forget the losses not gathered yet (their steps are about to be replayed)."""
        self.pending = []
        self.unmetered = []

    def collect(self, keep_last: int = 0, final: bool = False) -> None:
        """Gather all pending losses except the newest ``keep_last``."""
        n = len(self.pending) - keep_last
        batch, self.pending = self.pending[: max(n, 0)], self.pending[max(n, 0) :]
        got = gather_watching(self.client, [f for _, (f, _) in batch]) if batch else []
        if self.spill is not None:
            self.unmetered.extend(step for step, _ in batch)
            if self.unmetered and (final or self.spill.due()):
                moved = self.spill.delta()
                for i, v in enumerate(moved):
                    self.total[i] += v
                k = len(self.unmetered)
                for step in self.unmetered:
                    self.spilled[step] = tuple(v // k for v in moved)
                self.unmetered = []
        for (step, (_, pos)), v in zip(batch, got):
            value = float(np.asarray(v if pos is None else v[pos]))
            if not math.isfinite(value):
                raise TrainingError(
                    f"the loss is {value} at step {step}; training stopped. Lower the "
                    "learning rate, enable gradient clipping (clip_norm=) or check the data "
                    "for NaN/Inf."
                )
            self.values[step] = value
            self.on_loss(step, value)
