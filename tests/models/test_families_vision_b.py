"""torchvision's classification families in dfdl, part 2 (SqueezeNet, DenseNet, ConvNeXt, RegNet,
ViT): exported by torch, run against onnxruntime and trained against PyTorch.

What is checked and the tolerances: ``tests/models/families.py``. The families are split
over three files so that pytest-xdist (``--dist loadfile``) runs them in parallel.
"""

from __future__ import annotations

import pytest

from tests.models.families import FAMILIES, assert_forward, assert_training, cases

pytest.importorskip("torch", reason="torch not installed")
pytest.importorskip("onnxscript", reason="torch's dynamo ONNX exporter needs onnxscript")

KEYS = ["squeezenet", "densenet", "convnext", "regnet", "vit"]


@pytest.mark.parametrize("key, exporter", cases(KEYS, "forward"))
def test_forward_matches_onnxruntime(key, exporter, torchvision, client):
    assert_forward(FAMILIES[key], torchvision, exporter, client)


@pytest.mark.parametrize("key, exporter", cases(KEYS, "train"))
def test_training_matches_pytorch(key, exporter, torchvision, client):
    assert_training(FAMILIES[key], torchvision, exporter, client)
