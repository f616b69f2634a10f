"""``dfdl info``: print a model's inputs, outputs, opsets (and the opset it was converted
from), ops (supported by dfdl or not, with the nodes of each unsupported op) and
parameter size.

Example:
    .. code-block:: console

        $ dfdl info model.onnx
"""

from __future__ import annotations

import argparse
import math


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``info`` to the ``dfdl`` subcommands (``sub``: ``add_subparsers()``'s result).

    Example:
        >>> add_parser(Parser(prog="dfdl").add_subparsers())  # doctest: +SKIP
    """
    p = sub.add_parser(
        "info",
        help="print a model's inputs, outputs, ops (supported or not) and parameters",
        description="Print MODEL's inputs and outputs with shapes, its opsets, node count, "
        "a histogram of its ops marked supported or not by dfdl (with the nodes of each "
        "unsupported op), and its parameter size. A model older than opset 13 is described "
        "as dfdl reads it: converted to opset 13 with onnx.version_converter.",
    )
    p.add_argument("model", metavar="MODEL.onnx")
    p.set_defaults(func=cmd_info)
    return p


def cmd_info(args: argparse.Namespace) -> int:
    """``dfdl info``: print a model's inputs, outputs, ops (supported or not) and size.

    A model older than opset 13 is described as dfdl reads it: converted to opset 13
    (or as written, with the reason, when the conversion fails).

    Example:
        >>> main(["info", "mlp.onnx"])  # doctest: +SKIP
        0
    """
    from dfdl.errors import ModelError
    from dfdl.ir.onnx_io import convert_opset, load_model

    model = load_model(args.model, convert=False)
    failure = ""
    try:
        model = convert_opset(model)
    except ModelError as e:
        failure = str(e)
    print(describe_model(model, title=args.model, conversion_failure=failure))
    return 0


def describe_model(model, title: str = "model", conversion_failure: str = "") -> str:
    """The text ``dfdl info`` prints for a checked ``onnx.ModelProto``.

    Args:
        model: the model (converted by :func:`dfdl.ir.onnx_io.convert_opset` or not).
        title: the first line's name for it.
        conversion_failure: why converting it to opset 13 failed, printed last.

    Example:
        >>> import dfdl.models
        >>> print(describe_model(dfdl.models.mlp((4, 3))).splitlines()[-1])
        every op is supported
    """
    from collections import Counter

    from dfdl.ir.bind import FOLD_LIMIT_BYTES, describe_unsupported, unsupported_ops
    from dfdl.ir.graph import Node
    from dfdl.ir.onnx_io import MAX_OPSET, MIN_OPSET, converted_from, exporter_folded
    from dfdl.ir.torch_folds import unfold, unfolded
    from dfdl.ops import lookup
    from dfdl.ops.registry import ONNX_DOMAINS
    from dfdl.plan.estimate import format_bytes

    g = model.graph
    inits = {t.name for t in g.initializer}
    lines = [f"{title}: producer {model.producer_name or '?'}, ir_version {model.ir_version}"]
    old = converted_from(model)
    for o in model.opset_import:
        domain = o.domain or "ai.onnx"
        note = ""
        if o.domain in ONNX_DOMAINS:
            if o.version > MAX_OPSET:
                note = f"  (unsupported: dfdl reads opsets up to {MAX_OPSET})"
            elif o.version < MIN_OPSET:
                note = f"  (older than {MIN_OPSET}: dfdl converts it to opset {MIN_OPSET})"
            elif old is not None:
                note = f"  (converted from opset {old} with onnx.version_converter)"
        lines.append(f"opset: {domain} {o.version}{note}")
    lines.append("inputs:")
    lines += [f"  {_value_line(vi)}" for vi in g.input if vi.name not in inits]
    lines.append("outputs:")
    lines += [f"  {_value_line(vi)}" for vi in g.output]
    ops = Counter((n.domain if n.domain not in ONNX_DOMAINS else "", n.op_type) for n in g.node)
    lines.append(f"nodes: {len(g.node)}")
    width = max((len(_op_name(d, t)) for d, t in ops), default=0)
    fold_cap = format_bytes(FOLD_LIMIT_BYTES)
    for (domain, op_type), count in sorted(ops.items()):
        op = lookup(op_type, domain)
        mark = "supported" if op is not None else "NOT SUPPORTED"
        if op is not None and op.fold_only:
            mark = f"supported (constant path, folded at plan time up to {fold_cap})"
        lines.append(f"  {_op_name(domain, op_type):{width}s} {count:6d}  {mark}")
    as_trained = unfold(model)
    restored = unfolded(as_trained)
    if restored:
        kinds = Counter(how.split(":")[0] for how in restored.values())
        lines.append(
            f"parameters torch's optimizing exporter folded, undone at load: {len(restored)} "
            f"({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})"
        )
    folded = exporter_folded(as_trained)
    if folded:
        lines.append(
            f"folded by torch's optimizing exporter: {len(folded)} "
            f"initializer{'s' if len(folded) > 1 else ''} (training them is not PyTorch's "
            "training; export with optimize=False)"
        )
    count, nbytes = _parameter_size(g.initializer)
    lines.append(
        f"parameters: {count:,} values in {len(g.initializer)} initializers, {format_bytes(nbytes)}"
    )
    # nodes named as dfdl.ir.onnx_io.to_ir names them (and UnsupportedOpError lists them)
    nodes = [
        Node(n.name or f"{n.op_type}_{i}", n.op_type, [], [], {}, n.domain)
        for i, n in enumerate(g.node)
    ]
    unsupported = unsupported_ops(nodes)
    if unsupported:
        lines.append(f"unsupported ops: {describe_unsupported(unsupported)}")
    else:
        lines.append("every op is supported")
    if conversion_failure:
        lines.append(f"not converted: {conversion_failure}")
    return "\n".join(lines)


def _op_name(domain: str, op_type: str) -> str:
    return f"{domain}.{op_type}" if domain else op_type


def _value_line(vi) -> str:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        return f"{vi.name}  (not a tensor)"
    dtype = _dtype_name(tt.elem_type)
    if not tt.HasField("shape"):
        return f"{vi.name}  {dtype}  (shape unknown)"
    dims = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in tt.shape.dim]
    return f"{vi.name}  {dtype}  [{', '.join(map(str, dims))}]"


def _dtype_name(elem_type: int) -> str:
    """numpy's name of an ONNX element type (``float32``), else ONNX's (``bfloat16``)."""
    import onnx
    from onnx import helper

    if not elem_type:
        return "?"
    try:
        return str(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def _parameter_size(initializers) -> tuple[int, int]:
    """Total element count and bytes of the initializers."""
    from onnx import helper

    count = nbytes = 0
    for t in initializers:
        n = math.prod(t.dims)
        count += n
        try:
            nbytes += n * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        except Exception:  # types numpy lacks (4-bit, strings): the stored size
            nbytes += len(t.raw_data)
    return count, nbytes
