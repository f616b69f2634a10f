"""Training parity with PyTorch: models exported from torch, trained in both, compared.

Each case takes a zoo model's torch twin (weights from the zoo builder, so the start is
fixed by a seed), exports it with ``torch.onnx.export`` (dynamo with ``optimize=False``,
and TorchScript for the MLP and a ResNet with fresh BatchNorms), then trains the exported
model with ``dfdl.train`` and the twin with a plain torch loop: same initial weights, same
batches in the same order (``shuffle=False``), same optimizer,
``torch.nn.functional.cross_entropy``. Per-step losses must agree within 1e-4 relative and
the final parameters within 1e-3 relative.

Only parameters are compared, not BatchNorm running statistics: ONNX's
BatchNormalization (training mode) updates ``running_var`` with the biased batch
variance, torch with the unbiased one, so the running variances differ by a factor
``n / (n - 1)`` of the batch statistics by design (the normalization itself, with the
biased variance, is the same in both and so are the parameters).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="parity tests compare against PyTorch")
pytest.importorskip("onnxscript", reason="torch's dynamo ONNX exporter needs onnxscript")

import dfdl  # noqa: E402
import dfdl.models  # noqa: E402
from dfdl.models import torch_twins  # noqa: E402

STEPS = 30
LOSS_RTOL = 1e-4
WEIGHT_RTOL = 1e-3

#: model name -> (builder kwargs, batch size)
MODELS = {
    "mlp": ({"sizes": (12, 16, 4)}, 8),
    "resnet": (
        {
            "in_channels": 1,
            "image_size": 8,
            "stem": 4,
            "stages": (4, 8),
            "blocks_per_stage": 1,
            "num_classes": 3,
        },
        4,
    ),
    "unet3d": ({"in_channels": 1, "num_classes": 2, "base": 2, "levels": 2, "volume": 4}, 2),
    "transformer": (
        {
            "vocab": 11,
            "d_model": 8,
            "heads": 2,
            "ff": 16,
            "layers": 1,
            "seq": 5,
            "num_classes": 3,
            "dropout": 0.0,
        },
        4,
    ),
}

#: optimizer name -> (dfdl optimizer, torch optimizer factory), the same hyperparameters
OPTIMIZERS = {
    "sgd": (
        lambda: dfdl.optim.SGD(lr=0.05, momentum=0.9),
        lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    ),
    "adamw": (
        lambda: dfdl.optim.AdamW(lr=0.01, weight_decay=0.01),
        lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.01),
    ),
}


@pytest.fixture(scope="module", autouse=True)
def _torch_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def make_data(name: str, kwargs: dict, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """``STEPS * batch`` samples and integer labels (per voxel for the U-Net)."""
    n = STEPS * batch
    x = dfdl.models.example_inputs(name, batch=n, seed=1, **kwargs)
    (X,) = x.values()
    rng = np.random.default_rng(2)
    classes = kwargs["sizes"][-1] if name == "mlp" else kwargs["num_classes"]
    shape = (n, *X.shape[2:]) if name == "unet3d" else (n,)
    y = rng.integers(0, classes, size=shape, dtype=np.int64)
    return X, y


def twin_and_export(
    name: str, kwargs: dict, X: np.ndarray, exporter: str, fresh_batch_norms: bool = False
):
    """The zoo model's torch twin (builder weights; with ``fresh_batch_norms``, its
    BatchNorms' running statistics as torch initializes them, and random affine
    parameters) and its ``torch.onnx`` export."""
    twin = torch_twins.load_onnx_weights(
        torch_twins.twin(name, **kwargs), dfdl.models.ZOO[name](**kwargs)
    )
    if fresh_batch_norms:
        gen = torch.Generator().manual_seed(0)
        for m in twin.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.reset_running_stats()
                # distinct affine parameters: equal ones would be stored once too (tied)
                with torch.no_grad():
                    m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                    m.bias.copy_(torch.rand(m.bias.shape, generator=gen) - 0.5)
    model = torch_twins.export(twin, torch.from_numpy(X[:2]), exporter=exporter)
    return twin, model


def torch_train(module, X, y, batch: int, make_optimizer) -> list[float]:
    """``STEPS`` steps of plain torch training (in place); the loss of each step."""
    module.train()
    opt = make_optimizer(module.parameters())
    losses = []
    for k in range(STEPS):
        xb = torch.from_numpy(X[k * batch : (k + 1) * batch])
        yb = torch.from_numpy(y[k * batch : (k + 1) * batch])
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(module(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def check_parity(
    client,
    name: str,
    optimizer: str,
    exporter: str = "dynamo",
    frozen: tuple[str, ...] = (),
    fresh_batch_norms: bool = False,
) -> None:
    kwargs, batch = MODELS[name]
    X, y = make_data(name, kwargs, batch)
    twin, model = twin_and_export(name, kwargs, X, exporter, fresh_batch_norms)
    module = copy.deepcopy(twin)
    for key, p in module.named_parameters():
        p.requires_grad_(key not in frozen)
    make_dfdl, make_torch = OPTIMIZERS[optimizer]
    result = dfdl.train(
        model,
        (X, y),
        loss="cross_entropy",
        optimizer=make_dfdl(),
        batch_size=batch,
        epochs=1,
        shuffle=False,
        client=client,
        progress=False,
        unroll=10,
        frozen=frozen,
    )
    expected = torch_train(module, X, y, batch, make_torch)

    losses = result.history["loss"]
    assert len(losses) == STEPS
    rel = np.abs(np.subtract(losses, expected)) / np.abs(expected)
    print(f"{name} {optimizer} {exporter}: loss max rel error {rel.max():.3g}")
    np.testing.assert_allclose(losses, expected, rtol=LOSS_RTOL, atol=0)
    assert expected[-1] != expected[0]  # the weights did move

    # running means follow the same recurrence in both (ONNX momentum 0.9 = torch's 0.1);
    # running variances do not (biased vs unbiased batch variance, see the module doc)
    buffers = dict(module.named_buffers())
    for key in (k for k in buffers if k.endswith("running_mean")):
        want = buffers[key].numpy()
        np.testing.assert_allclose(result.params[key], want, rtol=0, atol=1e-4, err_msg=key)
        var = result.params[key.replace("running_mean", "running_var")]
        tvar = buffers[key.replace("running_mean", "running_var")].numpy()
        print(f"{key}: running_var dfdl/torch {np.min(var / tvar):.4f}..{np.max(var / tvar):.4f}")

    params = {k: p for k, p in module.named_parameters() if k not in frozen}
    assert set(result.params) - set(dict(module.named_buffers())) == set(params)
    for key, p in params.items():
        want = p.detach().numpy()
        got = result.params[key]
        assert got.shape == want.shape and got.dtype == want.dtype, key
        # relative to the tensor's scale: elements near 0 compare at its magnitude
        scale = float(np.abs(want).max())
        err = float(np.abs(got - want).max())
        print(f"{name} {optimizer} {exporter} {key}: max error {err:.3g} / scale {scale:.3g}")
        assert err <= WEIGHT_RTOL * scale, f"{key}: max error {err:.3g}, scale {scale:.3g}"
        assert not np.array_equal(want, twin.state_dict()[key].numpy()), f"{key} did not train"


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_mlp(client, exporter, optimizer):
    check_parity(client, "mlp", optimizer, exporter)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_resnet_batchnorm_training_mode(client, optimizer):
    check_parity(client, "resnet", optimizer)


def test_resnet_exported_by_torchscript_with_fresh_batch_norms(client):
    # TorchScript's exporter stores equal initializers once: fresh running means (zeros)
    # and variances (ones) become Identity nodes of one of them, which dfdl unties into
    # running statistics of their own
    kwargs, _ = MODELS["resnet"]
    X, _ = make_data("resnet", kwargs, 2)
    _, model = twin_and_export("resnet", kwargs, X, "torchscript", fresh_batch_norms=True)
    inits = {t.name for t in model.graph.initializer}
    stats = {
        n.input[k] for n in model.graph.node if n.op_type == "BatchNormalization" for k in (3, 4)
    }
    assert len(stats - inits) >= len(stats) // 2  # the exporter aliased most of them
    check_parity(client, "resnet", "sgd", exporter="torchscript", fresh_batch_norms=True)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_unet3d_per_voxel_cross_entropy(client, optimizer):
    check_parity(client, "unet3d", optimizer)


def test_transformer_without_dropout(client):
    # The key projection's bias shifts every score of a softmax row by the same amount,
    # so its gradient is 0 in exact arithmetic: both frameworks get rounding noise there,
    # which Adam normalizes into full-size steps of random sign. It is frozen in both.
    frozen = tuple(f"layers.{i}.attn.k.bias" for i in range(MODELS["transformer"][0]["layers"]))
    check_parity(client, "transformer", "adamw", frozen=frozen)
