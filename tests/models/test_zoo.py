"""Model zoo: builders are valid ONNX, run in onnxruntime, and equal their torch twins."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from dfdl.models import ZOO, example_inputs

# Small configurations keep the whole file fast; ids name the builder and its variant.
CASES = {
    "mlp": ("mlp", dict(sizes=(16, 32, 32, 5))),
    "resnet": (
        "resnet",
        dict(image_size=16, stem=8, stages=(8, 16), blocks_per_stage=1, num_classes=5),
    ),
    "unet3d": ("unet3d", dict(base=4, levels=3, volume=8)),
    "transformer": (
        "transformer",
        dict(vocab=50, d_model=32, heads=4, ff=64, layers=2, seq=8, num_classes=5),
    ),
    "transformer_causal": (
        "transformer",
        dict(vocab=50, d_model=32, heads=4, ff=64, layers=2, seq=8, num_classes=5, causal=True),
    ),
}

OPS = {
    "mlp": {"Gemm", "Relu"},
    "resnet": {
        "Conv", "BatchNormalization", "Relu", "MaxPool", "Add", "GlobalAveragePool", "Flatten",
        "Gemm",
    },
    "unet3d": {"Conv", "BatchNormalization", "Relu", "MaxPool", "ConvTranspose", "Concat"},
    "transformer": {
        "Gather", "Shape", "Slice", "Add", "LayerNormalization", "MatMul", "Reshape",
        "Transpose", "Mul", "Softmax", "Dropout", "Gelu", "ReduceMean", "Constant",
    },
}  # fmt: skip
OPS["transformer_causal"] = OPS["transformer"] | {"Concat"}


def run_ort(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(["logits"], feeds)[0]


def expected_shape(name: str, kw: dict, batch: int) -> tuple:
    if name == "unet3d":
        return (batch, kw.get("num_classes", 2), *[kw["volume"]] * 3)
    n_out = kw["sizes"][-1] if name == "mlp" else kw["num_classes"]
    return (batch, n_out)


def assert_close(out: np.ndarray, ref: np.ndarray) -> None:
    # 1e-4 relative to the output's scale; elementwise rtol alone fails near zero.
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


@pytest.mark.parametrize("opset", [17, 21])
@pytest.mark.parametrize("case", CASES)
def test_builder_checks_and_runs(case, opset):
    name, kw = CASES[case]
    model = ZOO[name](opset=opset, **kw)
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == opset
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert [o.name for o in model.graph.output] == ["logits"]
    for batch in (1, 3):
        out = run_ort(model, example_inputs(name, batch=batch, **kw))
        assert out.shape == expected_shape(name, kw, batch)
        assert out.dtype == np.float32 and np.isfinite(out).all()


@pytest.mark.parametrize("case", CASES)
def test_op_types(case):
    name, kw = CASES[case]
    assert {n.op_type for n in ZOO[name](**kw).graph.node} == OPS[case]


def test_transformer_below_opset20_uses_erf_and_reduce_attribute():
    model = ZOO["transformer"](opset=17, **CASES["transformer"][1])
    ops = {n.op_type for n in model.graph.node}
    assert "Gelu" not in ops and {"Erf", "Div"} <= ops
    (pool,) = [n for n in model.graph.node if n.op_type == "ReduceMean"]
    assert len(pool.input) == 1 and pool.attribute[0].name in ("axes", "keepdims")


def test_transformer_runs_for_shorter_sequences():
    kw = CASES["transformer_causal"][1]
    tokens = np.arange(15, dtype=np.int64).reshape(3, 5)
    assert run_ort(ZOO["transformer"](**kw), {"tokens": tokens}).shape == (3, 5)


def test_seed_determines_weights():
    def weights(seed):
        return [onnx.numpy_helper.to_array(t) for t in ZOO["mlp"](seed=seed).graph.initializer]

    a, b, c = weights(0), weights(0), weights(1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], c[0])
    # torch.nn.Linear default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    assert np.abs(a[0]).max() <= 1 / np.sqrt(784)


def test_opset_out_of_range_is_refused():
    with pytest.raises(ValueError, match="opset"):
        ZOO["mlp"](opset=16)


def test_example_inputs():
    (tokens,) = example_inputs("transformer", batch=4, vocab=7, seq=3).values()
    assert tokens.shape == (4, 3) and tokens.dtype == np.int64 and tokens.max() < 7
    x = example_inputs("unet3d", batch=1, volume=8)["x"]
    assert x.shape == (1, 1, 8, 8, 8) and x.dtype == np.float32


def test_modules_import_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import dfdl.models, dfdl.models.torch_twins\n"
        "dfdl.models.mlp()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- torch twins ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", reason="torch not installed; twin checks skipped")


def twin_with_weights(case):
    from dfdl.models.torch_twins import load_onnx_weights, twin

    name, kw = CASES[case]
    model = ZOO[name](**kw)
    return name, kw, model, load_onnx_weights(twin(name, **kw), model)


def twin_output(torch, module, feeds):
    with torch.no_grad():
        return module(*[torch.from_numpy(v) for v in feeds.values()]).numpy()


@pytest.mark.parametrize("case", CASES)
def test_twin_matches_builder(torch, case):
    name, kw, model, module = twin_with_weights(case)
    params = {t.name: tuple(t.dims) for t in model.graph.initializer}
    state = {k: v for k, v in module.state_dict().items() if not k.endswith("num_batches_tracked")}
    # every initializer is a twin tensor: dfdl.train trains each float initializer
    # (constants such as the attention scale are Constant nodes)
    assert set(params) == set(state)
    for key, value in state.items():
        assert params[key] == tuple(value.shape), key
    assert not module.training
    feeds = example_inputs(name, batch=3, **kw)
    assert_close(run_ort(model, feeds), twin_output(torch, module, feeds))


def test_twin_pickles(torch):
    _, _, _, module = twin_with_weights("resnet")
    clone = pickle.loads(pickle.dumps(module))
    assert type(clone) is type(module)


def test_load_onnx_weights_rejects_mismatch(torch):
    from dfdl.models.torch_twins import load_onnx_weights, twin

    with pytest.raises(KeyError):
        load_onnx_weights(twin("mlp", sizes=(16, 32, 5)), ZOO["mlp"](sizes=(16, 32, 32, 5)))
    with pytest.raises(ValueError):
        load_onnx_weights(twin("mlp", sizes=(16, 8, 5)), ZOO["mlp"](sizes=(16, 32, 5)))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("case", ["mlp", "resnet", "unet3d", "transformer"])
def test_torch_export_matches_twin(torch, case, exporter, tmp_path):
    from dfdl.models.torch_twins import export

    name, kw, _, module = twin_with_weights(case)
    (example,) = example_inputs(name, batch=2, **kw).values()
    path = tmp_path / "model.onnx"
    exported = export(module, torch.from_numpy(example), path, exporter=exporter)
    onnx.checker.check_model(exported)
    assert onnx.load(path).graph.output[0].name == "logits"
    # Batch 3 differs from the export's example batch 2: the batch dimension is dynamic.
    feeds = example_inputs(name, batch=3, seed=1, **kw)
    assert [i.name for i in exported.graph.input] == list(feeds)
    assert_close(run_ort(exported, feeds), twin_output(torch, module, feeds))
