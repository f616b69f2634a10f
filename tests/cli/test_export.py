"""``dfdl export-training-graph``, run as a real subprocess (``python -m dfdl``)."""

from __future__ import annotations

import onnx

from tests.cli.helpers import SIZES, dfdl_cli


def test_export_training_graph(work):
    r = dfdl_cli(
        "export-training-graph", "mlp.onnx", "-o", "train.onnx", "--batch-size", "4",
        "--optimizer", "sgd", "--momentum", "0.9",
        cwd=work,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    m = onnx.load(str(work / "train.onnx"))
    onnx.checker.check_model(m)
    ops = {(n.domain, n.op_type) for n in m.graph.node}
    assert ("dfdl", "SGDUpdate") in ops
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in m.graph.input}
    assert shapes["x"] == [4, SIZES[0]]
    assert shapes["labels"] == [4]
    assert r.stdout.strip() == (
        f"wrote train.onnx: {len(m.graph.node)} nodes, {len(m.graph.input)} inputs, "
        f"{len(m.graph.output)} outputs"
    )
