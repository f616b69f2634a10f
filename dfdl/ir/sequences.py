"""Sequence ops rewritten into tensor ops while shapes are bound.

ONNX sequences (``seq(tensor)`` values) are what torch's exporter emits for
``torch.chunk``/``torch.split`` with ``optimize=False``: a ``SplitToSequence`` read by
``SequenceAt`` or ``ConcatFromSequence``. dfdl's tiles carry tensors only, so
:func:`lower_sequences` follows every sequence at plan time as a python list of tensor
value names and replaces its ops by tensor ops the registry has: ``SplitToSequence``
becomes ``Split`` (plus ``Squeeze`` with ``keepdims=0``), ``SequenceAt`` names one
element (an ``Identity`` where the element is a graph output), ``ConcatFromSequence``
becomes ``Concat`` (of ``Unsqueeze``\\ d elements with ``new_axis=1``) and
``SequenceLength`` a ``Constant``; ``SequenceConstruct``, ``SequenceEmpty``,
``SequenceInsert``, ``SequenceErase`` and ``Identity`` of a sequence edit the list. No
sequence value reaches the tiler, and gradients flow through the Split and Concat.

That needs every length and position to be static: a split's sizes, and the positions
of ``SequenceAt``/``SequenceInsert``/``SequenceErase``, must be constants (or inputs
whose values ``bind`` is given). Otherwise, and where a sequence is a graph output or
is read by any other op, :class:`~dfdl.errors.UnsupportedOpError` names the node.

Example:
    >>> from dfdl.ir.graph import Node
    >>> nodes = [Node("s", "SplitToSequence", ["x"], ["seq"], {"axis": 1}),
    ...          Node("a", "SequenceAt", ["seq", "one"], ["y"])]
    >>> # inside dfdl.ir.bind.bind, where x has type (2, 3) and "one" is the constant 1:
    >>> # Split(x, [1, 1, 1], axis=1) -> seq__0, seq__1, seq__2; y is seq__1
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import numpy as np

from dfdl.errors import ModelError, UnsupportedOpError
from dfdl.ir.graph import Graph, Node
from dfdl.ops.registry import TensorType

#: the default-domain ops :func:`lower_sequences` rewrites away
SEQUENCE_OPS = frozenset(
    {
        "SplitToSequence",
        "SequenceAt",
        "ConcatFromSequence",
        "SequenceConstruct",
        "SequenceEmpty",
        "SequenceInsert",
        "SequenceErase",
        "SequenceLength",
    }
)


def is_sequence_op(node: Node) -> bool:
    """Whether ``node`` is a sequence op that binding rewrites into tensor ops.

    Example:
        >>> is_sequence_op(Node("a", "SequenceAt", ["s", "p"], ["y"]))
        True
    """
    return not node.domain and node.op_type in SEQUENCE_OPS


def _int_list(value) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]


class _Lowering:
    """The state of one :func:`lower_sequences` pass: each sequence as a list of
    tensor value names, and the tensor values renamed to sequence elements."""

    def __init__(self, graph: Graph, consts: dict[str, np.ndarray], values) -> None:
        self.graph = graph
        self.consts = consts
        self.values = values or {}
        self.seqs: dict[str, list[str]] = {}
        self.alias: dict[str, str] = {}
        #: the node that made each value (the error for a sequence graph output names it)
        self.made: dict[str, Node] = {}
        #: names in use (collected at the first rewrite: most graphs have no sequence)
        self.taken: set[str] | None = None

    # -------------------------------------------------------------- helpers

    def fresh(self, base: str) -> str:
        if self.taken is None:
            g = self.graph
            self.taken = {*g.inputs, *g.initializers, *g.types}
            self.taken.update(o for n in g.nodes for o in n.outputs if o)
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name

    def constant(self, node: Node, hint: str, value) -> tuple[Node, str]:
        """A Constant node (folded by bind) holding ``value``, and its output name."""
        out = self.fresh(f"{node.name}__{hint}")
        return Node(f"{out}_const", "Constant", [], [out], {"value": np.asarray(value)}), out

    def seq(self, node: Node, k: int = 0) -> list[str]:
        name = node.inputs[k] if k < len(node.inputs) else ""
        if name not in self.seqs:
            raise ModelError(
                f"node {node.name!r} ({node.op_type}): input {k} ({name!r}) is not a sequence "
                "built by SplitToSequence, SequenceConstruct, SequenceEmpty, SequenceInsert "
                "or SequenceErase"
            )
        return self.seqs[name]

    def static(self, node: Node, k: int, what: str) -> np.ndarray | None:
        """Input ``k``'s value, known at plan time; None where the input is absent."""
        name = node.inputs[k] if k < len(node.inputs) else ""
        if not name:
            return None
        if name not in self.consts and name in self.values:
            self.consts[name] = np.asarray(self.values[name])
        if name not in self.consts:
            raise UnsupportedOpError(
                f"node {node.name!r} ({node.op_type}): its {what} ({name!r}) is not known "
                "before running, so the sequence's length or element is not static; dfdl "
                "rewrites sequences into tensor ops at plan time and needs it to be a "
                "constant (or computed from static shapes).",
                op_type=node.op_type,
                node=node.name,
            )
        return self.consts[name]

    def position(self, node: Node, k: int, length: int, default: int, insert: bool) -> int:
        value = self.static(node, k, "position")
        if value is None:
            return default
        p = int(np.asarray(value).reshape(-1)[0]) if np.size(value) == 1 else None
        top = length if insert else length - 1
        if p is None or not -length <= p <= top:
            raise ModelError(
                f"node {node.name!r} ({node.op_type}): position {_int_list(value)} is out "
                f"of range [-{length}, {top}] for a sequence of {length} tensors"
            )
        return p + length if p < 0 else p

    def type_of(self, node: Node, name: str) -> TensorType:
        t = self.graph.types.get(name)
        if t is None:
            raise ModelError(f"node {node.name!r}: input {name!r} is never produced")
        return t

    # -------------------------------------------------------------- the ops

    def rewrite(self, node: Node) -> Iterator[Node]:
        op = node.op_type
        out = node.outputs[0]
        self.made[out] = node
        if op == "SequenceEmpty":
            self.seqs[out] = []
        elif op == "SequenceConstruct":
            self.seqs[out] = list(node.inputs)
        elif op == "Identity":
            self.seqs[out] = list(self.seq(node))
        elif op == "SequenceInsert":
            items = list(self.seq(node))
            items.insert(self.position(node, 2, len(items), len(items), True), node.inputs[1])
            self.seqs[out] = items
        elif op == "SequenceErase":
            items = list(self.seq(node))
            if not items:
                raise ModelError(f"node {node.name!r} (SequenceErase): the sequence is empty")
            del items[self.position(node, 1, len(items), len(items) - 1, False)]
            self.seqs[out] = items
        elif op == "SequenceLength":
            length = np.array(len(self.seq(node)), np.int64)
            yield Node(node.name, "Constant", [], [out], {"value": length})
        elif op == "SequenceAt":
            items = self.seq(node)
            if not items:
                raise ModelError(f"node {node.name!r} (SequenceAt): the sequence is empty")
            item = items[self.position(node, 1, len(items), 0, False)]
            yield from self.publish(out, item)
        elif op == "SplitToSequence":
            yield from self.split(node)
        elif op == "ConcatFromSequence":
            yield from self.concat(node)

    def publish(self, out: str, item: str) -> Iterator[Node]:
        """``out`` names tensor ``item``: renamed in later nodes, or an Identity where
        ``out`` is a graph output (whose name must stay)."""
        if out in self.graph.outputs:
            yield Node(f"{out}_identity", "Identity", [item], [out])
        else:
            self.alias[out] = item

    def split(self, node: Node) -> Iterator[Node]:
        x, out = node.inputs[0], node.outputs[0]
        t = self.type_of(node, x)
        axis = int(node.attrs.get("axis", 0))
        if not -t.rank <= axis < t.rank:
            raise ModelError(
                f"node {node.name!r} (SplitToSequence): axis {axis} is out of range for "
                f"rank {t.rank}"
            )
        axis %= t.rank
        dim = t.shape[axis]
        split = self.static(node, 1, "split input")
        squeeze = split is None and not int(node.attrs.get("keepdims", 1))
        if split is None:
            sizes = [1] * dim
        elif np.ndim(split) == 0:
            size = int(split)
            if size <= 0:
                raise ModelError(
                    f"node {node.name!r} (SplitToSequence): split {size} must be positive"
                )
            sizes = [size] * (dim // size) + ([dim % size] if dim % size else [])
        else:
            sizes = _int_list(split)
            if sum(sizes) != dim or min(sizes, default=0) < 0:
                raise ModelError(
                    f"node {node.name!r} (SplitToSequence): sizes {sizes} do not add up "
                    f"to {dim}, the size of axis {axis} of {x!r} {list(t.shape)}"
                )
        parts = [self.fresh(f"{out}__{k}") for k in range(len(sizes))]
        self.seqs[out] = parts
        if not parts:
            return
        const, sizes_name = self.constant(node, "sizes", np.array(sizes, np.int64))
        yield const
        if not squeeze:
            yield Node(node.name, "Split", [x, sizes_name], parts, {"axis": axis})
            return
        kept = [self.fresh(f"{p}_kept") for p in parts]
        yield Node(node.name, "Split", [x, sizes_name], kept, {"axis": axis})
        const, axes = self.constant(node, "axes", np.array([axis], np.int64))
        yield const
        for k, (src, dst) in enumerate(zip(kept, parts, strict=True)):
            yield Node(f"{node.name}__squeeze{k}", "Squeeze", [src, axes], [dst])

    def concat(self, node: Node) -> Iterator[Node]:
        items = self.seq(node)
        out = node.outputs[0]
        if not items:
            raise ModelError(
                f"node {node.name!r} (ConcatFromSequence): the sequence is empty; there is "
                "nothing to concatenate"
            )
        axis = int(node.attrs["axis"])
        if int(node.attrs.get("new_axis", 0)):
            rank = self.type_of(node, items[0]).rank + 1
            if not -rank <= axis < rank:
                raise ModelError(
                    f"node {node.name!r} (ConcatFromSequence): axis {axis} is out of range "
                    f"[-{rank}, {rank - 1}] with new_axis=1"
                )
            axis %= rank
            const, axes = self.constant(node, "axes", np.array([axis], np.int64))
            yield const
            stacked = []
            for k, item in enumerate(items):
                name = self.fresh(f"{out}__item{k}")
                yield Node(f"{node.name}__unsqueeze{k}", "Unsqueeze", [item, axes], [name])
                stacked.append(name)
            items = stacked
        yield Node(node.name, "Concat", list(items), [out], {"axis": axis})


def lower_sequences(
    nodes: Iterable[Node],
    graph: Graph,
    consts: dict[str, np.ndarray],
    values: Mapping[str, np.ndarray] | None = None,
) -> Iterator[Node]:
    """Yield ``nodes`` with every sequence op replaced by tensor nodes.

    Meant to be consumed one node at a time by :func:`dfdl.ir.bind.bind`: when a node
    is rewritten, every node yielded before it has been bound, so ``graph.types`` holds
    its inputs' static types and ``consts`` the plan-time values (including those bind
    folded). Later nodes read sequence elements under the elements' own names.

    Args:
        nodes: the graph's nodes, in order.
        graph: the graph being bound (its ``types``, ``inputs`` and ``outputs``).
        consts: plan-time constant values by name (bind's folded initializers).
        values: graph inputs' values where known (``dfdl.run``): a position or split
            input fed at run time is then taken as a constant, as bind does for shapes.

    Raises:
        UnsupportedOpError: a length or position is not known at plan time, a sequence
            is a graph output, or an op other than a sequence op reads a sequence.
        ModelError: a position out of range, split sizes that do not add up.

    Example:
        >>> for node in lower_sequences(g.nodes, g, g.initializers):  # doctest: +SKIP
        ...     bind_one(node)
    """
    state = _Lowering(graph, consts, values)
    for node in nodes:
        node.inputs = [state.alias.get(i, i) for i in node.inputs]
        node.after = [state.alias.get(i, i) for i in node.after]
        reads_seq = [i for i in node.inputs if i in state.seqs]
        if is_sequence_op(node) or (node.op_type == "Identity" and not node.domain and reads_seq):
            yield from state.rewrite(node)
            continue
        if reads_seq:
            raise UnsupportedOpError(
                f"node {node.name!r} ({node.op_type}) reads the sequence {reads_seq[0]!r}; "
                "dfdl supports sequences only through SequenceAt, ConcatFromSequence, "
                "SequenceLength, SequenceInsert, SequenceErase and Identity.",
                op_type=node.op_type,
                node=node.name,
            )
        yield node
    outputs = [o for o in graph.outputs if o in state.seqs]
    if outputs:
        made = state.made[outputs[0]]
        raise UnsupportedOpError(
            f"graph output {outputs[0]!r} (made by node {made.name!r}, {made.op_type}) is a "
            "sequence; dfdl's outputs are tensors (read the elements with SequenceAt or join "
            "them with ConcatFromSequence).",
            op_type=made.op_type,
            node=made.name,
        )
