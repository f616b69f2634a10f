"""transformers models from small configs in dfdl (GPT-2 LM head, BERT sequence
classification, ViT): exported by torch, run against onnxruntime, trained against PyTorch;
and a language model's loss over (batch x sequence) tokens in the forms users write it.

What is checked and the tolerances: ``tests/models/families.py`` (``FAMILIES``,
``LM_FORMS``). No weights are downloaded: the models are built from configs.
"""

from __future__ import annotations

import pytest

from tests.models.families import FAMILIES, LM_FORMS, assert_forward, assert_training, cases

pytest.importorskip("torch", reason="torch not installed")
pytest.importorskip("onnxscript", reason="torch's dynamo ONNX exporter needs onnxscript")

KEYS = ["gpt2", "bert", "hf_vit"]


@pytest.mark.parametrize("key, exporter", cases(KEYS, "forward"))
def test_forward_matches_onnxruntime(key, exporter, transformers, client):
    assert_forward(FAMILIES[key], transformers, exporter, client)


@pytest.mark.parametrize("key, exporter", cases(KEYS, "train"))
def test_training_matches_pytorch(key, exporter, transformers, client):
    assert_training(FAMILIES[key], transformers, exporter, client)


@pytest.mark.parametrize("form, exporter", cases(list(LM_FORMS), "train"))
def test_language_model_loss_over_tokens(form, exporter, transformers, client):
    # logits (B, T, V) with labels (B, T); the same transposed to (B, V, T); the model's
    # own loss (transformers' labels=input_ids) named as dfdl's loss
    assert_training(LM_FORMS[form], transformers, exporter, client)
