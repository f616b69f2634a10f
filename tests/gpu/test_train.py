"""Training on a GPU worker (``dfdl.LocalCluster(gpus=1)``) against the same training on
CPU workers: the zoo models' losses after 10 steps within 1e-5, and two GPU runs
bit-identical."""

from __future__ import annotations

import numpy as np
import pytest
from distributed import Client

import dfdl
import dfdl.models
from dfdl.models import ZOO

STEPS = 10
#: model name -> (builder kwargs, batch size): the parity tests' small zoo models
MODELS = {
    "mlp": ({"sizes": (12, 16, 4)}, 8),
    "resnet": (
        dict(in_channels=1, image_size=8, stem=4, stages=(4, 8), blocks_per_stage=1),
        4,
    ),
    "unet3d": ({"in_channels": 1, "num_classes": 2, "base": 2, "levels": 2, "volume": 4}, 2),
    "transformer": (
        dict(vocab=11, d_model=8, heads=2, ff=16, layers=1, seq=5, num_classes=3, dropout=0.0),
        4,
    ),
}
OPTIMIZERS = {
    "mlp": lambda: dfdl.optim.SGD(lr=0.05, momentum=0.9),
    "resnet": lambda: dfdl.optim.SGD(lr=0.05, momentum=0.9),
    "unet3d": lambda: dfdl.optim.Adam(lr=0.01),
    "transformer": lambda: dfdl.optim.AdamW(lr=0.01, weight_decay=0.01),
}


@pytest.fixture(scope="module")
def gpu_client():
    with dfdl.LocalCluster(gpus=1) as cluster, Client(cluster) as client:
        yield client


@pytest.fixture(scope="module")
def cpu_client():
    with dfdl.LocalCluster(1, threads_per_worker=2) as cluster, Client(cluster) as client:
        yield client


def _data(name: str, kwargs: dict, n: int) -> tuple[np.ndarray, np.ndarray]:
    (X,) = dfdl.models.example_inputs(name, batch=n, seed=1, **kwargs).values()
    classes = kwargs["sizes"][-1] if name == "mlp" else kwargs.get("num_classes", 10)
    shape = (n, *X.shape[2:]) if name == "unet3d" else (n,)
    return X, np.random.default_rng(2).integers(0, classes, size=shape, dtype=np.int64)


def _train(client, name):
    kwargs, batch = MODELS[name]
    X, y = _data(name, kwargs, STEPS * batch)
    return dfdl.train(
        ZOO[name](**kwargs),
        data=(X[: STEPS * batch], y[: STEPS * batch]),
        batch_size=batch,
        epochs=1,
        optimizer=OPTIMIZERS[name](),
        shuffle=False,
        client=client,
    )


@pytest.mark.parametrize("name", sorted(MODELS))
def test_gpu_training_matches_cpu_and_repeats(name, gpu_client, cpu_client):
    gpu = _train(gpu_client, name)
    cpu = _train(cpu_client, name)
    again = _train(gpu_client, name)
    g, c = np.array(gpu.history["loss"]), np.array(cpu.history["loss"])
    assert len(g) == STEPS and np.isfinite(g).all()
    np.testing.assert_allclose(g, c, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(g, np.array(again.history["loss"]))
    for k, v in gpu.params.items():
        assert isinstance(v, np.ndarray), k  # what reaches the client is numpy
        np.testing.assert_array_equal(v, again.params[k], err_msg=k)
        if k.endswith("attn.k.bias"):
            # its gradient is zero in exact arithmetic (it adds one constant to a row of
            # attention scores, which softmax ignores): Adam scales each run's rounding
            # noise up to lr-sized steps of either sign, so its value is arbitrary in both
            continue
        np.testing.assert_allclose(v, cpu.params[k], rtol=1e-3, atol=1e-5, err_msg=k)


def test_gpu_cluster_has_one_worker_per_gpu(gpu_client):
    from dfdl.runtime.cluster import workers_device

    info = gpu_client.scheduler_info()["workers"]
    assert len(info) == 1
    assert all(w["resources"].get("GPU") == 1 for w in info.values())
    assert workers_device(gpu_client) == "gpu"
