"""The zoo models and their PyTorch exports run through ``dfdl.run`` and match onnxruntime.

Every model comes in three forms: the zoo's ``onnx.helper`` build, and its torch twin
(same weights, :func:`dfdl.models.torch_twins.load_onnx_weights`) exported with the
dynamo exporter (``optimize=False``) and with the TorchScript exporter
(:func:`dfdl.models.torch_twins.export`). Each form runs on the session's LocalCluster
(2 worker processes) at the automatic tiling, at ``tiles="uneven"`` and at
``{"batch": 2, "model": 2}``, against onnxruntime on the same model file.

Tolerance: ``rtol=1e-4`` elementwise with ``atol = 1e-5 * max|ref|``. The absolute floor
is needed because logits cross zero, where a relative bound alone is meaningless; at
1e-5 of the output's scale it stays ten times below the 1e-4 budget. The float32
differences measured here are about 1e-7 of the scale (summation order only).
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import dfdl
from dfdl.models import ZOO, example_inputs

# Small sizes: the whole file runs in well under 3 minutes on 2 cores.
CASES = {
    "mlp": (dict(sizes=(64, 128, 10)), 5),
    "resnet": (
        dict(image_size=16, stem=8, stages=(8, 16), blocks_per_stage=1, num_classes=5),
        3,
    ),
    "unet3d": (dict(base=4, levels=3, volume=8), 2),
    "transformer": (
        dict(vocab=50, d_model=32, heads=2, ff=64, layers=1, seq=8, num_classes=5),
        3,
    ),
}
SOURCES = ["zoo", "dynamo", "torchscript"]
TILINGS = {"default": None, "uneven": "uneven", "batch2_model2": {"batch": 2, "model": 2}}
#: batch of the torch export's example input; runs use another batch (CASES), so the
#: exported batch dimension must really be dynamic
EXPORT_BATCH = 2


@functools.cache
def model_for(name: str, source: str) -> onnx.ModelProto:
    """The zoo model, or its torch twin exported with ``source`` (cached per module run)."""
    kw, _ = CASES[name]
    model = ZOO[name](**kw)
    if source == "zoo":
        return model
    pytest.importorskip("torch", reason="torch not installed; torch.onnx.export cases skipped")
    import torch

    from dfdl.models.torch_twins import export, load_onnx_weights, twin

    module = load_onnx_weights(twin(name, **kw), model)
    (example,) = example_inputs(name, batch=EXPORT_BATCH, seed=7, **kw).values()
    return export(module, torch.from_numpy(example), exporter=source)


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The single output of ``model`` as computed by onnxruntime (CPU)."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def assert_matches_ort(got: np.ndarray, ref: np.ndarray) -> None:
    """rtol 1e-4 with an absolute floor of 1e-5 of the output's scale (module docstring)."""
    assert got.shape == ref.shape and got.dtype == ref.dtype
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * float(np.abs(ref).max()))


@pytest.mark.parametrize("tiling", TILINGS)
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", CASES)
def test_model_matches_onnxruntime(name, source, tiling, client):
    kw, batch = CASES[name]
    model = model_for(name, source)
    feeds = example_inputs(name, batch=batch, seed=1, **kw)
    assert [i.name for i in model.graph.input] == list(feeds)
    out = dfdl.run(model, feeds, client=client, tiles=TILINGS[tiling])
    assert list(out) == [o.name for o in model.graph.output] == ["logits"]
    assert_matches_ort(out["logits"], run_ort(model, feeds))


@pytest.mark.parametrize("name", CASES)
def test_uneven_tiling_splits_every_model(name):
    # Guards the test above: "uneven" must really cut the models into many tiles.
    kw, batch = CASES[name]
    plan = dfdl.plan(model_for(name, "zoo"), batch_size=batch, tiles="uneven", dims={"seq": 8})
    assert plan.n_tasks() > 2 * len(plan.nodes)


def test_dynamo_export_keeps_batchnorm():
    # optimize=False keeps BatchNormalization separate (optimize=True folds it into Conv).
    ops = {n.op_type for n in model_for("resnet", "dynamo").graph.node}
    assert {"Conv", "BatchNormalization"} <= ops


def test_repeated_runs_are_bit_identical(client):
    # Regression: tiles pickled inside the graph arrive unaligned; numpy's matmul then
    # skipped BLAS and rounded differently, so the MLP's outputs changed from run to run.
    kw, batch = CASES["mlp"]
    model = model_for("mlp", "zoo")
    feeds = example_inputs("mlp", batch=batch, seed=2, **kw)
    runs = [dfdl.run(model, feeds, client=client, tiles="uneven")["logits"] for _ in range(4)]
    for other in runs[1:]:
        np.testing.assert_array_equal(other, runs[0])
