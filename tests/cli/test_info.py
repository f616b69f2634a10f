"""``dfdl info``, run as a real subprocess (``python -m dfdl``), and the text it prints."""

from __future__ import annotations

import onnx
from onnx import helper

import dfdl.models
from dfdl.cli import main
from dfdl.cli.info import describe_model
from tests.cli.helpers import dfdl_cli
from tests.ir.helpers import (
    make_model,
    opset9_model,
    torch_marked_model,
    unconvertible_model,
    vi,
)


def test_info_lists_supported_ops_and_parameters(work):
    r = dfdl_cli("info", "mlp.onnx", cwd=work)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    gemm = next(line for line in lines if line.split()[:1] == ["Gemm"])
    relu = next(line for line in lines if line.split()[:1] == ["Relu"])
    assert gemm.split()[1:] == ["2", "supported"]
    assert relu.split()[1:] == ["1", "supported"]
    assert "x  float32  [batch, 8]" in r.stdout
    assert "logits  float32  [batch, 3]" in r.stdout
    n_params = 8 * 16 + 16 + 16 * 3 + 3
    assert f"parameters: {n_params} values in 4 initializers, {n_params * 4} B" in r.stdout
    assert lines[-1] == "every op is supported"


def test_info_flags_an_unsupported_op(work):
    r = dfdl_cli("info", "unique.onnx", cwd=work)
    assert r.returncode == 0, r.stderr
    unique = next(line for line in r.stdout.splitlines() if line.split()[:1] == ["Unique"])
    assert "NOT SUPPORTED" in unique
    assert r.stdout.splitlines()[-1] == "unsupported ops: 'Unique' (node 'unique')"


def test_describe_model_names_the_opset():
    text = describe_model(dfdl.models.mlp((4, 3)), title="tiny")
    assert text.splitlines()[0].startswith("tiny: producer ")
    assert any(line.startswith("opset: ai.onnx ") for line in text.splitlines())
    assert "unsupported" not in text.splitlines()[1]


def test_info_says_the_model_was_converted(tmp_path):
    """An opset-9 model is described as dfdl reads it: converted to opset 13."""
    onnx.save(opset9_model(), str(tmp_path / "zoo9.onnx"))
    r = dfdl_cli("info", "zoo9.onnx", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "opset: ai.onnx 13  (converted from opset 9 with onnx.version_converter)" in lines
    ops = [line.split()[0] for line in lines if line.startswith("  ") and "supported" in line]
    assert "Resize" in ops and "Upsample" not in ops  # Upsample-9 became Resize
    assert lines[-1] == "every op is supported"


def test_info_reports_a_conversion_that_fails(tmp_path, capsys):
    onnx.save(unconvertible_model(), str(tmp_path / "pad1.onnx"))
    assert main(["info", str(tmp_path / "pad1.onnx")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "opset: ai.onnx 1  (older than 13: dfdl converts it to opset 13)" in lines
    assert lines[-1].startswith("not converted: cannot convert the model from default-domain")
    assert "no adapter that takes Pad (2 nodes: 'pad_first', 'Pad_1') past opset 1" in lines[-1]


def test_info_lists_every_unsupported_op_with_its_nodes():
    nodes = [helper.make_node("Unique", ["x"], [f"u{i}"], name=f"uniq{i}") for i in range(5)]
    nodes += [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Det", ["sq"], ["d"])]
    outputs = [vi(f"u{i}", ["n"]) for i in range(5)] + [vi("r", [4]), vi("d", [])]
    model = make_model(nodes, [vi("x", [4]), vi("sq", [3, 3])], outputs)
    lines = describe_model(model).splitlines()
    assert lines[-1] == (
        "unsupported ops: 'Unique' (5 nodes: 'uniq0', 'uniq1', 'uniq2' and 2 more); "
        "'Det' (node 'Det_6')"
    )
    assert next(line for line in lines if line.split()[:1] == ["Det"]).split()[1:] == [
        "1",
        "NOT",
        "SUPPORTED",
    ]


def test_info_says_which_initializers_torchs_optimizer_folded():
    line = "folded by torch's optimizing exporter: 1 initializer (training them"
    assert line in describe_model(torch_marked_model(folded=True))
    assert "folded" not in describe_model(torch_marked_model(folded=False))


def test_info_counts_what_it_undoes_of_torchs_optimizer():
    from tests.ir.test_torch_folds import _linear_parts

    text = describe_model(_linear_parts())
    line = "parameters torch's optimizing exporter folded, undone at load: 2"
    assert f"{line} (bias restored 1, transposed 1)" in text
    assert "folded by torch's optimizing exporter:" not in text  # nothing left unexplained
