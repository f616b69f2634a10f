"""Bind input shapes, infer every static shape, and fold the constant path.

After :func:`bind`, every value of the graph has a concrete :class:`TensorType`, every
node whose inputs are all known at plan time (``Shape`` of a static tensor, ``Constant``,
shape arithmetic, ``Reshape`` targets built by ``Concat``...) is replaced by an
initializer, and each remaining node is checked against the registry: op supported,
attributes accepted, shape-parameter inputs constant. Everything raises a ``dfdl``
error naming the node before any task exists; ops missing from the registry are
refused first, all of them in one :class:`UnsupportedOpError` (:func:`unsupported_ops`).

Example:
    >>> import dfdl.models
    >>> from dfdl.ir.onnx_io import to_ir
    >>> g = bind(to_ir(dfdl.models.mlp((4, 3))), {"x": TensorType((8, 4), "float32")})
    >>> g.types["logits"].shape
    (8, 3)
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from functools import cache

import numpy as np
from dask.utils import format_bytes

from dfdl.errors import DfdlError, MemoryPlanError, ModelError, ShapeError, UnsupportedOpError
from dfdl.ir.graph import Graph, Node
from dfdl.ir.onnx_io import node_list
from dfdl.ir.sequences import is_sequence_op, lower_sequences
from dfdl.ops import REGISTRY, lookup
from dfdl.ops.registry import ONNX_DOMAINS, OpDef, TensorType

#: constant folding stops at outputs this large: they stay ordinary tiled nodes (a
#: ``ConstantOfShape`` becomes an ``Expand`` of its fill value), never allocated here
FOLD_LIMIT_BYTES = 64 * 2**20
#: inputs of which only the static type is read (Shape's data, CastLike's target_type):
#: they never make a node runtime-dependent, and their runtime values are never needed
TYPE_ONLY_INPUTS = {"Shape": (0,), "Size": (0,), "CastLike": (1,)}
#: ops with subgraph attributes (control flow), none of which dfdl runs
CONTROL_FLOW = ("If", "Loop", "Scan")


def supported_ops() -> list[str]:
    """Sorted names of every op dfdl can run."""
    return sorted(REGISTRY)


@cache
def _accepted_attrs(forward) -> tuple[frozenset[str], bool]:
    params = inspect.signature(forward).parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return frozenset(), True
    return frozenset(p.name for p in params if p.kind == p.KEYWORD_ONLY), False


def unsupported_ops(nodes: Iterable[Node]) -> dict[str, list[str]]:
    """Every op of ``nodes`` that dfdl's registry lacks -> the names of the nodes using it.

    Ops outside the default domain are named ``"domain.Op"``; ops and nodes are in graph
    order.

    Example:
        >>> nodes = [Node("d0", "Det", ["x"], ["y"]), Node("r", "Relu", ["y"], ["z"])]
        >>> unsupported_ops(nodes + [Node("d1", "Det", ["z"], ["w"])])
        {'Det': ['d0', 'd1']}
    """
    out: dict[str, list[str]] = {}
    for n in nodes:
        if lookup(n.op_type, n.domain) is None and not is_sequence_op(n):
            key = n.op_type if n.domain in ONNX_DOMAINS else f"{n.domain}.{n.op_type}"
            out.setdefault(key, []).append(n.name)
    return out


def describe_unsupported(ops: dict[str, list[str]]) -> str:
    """``unsupported_ops``' result as one line: each op with its first nodes and count.

    Example:
        >>> describe_unsupported({"Det": ["d0"], "Unique": ["u0", "u1", "u2", "u3"]})
        "'Det' (node 'd0'); 'Unique' (4 nodes: 'u0', 'u1', 'u2' and 1 more)"
    """
    return "; ".join(f"{op!r} ({node_list(names)})" for op, names in ops.items())


def _unsupported_error(graph: Graph, ops: dict[str, list[str]]) -> UnsupportedOpError:
    first = next(
        n for n in graph.nodes if lookup(n.op_type, n.domain) is None and not is_sequence_op(n)
    )
    count = f"{len(ops)} ops of the model are" if len(ops) > 1 else "1 op of the model is"
    flow = sorted({op for op in ops if op in CONTROL_FLOW})
    note = f" ({'/'.join(flow)}: dfdl does not support control flow.)" if flow else ""
    return UnsupportedOpError(
        f"{count} not supported by dfdl (default-domain opset {graph.opset}): "
        f"{describe_unsupported(ops)}.{note} Supported ops: {', '.join(supported_ops())}.",
        op_type=first.op_type,
        node=first.name,
        domain=first.domain,
        opset=graph.opset,
        ops=ops,
    )


def check_node(node: Node, opset: int | None = None) -> OpDef:
    """The node's OpDef, or UnsupportedOpError naming op, domain, node and the op list."""
    op = lookup(node.op_type, node.domain)
    if op is None:
        where = f" of domain {node.domain!r}" if node.domain else ""
        raise UnsupportedOpError(
            f"node {node.name!r}: op {node.op_type!r}{where} (opset {opset}) is not "
            f"supported by dfdl. Supported ops: {', '.join(supported_ops())}.",
            op_type=node.op_type,
            node=node.name,
            domain=node.domain,
            opset=opset,
        )
    names, anything = _accepted_attrs(op.forward)
    if not anything:
        extra = sorted(a for a in node.attrs if a not in names)
        if extra:
            raise UnsupportedOpError(
                f"node {node.name!r} ({node.op_type}): attribute(s) {extra} not supported "
                f"by dfdl's {node.op_type} (it accepts {sorted(names)}).",
                op_type=node.op_type,
                node=node.name,
                opset=opset,
            )
    return op


