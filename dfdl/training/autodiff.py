"""Reverse-mode automatic differentiation on the IR.

One short driver: walk the bound graph in reverse topological order, ask each node's
VJP rule (registered next to its op with :func:`dfdl.ops.registry.defvjp`) for the
gradients of its inputs, accumulate where a value feeds several nodes, and reduce
broadcast gradients to the input's shape in one place (:meth:`GradBuilder.reduce_to`).
The backward pass is made of ordinary IR nodes (``phase="bwd"``), so it is tiled,
lowered and tested by the same machinery as the forward pass.

Example:
    >>> grads = gradients(graph, loss="loss", wrt=["w"])  # doctest: +SKIP
    >>> graph.outputs.append(grads["w"])                  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from dfdl.errors import DfdlError, ShapeError, UnsupportedOpError
from dfdl.ir.graph import Graph, Node
from dfdl.ops import lookup
from dfdl.ops.registry import TensorType


class GradBuilder:
    """Appends backward nodes to a bound graph, typing each one as it is added.

    VJP rules call :meth:`op` to emit registry ops, :meth:`const` for constants and
    :meth:`type` for static types.
    """

    def __init__(self, graph: Graph, phase: str = "bwd"):
        self.graph = graph
        self.phase = phase
        self.node: Node | None = None
        self._count: dict[str, int] = {}

    def type(self, name: str) -> TensorType:
        """Static type of a value."""
        return self.graph.types[name]

    def _fresh(self, hint: str) -> str:
        k = self._count.get(hint, 0)
        self._count[hint] = k + 1
        name = f"{hint}_{k}" if k else hint
        while name in self.graph.types or name in self.graph.initializers:
            k += 1
            self._count[hint] = k + 1
            name = f"{hint}_{k}"
        return name

    def const(self, value: Any, dtype=None, hint: str = "const") -> str:
        """Add a constant initializer; returns its name."""
        arr = np.asarray(value, dtype=dtype)
        owner = self.node.name if self.node is not None else "grad"
        name = self._fresh(f"{owner}.{hint}")
        self.graph.initializers[name] = arr
        self.graph.types[name] = TensorType(arr.shape, arr.dtype)
        return name

    def op(
        self,
        op_type: str,
        inputs: Sequence[str | None],
        attrs: dict | None = None,
        *,
        domain: str = "",
        n_outputs: int = 1,
    ) -> Any:
        """Append one node; returns its output name (or a list when ``n_outputs > 1``)."""
        op = lookup(op_type, domain)
        if op is None:
            raise UnsupportedOpError(f"gradient rule uses unknown op {domain}.{op_type}")
        owner = self.node.name if self.node is not None else "grad"
        # "{forward node}.{op}": the dashboard shows e.g. "conv1.ConvGradWeight-bwd"
        name = self._fresh(f"{owner}.{op_type}")
        outs = [self._fresh(f"{name}.out{i}") if n_outputs > 1 else name for i in range(n_outputs)]
        node = Node(name, op_type, [i or "" for i in inputs], outs, dict(attrs or {}), domain)
        node.phase = self.phase
        g = self.graph
        ins = [g.types[i] if i else None for i in node.inputs]
        consts = [g.initializers.get(i) if i else None for i in node.inputs]
        try:
            types = op.shape(ins, consts, **node.attrs)
        except DfdlError:
            raise
        except Exception as e:
            raise ShapeError(
                f"gradient node {name!r} ({op_type}) of {owner!r}: invalid shapes "
                f"{[None if t is None else list(t.shape) for t in ins]}: {e}"
            ) from e
        for o, t in zip(outs, types):
            g.types[o] = t
        g.nodes.append(node)
        return outs if n_outputs > 1 else outs[0]

    def reduce_to(self, grad: str, target: TensorType) -> str:
        """Sum a broadcast gradient down to ``target``'s shape (the one place it is done)."""
        shape = self.type(grad).shape
        if shape == target.shape:
            return grad
        lead = len(shape) - len(target.shape)
        axes = list(range(lead)) + [
            lead + i for i, d in enumerate(target.shape) if d == 1 and shape[lead + i] != 1
        ]
        out = grad
        if axes:
            out = self.op("ReduceSum", [out, self.const(axes, np.int64, "axes")], {"keepdims": 1})
        return self.op("Reshape", [out, self.const(target.shape, np.int64, "shape")])

    def add_all(self, grads: list[str]) -> str:
        """Sum gradient contributions pairwise in a fixed order (a balanced tree)."""
        while len(grads) > 1:
            grads = [
                self.op("Add", grads[i : i + 2]) if i + 1 < len(grads) else grads[i]
                for i in range(0, len(grads), 2)
            ]
        return grads[0]


