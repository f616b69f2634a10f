"""dfdl's intermediate representation: a flat list of nodes over named values.

The IR is deliberately small: nodes in topological order, values named by strings,
constants (initializers) as numpy arrays, and a static :class:`TensorType` for every
value once shapes are bound. Forward, loss, backward and optimizer nodes are all plain
IR nodes, so every later stage (tiling, lowering, export) treats them alike.

Example:
    >>> g = Graph(name="tiny", inputs=["x"], outputs=["y"],
    ...           nodes=[Node("relu0", "Relu", ["x"], ["y"])])
    >>> [n.op_type for n in g.nodes]
    ['Relu']
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dfdl.ops.registry import TensorType


@dataclass
class Node:
    """One op application. ``inputs`` may contain "" for an absent optional input."""

    name: str
    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""
    #: training phase the node belongs to ("fwd", "loss", "bwd", "update"): the task keys'
    #: second word, so the dashboard groups a node's forward and backward tasks apart
    phase: str = "fwd"
    #: values that must exist before this node's tasks run, though it does not read them
    #: (a recomputed activation waits for the gradient to reach its segment)
    after: list[str] = field(default_factory=list)

    def present_outputs(self) -> list[str]:
        return [o for o in self.outputs if o]


@dataclass
class Graph:
    """A model: nodes in topological order plus its interface and constants.

    Attributes:
        name: graph name.
        nodes: nodes in topological order.
        inputs: names of the graph's runtime inputs (initializers excluded).
        outputs: names of the graph's outputs.
        initializers: constant tensors (weights and folded constants) by name.
        types: static type of every value once shapes are bound.
        declared: declared types of the graph's inputs (and of its outputs, where the
            file gives them) as (dims, dtype); dims may hold str for symbolic
            dimensions ("batch") or None for unknown ones.
        opset: default-domain opset version the model was written for.
        producer: ONNX producer name, kept for export.
        constants: float initializers the file marks as not being parameters (see
            :func:`dfdl.ir.onnx_io.exporter_constants`); they never train.
    """

    name: str = "graph"
    nodes: list[Node] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    initializers: dict[str, np.ndarray] = field(default_factory=dict)
    types: dict[str, TensorType] = field(default_factory=dict)
    declared: dict[str, tuple[tuple, np.dtype]] = field(default_factory=dict)
    opset: int = 21
    producer: str = ""
    constants: frozenset[str] = frozenset()

    def copy(self) -> Graph:
        """A copy that shares the (read-only) initializer arrays."""
        g = copy.copy(self)
        g.nodes = [copy.deepcopy(n) for n in self.nodes]
        g.inputs = list(self.inputs)
        g.outputs = list(self.outputs)
        g.initializers = dict(self.initializers)
        g.types = dict(self.types)
        g.declared = dict(self.declared)
        return g

    def producers(self) -> dict[str, tuple[Node, int]]:
        """Value name -> (node producing it, output position)."""
        return {o: (n, i) for n in self.nodes for i, o in enumerate(n.outputs) if o}

    def consumers(self) -> dict[str, list[Node]]:
        """Value name -> nodes reading it, in graph order."""
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    out.setdefault(i, []).append(n)
        return out

    def fresh_name(self, base: str) -> str:
        """``base``, or ``base_1``, ``base_2``, ...: the first that names no value of the
        graph (input, initializer, typed value or node output).

        Example:
            >>> Graph("g", [], ["x"], []).fresh_name("x")
            'x_1'
        """
        taken = {*self.inputs, *self.initializers, *self.types}
        taken.update(o for n in self.nodes for o in n.outputs)
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        return name

    def prune(self) -> None:
        """Drop nodes and initializers that no graph output depends on."""
        needed = set(self.outputs)
        kept: list[Node] = []
        for n in reversed(self.nodes):
            if any(o in needed for o in n.outputs if o):
                kept.append(n)
                needed.update(i for i in [*n.inputs, *n.after] if i)
        self.nodes = kept[::-1]
        self.initializers = {k: v for k, v in self.initializers.items() if k in needed}
        self.types = {
            k: v
            for k, v in self.types.items()
            if k in needed or k in self.inputs or any(k in n.outputs for n in self.nodes)
        }