def _check_input(name: str, declared, given: TensorType, symbols: dict[str, int]) -> None:
    dims, dtype = declared
    if dtype is not None and np.dtype(dtype) != given.dtype:
        raise ShapeError(
            f"input {name!r}: expected dtype {np.dtype(dtype)}, got {given.dtype}",
            name=name,
            expected=np.dtype(dtype),
            given=given.dtype,
        )
    if dims is None:
        return
    if len(dims) != len(given.shape):
        raise ShapeError(
            f"input {name!r}: expected rank {len(dims)} (shape {list(dims)}), "
            f"got shape {list(given.shape)}",
            name=name,
            expected=dims,
            given=given.shape,
        )
    for axis, (d, g) in enumerate(zip(dims, given.shape)):
        if isinstance(d, int) and d != g:
            raise ShapeError(
                f"input {name!r}: axis {axis} must be {d} (shape {list(dims)}), "
                f"got shape {list(given.shape)}",
                name=name,
                expected=dims,
                given=given.shape,
            )
        if isinstance(d, str) and d:
            if symbols.setdefault(d, g) != g:
                raise ShapeError(
                    f"input {name!r}: dimension {d!r} (axis {axis}) is {g} here but "
                    f"{symbols[d]} in another input",
                    name=name,
                    expected=dims,
                    given=given.shape,
                )


