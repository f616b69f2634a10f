"""Recomputation (gradient checkpointing): forward compute traded for memory and disk.

The forward nodes of a training graph are cut into segments of about √n nodes each. A
segment's *checkpoints* are the values it hands to other segments, to the loss or to
the graph's outputs; what else it makes that the backward pass reads are its
*activations*. Recomputing a segment gives the backward pass clones of those
activations instead: copies of the segment's nodes (``{node}.recompute``, phase
``"recompute"``) that start from the checkpoints and wait (the node's ``after``
values, an ordering edge in lowering) until the gradient has reached the segment. The
originals are then freed as soon as the forward pass has read them, so one segment's
activations exist at a time instead of all of them, at the price of running the
segment's forward nodes twice. The clones are the same ops, tiled the same way (their
inputs have the same roles), so they compute the same bits: the losses and weights of
a recomputing run equal a spilling run's.

The last segment is never recomputed: its activations are the first the backward pass
reads.

Example:
    >>> segs = segments(tg.graph, tg.grad_of)          # doctest: +SKIP
    >>> clones = recompute(tg.graph, segs)             # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dfdl.ir.graph import Graph, Node
from dfdl.ops.registry import node_cost

#: the clones' phase: task keys read ``f"{node}.recompute-recompute"`` in the dashboard
PHASE = "recompute"
#: the clones' name suffix (nodes and values)
SUFFIX = ".recompute"


@dataclass(frozen=True)
class Segment:
    """A run of forward nodes recomputed (or not) as one.

    Attributes:
        index: position among the segments, in forward order.
        nodes: the forward node names, in order.
        activations: the values the backward pass reads that recomputing rebuilds.
        saved_bytes: their bytes: what recomputing keeps out of memory (or off disk).
        flops: forward FLOPs of the nodes that recomputing runs again.
        rebuilt: the node names recomputing runs again (those leading from the
            checkpoints to the activations), in order.
        signal: the gradient value whose arrival starts the recomputation.
    """

    index: int
    nodes: tuple[str, ...]
    activations: tuple[str, ...]
    saved_bytes: int
    flops: int
    rebuilt: tuple[str, ...]
    signal: str


def segments(graph: Graph, grad_of: Mapping[str, str], size: int | None = None) -> list[Segment]:
    """The segments of a training graph that recomputation could rebuild.

    Args:
        graph: a bound training graph (forward nodes have phase ``"fwd"``, backward
            nodes ``"bwd"``).
        grad_of: value -> its gradient, as :func:`dfdl.training.autodiff.gradients` records.
        size: forward nodes per segment (default ⌈√n⌉ for n forward nodes).

    Returns:
        The segments with activations to rebuild, the last segment excepted, in order.

    Example:
        >>> [s.nodes for s in segments(tg.graph, tg.grad_of)]  # doctest: +SKIP
    """
    fwd = [n for n in graph.nodes if n.phase == "fwd"]
    if not fwd:
        return []
    size = size or max(1, math.ceil(math.sqrt(len(fwd))))
    seg_of = {n.name: i // size for i, n in enumerate(fwd)}
    made_in = {o: seg_of[n.name] for n in fwd for o in n.outputs if o}
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    producer = graph.producers()
    consumers = graph.consumers()
    outputs = set(graph.outputs)

    def checkpoint(value: str) -> bool:
        if value in outputs:
            return True
        for c in consumers.get(value, ()):
            if c.phase == "fwd" and seg_of[c.name] != made_in[value]:
                return True
            if c.phase not in ("fwd", "bwd"):  # the loss, the optimizer
                return True
        return False

    last = max(seg_of.values())
    out = []
    for j in range(last):
        nodes = [n for n in fwd if seg_of[n.name] == j]
        acts = [
            o
            for n in nodes
            for o in n.outputs
            if o
            and not checkpoint(o)
            and any(c.phase == "bwd" for c in consumers.get(o, ()))
            and graph.types[o].dtype.kind == "f"
        ]
        if not acts:
            continue
        readers = [position[c.name] for a in acts for c in consumers[a] if c.phase == "bwd"]
        first = min(readers)
        # the latest gradient of the segment's outputs made before its first reader
        signals = [
            (position[producer[grad_of[o]][0].name], grad_of[o])
            for n in nodes
            for o in n.outputs
            if o in grad_of and grad_of[o] in producer
        ]
        signals = [s for s in signals if s[0] < first]
        if not signals:
            continue
        rebuilt = _closure(nodes, acts, made_in, j, checkpoint)
        out.append(
            Segment(
                index=j,
                nodes=tuple(n.name for n in nodes),
                activations=tuple(acts),
                saved_bytes=sum(graph.types[a].nbytes for a in acts),
                flops=sum(node_cost(n, graph.types).flops for n in rebuilt),
                rebuilt=tuple(n.name for n in rebuilt),
                signal=min(signals)[1],
            )
        )
    return out


def _closure(nodes: list[Node], acts, made_in, j: int, checkpoint) -> list[Node]:
    """The segment's nodes that rebuilding ``acts`` runs, in order."""
    need = set(acts)
    picked = []
    for n in reversed(nodes):
        if any(o in need for o in n.outputs if o):
            picked.append(n)
            need.update(i for i in n.inputs if i and made_in.get(i) == j and not checkpoint(i))
    return picked[::-1]


