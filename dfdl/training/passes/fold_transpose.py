"""Fold a Transpose of the last two axes into the matrix product that reads it.

The gradients of a product are products with a transposed operand (``dX = dY @ W^T``,
``dV = P^T @ dC`` in attention), and a Transpose task writes a reordered copy of its tile
that the product then reads once more, where BLAS could have read the original in place
with its transpose flag. :func:`fold_transposes` rewrites the differentiated training
graph, in place: each ``MatMul(A, B)`` one of whose operands is the output of
``Transpose(X, perm=[0, ..., r-1, r-2])`` becomes ``dfdl.MatMulT(X, B, transA=1)`` (or
``transB``), and a Transpose nothing else reads is then dropped by the graph's pruning.
:func:`dfdl.training.graph.build_training_graph` runs it unless ``fold=False``.

Guarantees: the arithmetic is the same product, summed by BLAS in the order of the
transposed layout, so results agree with the unfolded graph to rounding (not always bit
for bit) and stay independent of where tasks run.

Example:
    >>> n = fold_transposes(graph)  # doctest: +SKIP

Measurements: ``docs/design/fold-transpose.md``.
"""

from __future__ import annotations

from dfdl.ir.graph import Graph, Node
from dfdl.ops.registry import DFDL_DOMAIN


def _swaps_last_two(node: Node, rank: int) -> bool:
    """Whether a Transpose swaps its last two axes and keeps the others in place."""
    perm = node.attrs.get("perm")
    if perm is None:  # ONNX's default reverses the axes
        perm = list(range(rank))[::-1]
    perm = [int(p) for p in perm]
    return rank >= 2 and perm == [*range(rank - 2), rank - 1, rank - 2]


def fold_transposes(graph: Graph) -> int:
    """Rewrite every MatMul that reads a last-two-axes Transpose as a ``dfdl.MatMulT``
    that reads the Transpose's input, in place (the Transpose stays for its other
    readers; :meth:`Graph.prune` drops it when there are none).

    Returns:
        How many operands were folded.

    Example:
        >>> fold_transposes(tg.graph)  # doctest: +SKIP
        24
    """
    producer = {o: n for n in graph.nodes for o in n.present_outputs()}

    def source(value: str) -> str | None:
        t = producer.get(value)
        if (
            t is None
            or t.op_type != "Transpose"
            or t.domain
            or t.after  # its ordering edge would be lost with it
            or value not in graph.types
            or not _swaps_last_two(t, graph.types[value].rank)
        ):
            return None
        return t.inputs[0]

    folded = 0
    nodes = []
    for n in graph.nodes:
        if n.op_type != "MatMul" or n.domain:
            nodes.append(n)
            continue
        srcs = [source(v) for v in n.inputs[:2]]
        if srcs == [None, None]:
            nodes.append(n)
            continue
        inputs = [s or v for s, v in zip(srcs, n.inputs[:2], strict=True)]
        attrs = {"transA": int(srcs[0] is not None), "transB": int(srcs[1] is not None)}
        nodes.append(Node(n.name, "MatMulT", inputs, list(n.outputs), attrs, DFDL_DOMAIN,
                          n.phase, list(n.after)))  # fmt: skip
        folded += sum(s is not None for s in srcs)
    graph.nodes = nodes
    return folded