def _float(t: TensorType | None) -> bool:
    return t is not None and t.dtype.kind == "f"


def _reachable(graph: Graph, wrt: Iterable[str]) -> set[str]:
    """Values that depend differentiably on ``wrt``."""
    reach = set(wrt)
    for node in graph.nodes:
        op = lookup(node.op_type, node.domain)
        if op is None or not op.differentiable:
            continue
        if any(i in reach for i in node.inputs if i):
            reach.update(o for o in node.outputs if o and _float(graph.types.get(o)))
    return reach


def gradients(
    graph: Graph,
    loss: str,
    wrt: Sequence[str],
    *,
    seed: str | None = None,
    record: dict[str, str] | None = None,
) -> dict:
    """Append the backward pass of ``loss`` to ``graph``; gradient names by ``wrt`` name.

    Args:
        graph: a bound graph (every value typed); modified in place.
        loss: the value to differentiate (any shape; with ``seed=None`` its gradient is
            all ones, i.e. the gradient of the sum of its elements).
        wrt: values (graph inputs or initializers) to differentiate with respect to.
        seed: optional name of the value holding dloss (same shape as ``loss``).
        record: if given, filled with ``{value: its whole gradient}`` for every node output
            the backward pass reaches (recomputation waits on these).

    Returns:
        ``{name: gradient value name}`` for each of ``wrt`` (None where ``loss`` does not
        depend on it).

    Raises:
        UnsupportedOpError: a node on the path from ``wrt`` to ``loss`` has no VJP rule.
    """
    b = GradBuilder(graph)
    reach = _reachable(graph, wrt)
    if loss not in reach:
        return {w: None for w in wrt}
    grads: dict[str, list[str]] = {}
    lt = graph.types[loss]
    grads[loss] = [seed or b.const(np.ones(lt.shape, lt.dtype), hint="dloss")]
    forward = list(graph.nodes)
    for node in reversed(forward):
        outs = [o for o in node.outputs if o]
        if not any(o in grads for o in outs):
            continue
        needs = [bool(i) and i in reach and _float(graph.types.get(i)) for i in node.inputs]
        if not any(needs):
            continue
        op = lookup(node.op_type, node.domain)
        if op.vjp is None:
            raise UnsupportedOpError(
                f"node {node.name!r} ({node.op_type}) has no gradient rule in dfdl, but "
                "the loss depends on its inputs. Freeze what feeds it or replace the op.",
                op_type=node.op_type,
                node=node.name,
            )
        b.node = node
        dys = [b.add_all(grads[o]) if o in grads else None for o in node.outputs]
        for o, d in zip(node.outputs, dys):
            if d is not None:
                grads[o] = [d]
                if record is not None:
                    record[o] = d
        gin = op.vjp(b, node, dys)
        for name, g, need in zip(node.inputs, gin, needs):
            if g is not None and need:
                grads.setdefault(name, []).append(b.reduce_to(g, graph.types[name]))
    b.node = None
    return {w: (b.add_all(grads[w]) if w in grads else None) for w in wrt}