def _as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def bind(
    graph: Graph,
    input_types: dict[str, TensorType],
    *,
    values: dict[str, np.ndarray] | None = None,
    fold: bool = True,
) -> Graph:
    """Return a copy of ``graph`` with static types everywhere and constants folded.

    Args:
        graph: IR from :func:`dfdl.ir.onnx_io.to_ir`.
        input_types: the concrete type of every graph input.
        values: the inputs' values, when known (``dfdl.run``): an input that an op
            needs at plan time (a Reshape's shape fed at run time) is then taken as a
            constant instead of being refused.
        fold: evaluate nodes whose inputs are all constants (on by default).

    Raises:
        ShapeError: an input is missing or does not match its declaration, or an op's
            shape rule rejects its input shapes.
        UnsupportedOpError: an op, attribute or runtime-dependent shape is unsupported;
            ops missing from dfdl are listed all at once, with their nodes
            (its ``ops`` attribute).
    """
    g = graph.copy()
    missing = [n for n in g.inputs if n not in input_types]
    if missing:
        raise ShapeError(
            f"missing input(s) {missing}; the model's inputs are {g.inputs}", name=missing[0]
        )
    unknown = [n for n in input_types if n not in g.inputs]
    if unknown:
        raise ShapeError(
            f"unknown input(s) {unknown}; the model's inputs are {g.inputs}", name=unknown[0]
        )
    missing_ops = unsupported_ops(g.nodes)
    if missing_ops:
        raise _unsupported_error(g, missing_ops)
    symbols: dict[str, int] = {}
    for name in g.inputs:
        _check_input(name, g.declared.get(name, (None, None)), input_types[name], symbols)
        g.types[name] = input_types[name]
    consts = g.initializers
    for k, v in consts.items():
        g.types[k] = TensorType(v.shape, v.dtype)
    kept: list[Node] = []
    # sequence ops become tensor ops here, where their inputs' shapes are known
    for node in lower_sequences(g.nodes, g, consts, values):
        op = check_node(node, g.opset)
        ins = [None if not i else g.types.get(i) for i in node.inputs]
        for name, t in zip(node.inputs, ins):
            if name and t is None:
                raise ModelError(f"node {node.name!r}: input {name!r} is never produced")
        type_only = TYPE_ONLY_INPUTS.get(node.op_type, ()) if not node.domain else ()
        if values:
            # runtime inputs that are shape parameters become plan-time constants
            need = set(range(len(node.inputs))) if op.fold_only else set(op.const_inputs)
            need -= set(type_only)
            for idx in need:
                name = node.inputs[idx] if idx < len(node.inputs) else ""
                if name in values and name not in consts:
                    consts[name] = np.asarray(values[name])
        cvals = [consts.get(i) if i else None for i in node.inputs]
        for idx in op.const_inputs:
            if idx < len(node.inputs) and node.inputs[idx] and cvals[idx] is None:
                raise UnsupportedOpError(
                    f"node {node.name!r} ({node.op_type}): input {idx} ({node.inputs[idx]!r})"
                    " must be known before running (a constant or computed from static "
                    "shapes); dfdl needs static shapes. Bind the dynamic dimensions or "
                    "export with static shapes.",
                    op_type=node.op_type,
                    node=node.name,
                )
        try:
            outs = op.shape(ins, cvals, **node.attrs)
        except DfdlError as e:
            if node.name not in str(e):
                e.args = (f"node {node.name!r} ({node.op_type}): {e}",) + e.args[1:]
            if isinstance(e, UnsupportedOpError):
                e.node = e.node or node.name
                e.op_type = e.op_type or node.op_type
            raise
        except Exception as e:
            raise ShapeError(
                f"node {node.name!r} ({node.op_type}): inputs with shapes "
                f"{[None if t is None else list(t.shape) for t in ins]} are invalid: {e}"
            ) from e
        if (
            len(outs) < len(node.present_outputs())
            or len(outs) < len(node.outputs)
            and any(node.outputs[len(outs) :])
        ):
            raise UnsupportedOpError(
                f"node {node.name!r} ({node.op_type}) asks for {len(node.outputs)} outputs; "
                f"dfdl's {node.op_type} produces {len(outs)} in this configuration",
                op_type=node.op_type,
                node=node.name,
            )
        for name, t in zip(node.outputs, outs):
            if name:
                g.types[name] = t
        foldable = all((not i) or i in consts or k in type_only for k, i in enumerate(node.inputs))
        # sized from the static types before anything is evaluated
        out_bytes = sum(t.nbytes for t in outs)
        small = out_bytes <= FOLD_LIMIT_BYTES
        if foldable and op.fold_only and not small and not _model_data(node):
            kept.append(_unfolded(node, outs, out_bytes, g))
            continue
        if fold and foldable and (small or op.fold_only):
            args = [None if not i else consts.get(i, _ShapeOnly(g.types[i])) for i in node.inputs]
            try:
                vals = _as_tuple(op.forward(*args, **node.attrs))
            except Exception as e:
                raise ModelError(
                    f"node {node.name!r} ({node.op_type}): constant folding failed: {e}"
                ) from e
            for name, v in zip(node.outputs, vals):
                if name:
                    consts[name] = np.asarray(v)
            continue
        if op.fold_only:
            raise UnsupportedOpError(
                f"node {node.name!r} ({node.op_type}) depends on runtime values; dfdl runs "
                f"{node.op_type} only on the constant/shape path.",
                op_type=node.op_type,
                node=node.name,
            )
        kept.append(node)
    g.nodes = kept
    g.initializers = consts
    g.prune()
    return g


def _model_data(node: Node) -> bool:
    """Whether the node's value is held in the model already (a dense ``Constant``):
    folding it allocates nothing the model did not bring."""
    return node.op_type == "Constant" and not node.domain and node.attrs.get("sparse_value") is None


def _unfolded(node: Node, outs: list[TensorType], nbytes: int, g: Graph) -> Node:
    """A constant-path node whose output is past :data:`FOLD_LIMIT_BYTES`, as a node the
    cluster computes: ``ConstantOfShape`` becomes an ``Expand`` of its fill value (a
    tiled task graph); other constant-path ops cannot run as tasks and raise."""
    if node.op_type == "ConstantOfShape" and not node.domain:
        fill = g.fresh_name(f"{node.outputs[0]}.fill")
        # the fill value alone: ConstantOfShape of the empty shape
        value = np.asarray(REGISTRY["ConstantOfShape"].forward(np.zeros(0, np.int64), **node.attrs))
        g.initializers[fill] = value
        g.types[fill] = TensorType((), value.dtype)
        return Node(node.name, "Expand", [fill, node.inputs[0]], list(node.outputs), {})
    shapes = " and ".join(str(list(t.shape)) for t in outs)
    raise MemoryPlanError(
        f"node {node.name!r} ({node.op_type}): its output (shape {shapes}, "
        f"{format_bytes(nbytes)}) would be computed on the client at plan time, past the "
        f"constant-folding cap of {format_bytes(FOLD_LIMIT_BYTES)}, and {node.op_type} cannot "
        "run as a task on the cluster; compute it from a smaller constant in the model "
        "(a smaller Range or Constant, broadcast by Expand or Tile).",
        node=node.name,
        task_bytes=nbytes,
    )


class _ShapeOnly(np.ndarray):
    """Stand-in passed to Shape/Size when folding: has the shape, holds no data."""

    def __new__(cls, t: TensorType):
        return np.broadcast_to(np.zeros((), dtype=t.dtype), t.shape).view(cls)
