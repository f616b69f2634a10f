"""Run a plan on a Dask cluster: ship input tiles, submit the graph, gather outputs.

:func:`execute` runs one forward pass of a :class:`~dfdl.plan.tiling.Plan` (inference,
validation): it cuts the feeds into the plan's tiles (embedded in the graph, or
scattered above :data:`SCATTER_BYTES`; an initializer that is a whole file's memory map,
as ``weights_dir`` leaves them, is read by the workers tile by tile), lowers the plan
(:func:`dfdl.taskgraph.lower.lower`), submits the graph (:func:`dfdl.runtime.submit.get`)
and assembles each output from its tiles as numpy arrays by name. :func:`lowered` and
:func:`assemble` are its first and last part, for running the same graph elsewhere
(the per-op tests run it with dask's synchronous scheduler). A failed task raises a
:class:`~dfdl.errors.DfdlError` naming the node, op and tile. The same plan and feeds
give the same outputs bit for bit on any cluster.

Example:
    >>> outputs = execute(plan, {"x": x}, client)  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from dask.task_spec import DataNode, Task, TaskRef

from dfdl.plan.tiling import Plan
from dfdl.runtime import stored, submit
from dfdl.taskgraph.lower import lower, new_token, split_tiles, task_name, tile_regions

#: tiles larger than this are scattered to the workers instead of embedded in the graph
SCATTER_BYTES = 1 * 2**20


def _source_tiles(plan: Plan, feeds: dict[str, np.ndarray], client, step: int, token: str):
    """Data tasks (small tiles) or scattered futures (large ones) for every source."""
    graph = plan.graph
    read = {i for n in plan.graph.nodes for i in n.inputs if i}
    dsk, sources, keep = {}, {}, []
    names = [n for n in graph.inputs if n in read] + [n for n in graph.initializers if n in read]
    big = {}
    for name in names:
        value = feeds[name] if name in feeds else graph.initializers[name]
        kind = "input" if name in feeds else "param"
        source = stored.of_memmap(value) if name not in feeds else None
        if source is not None:  # a file's tensor (weights_dir): each worker reads its tile
            refs = {}
            for idx, region in tile_regions(plan.chunks[name]).items():
                key = (task_name(f"{name}-{kind}", token), step, *idx)
                dsk[key] = Task(key, stored.read_tile, source, region)
                refs[idx] = TaskRef(key)
            sources[name] = refs
            continue
        tiles = split_tiles(np.asarray(value), plan.chunks[name])
        refs = {}
        for idx, tile in tiles.items():
            key = (task_name(f"{name}-{kind}", token), step, *idx)
            if tile.nbytes > SCATTER_BYTES and client is not None:
                big[key] = tile
                refs[idx] = key
            else:
                dsk[key] = DataNode(key, tile)
                refs[idx] = TaskRef(key)
        sources[name] = refs
    if big:
        futures = client.scatter(big, hash=False)
        keep.extend(futures.values())
        for refs in sources.values():
            for idx, r in refs.items():
                if not isinstance(r, TaskRef):
                    refs[idx] = futures[r]
    return dsk, sources, keep


@dataclass
class ForwardPass:
    """One forward pass of a plan as a task graph (:func:`lowered`).

    Attributes:
        dsk: the tasks (source tiles included).
        want: the keys whose values make up the outputs.
        outputs: per graph output, ``{tile index: (key, position or None)}``.
        keep: scattered futures the graph reads (held until it ran).
    """

    dsk: dict
    want: list
    outputs: dict
    keep: list = field(default_factory=list)


def lowered(plan: Plan, feeds: dict[str, np.ndarray], client=None, *, step: int = 0) -> ForwardPass:
    """The task graph of one forward pass of ``plan`` on ``feeds``: tiles over
    :data:`SCATTER_BYTES` are scattered with ``client`` (embedded with None).

    Example:
        >>> p = lowered(plan, {"x": x})  # doctest: +SKIP
        >>> outputs = assemble(plan, {"x": x}, p, dict(zip(p.want, dask.get(p.dsk, p.want))))
    """
    token = new_token()
    dsk, sources, keep = _source_tiles(plan, feeds, client, step, token)
    tasks, outputs = lower(plan, sources, step=step, token=token)
    dsk.update(tasks)
    want = sorted(
        {ref for tiles in outputs.values() for ref, _ in tiles.values() if isinstance(ref, tuple)},
        key=str,
    )
    return ForwardPass(dsk, want, outputs, keep)


def assemble(plan: Plan, feeds: dict[str, np.ndarray], lowered_pass: ForwardPass, values) -> dict:
    """Each graph output as one numpy array, from the values of ``lowered_pass.want``
    (``{key: value}``)."""
    graph = plan.graph
    result = {}
    for name in graph.outputs:
        t = graph.types[name]
        if name in graph.initializers:
            result[name] = np.asarray(graph.initializers[name])
            continue
        if name in feeds:
            result[name] = np.asarray(feeds[name])
            continue
        out = np.empty(t.shape, dtype=t.dtype)
        regions = tile_regions(plan.chunks[name])
        for idx, (ref, pos) in lowered_pass.outputs[name].items():
            v = values[ref]
            out[regions[idx]] = v if pos is None else v[pos]
        result[name] = out
    return result


def execute(plan: Plan, feeds: dict[str, np.ndarray], client, *, step: int = 0) -> dict:
    """Run one forward pass of ``plan`` on ``client``'s cluster; numpy outputs by name.

    Raises:
        DfdlError: a task failed; the message names the node, op and tile.
    """
    p = lowered(plan, feeds, client, step=step)
    values = {}
    if p.want:
        values = dict(zip(p.want, submit.get(client, p.dsk, p.want, sync=True)))
    p.keep.clear()
    return assemble(plan, feeds, p, values)
