"""``dfdl info``, run as a real subprocess (``python -m dfdl``), and the text it prints."""

from __future__ import annotations

import dfdl.models
from dfdl.cli.info import describe_model
from tests.cli.helpers import dfdl_cli


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
    assert r.stdout.splitlines()[-1] == "unsupported ops: Unique"


def test_describe_model_names_the_opset():
    text = describe_model(dfdl.models.mlp((4, 3)), title="tiny")
    assert text.splitlines()[0].startswith("tiny: producer ")
    assert any(line.startswith("opset: ai.onnx ") for line in text.splitlines())
    assert "unsupported" not in text.splitlines()[1]
