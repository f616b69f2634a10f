"""Fold a Transpose of the last two axes into the matrix product that reads it.

The gradients of a product are products with a transposed operand (``dX = dY @ W^T``,
``dV = P^T @ dC`` in attention), and models transpose keys and weights themselves. A
Transpose task writes a reordered copy of its tile (the task's output rests
C-contiguous on the worker), which the product then reads once more; BLAS could have
read the original in place with its transpose flag. On the zoo's transformer these
copies took 281 ms of thread time per step, 175 ms of them in swaps of the last two
axes that feed a product (the attention's ``(8, 8, 256, 256)`` probabilities the
largest, 14-24 ms each).

This rewrite of the differentiated training graph, in place, turns each ``MatMul(A, B)``
one of whose operands is the output of ``Transpose(X, perm=[0, ..., r-1, r-2])`` into
``dfdl.MatMulT(X, B, transA=1)`` (or ``transB``). A Transpose nothing else reads is
then dropped by the graph's pruning. The arithmetic is the same product, summed by BLAS
in the order of the transposed layout, so results agree with the unfolded graph to
rounding, not bit for bit, and stay independent of where tasks run.

Example:
    >>> n = fold_transposes(graph)  # doctest: +SKIP
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
