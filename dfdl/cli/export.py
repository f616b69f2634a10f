"""``dfdl export-training-graph``: write a model's training step as an ONNX file.

Example:
    .. code-block:: console

        $ dfdl export-training-graph model.onnx -o train.onnx --optimizer adam
"""

from __future__ import annotations

import argparse

from dfdl.cli.common import add_training_args, labels_type, make_optimizer, written_beside


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``export-training-graph`` to the ``dfdl`` subcommands (``sub``:
    ``add_subparsers()``'s result).

    Example:
        >>> add_parser(Parser(prog="dfdl").add_subparsers())  # doctest: +SKIP
    """
    p = sub.add_parser(
        "export-training-graph",
        help="write the training step as an ONNX file",
        description="Write the training step of MODEL (forward, loss, backward, optimizer "
        "update; backward ops in the 'dfdl' domain) as an ONNX model, e.g. for Netron.",
    )
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("-o", "--output", required=True, metavar="OUT.onnx")
    add_training_args(p, batch_default=1)
    p.set_defaults(func=cmd_export)
    return p


def cmd_export(args: argparse.Namespace) -> int:
    """``dfdl export-training-graph``: write the training step as an ONNX file.

    Example:
        >>> main(["export-training-graph", "mlp.onnx", "-o", "t.onnx"])  # doctest: +SKIP
        0
    """
    import dfdl
    from dfdl.ir.onnx_io import load_model, to_ir
    from dfdl.ops.registry import TensorType
    from dfdl.runtime.output import check_output_path, save_model

    check_output_path(args.output, "-o")
    proto = load_model(args.model)
    graph = to_ir(proto)
    name = graph.inputs[0] if graph.inputs else ""
    declared, dtype = graph.declared.get(name, (None, None))
    labels = None
    if declared is not None:  # dfdl.training_graph sets every symbolic axis to the batch size
        shape = tuple(d if isinstance(d, int) else args.batch_size for d in declared)
        labels = labels_type(graph, {name: TensorType(shape, dtype)}, args.loss)
    kwargs = {} if labels is None else {"labels_shape": labels.shape, "labels_dtype": labels.dtype}
    m = dfdl.training_graph(
        proto, args.loss, make_optimizer(args), batch_size=args.batch_size, **kwargs
    )
    files = save_model(m, args.output)
    print(
        f"wrote {args.output}{written_beside(files)}: {len(m.graph.node)} nodes, "
        f"{len(m.graph.input)} inputs, {len(m.graph.output)} outputs"
    )
    return 0