def recompute(graph: Graph, chosen: Iterable[Segment]) -> dict[str, str]:
    """Rebuild the ``chosen`` segments' activations in the backward pass, in place.

    Each chosen segment's ``rebuilt`` nodes are cloned (phase ``"recompute"``, names and
    values suffixed ``.recompute``, waiting on the segment's ``signal``) just before the
    first backward node that reads an activation, and the backward nodes read the clones.

    Returns:
        clone node name -> original node name (random ops use the original's seed).

    Example:
        >>> clones = recompute(tg.graph, segments(tg.graph, tg.grad_of))  # doctest: +SKIP
    """
    clones: dict[str, str] = {}
    for seg in chosen:
        by_name = {n.name: n for n in graph.nodes}
        renamed: dict[str, str] = {}
        copies = []
        for name in seg.rebuilt:
            n = by_name[name]
            copy = Node(
                n.name + SUFFIX,
                n.op_type,
                [renamed.get(i, i) for i in n.inputs],
                [o + SUFFIX if o else "" for o in n.outputs],
                dict(n.attrs),
                n.domain,
                phase=PHASE,
                after=[seg.signal],
            )
            for o in n.outputs:
                if o:
                    renamed[o] = o + SUFFIX
                    graph.types[o + SUFFIX] = graph.types[o]
            copies.append(copy)
            clones[copy.name] = n.name
        acts = set(seg.activations)
        first = None
        for k, n in enumerate(graph.nodes):
            if n.phase == "bwd" and any(i in acts for i in n.inputs):
                first = k if first is None else first
                n.inputs = [renamed[i] if i in acts else i for i in n.inputs]
        graph.nodes[first:first] = copies
    return clones


#: the ways ``dfdl.train(memory=...)`` keeps activations for the backward pass
MODES = ("spill", "recompute", "auto")


def choose(
    segs: Iterable[Segment], excess_bytes: int, flops_per_s: float, disk_bytes_per_s: float
) -> list[Segment]:
    """The segments ``memory="auto"`` recomputes: enough to keep the step from spilling,
    or none.

    A segment qualifies when running its forward nodes again (``flops / flops_per_s``)
    takes less time than spilling its activations (written once and read back once at
    ``disk_bytes_per_s``). Qualifying segments are taken, the most bytes saved per
    second of recompute first, until ``excess_bytes`` (what the plan would spill per
    step) is covered. When they cannot cover it, none is taken: the step spills either
    way, and measured spill traffic is then no lower with recompute (tiles are evicted
    and read back several times per step, and rebuilding rereads the checkpoints; see
    ``docs/design/beyond-memory.md``), so recomputing only adds compute.

    Example:
        >>> choose(segments(g, grads), excess_bytes=2**30, flops_per_s=5e10,
        ...        disk_bytes_per_s=1e9)  # doctest: +SKIP
    """
    picked = []
    for s in sorted(segs, key=lambda s: s.flops / max(1, s.saved_bytes)):
        if excess_bytes <= 0:
            break
        if s.flops / flops_per_s < 2 * s.saved_bytes / disk_bytes_per_s:
            picked.append(s)
            excess_bytes -= s.saved_bytes
    if excess_bytes > 0:
        return []
    return sorted(picked, key=lambda s: s.index)
