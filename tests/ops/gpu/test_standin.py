"""dfdl's GPU kernels and GPU workers on a stand-in for cupy (tests/ops/gpu/standin: numpy
arrays of their own type that refuse host arrays where cupy does), so that CI, which has
no GPU, runs their Python: every case of every op with a GPU kernel against the op's
numpy forward, with the kernel taking the tile (no host fallback) and its values staying
on the device; and the zoo's models trained on a GPU worker process (step programs, tiles
run serially, bodies unpickled once) to the losses of CPU workers. The CUDA bodies of the
element-wise kernels are restated in the stand-in, so they are checked on a GPU only
(tests/gpu)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from distributed import Client

import dfdl
from dfdl.models import ZOO
from dfdl.ops import REGISTRY
from dfdl.ops.gpu import device
from dfdl.ops.gpu.kernels import elementwise
from tests.ops.gpu.standin import PATH as STANDIN
from tests.ops.gpu.standin import as_cupy
from tests.ops.test_registry import RUNNABLE, _present, assert_matches


@pytest.fixture(scope="module")
def standin():
    """The stand-in imported as ``cupy`` while this module's tests run."""
    with as_cupy() as module:
        elementwise.cache_clear()
        yield module
        elementwise.cache_clear()


def _kernel_cases() -> list:
    return [c for c in RUNNABLE if "gpu" in REGISTRY[c.key].kernels]


def test_the_kernel_ops_include_the_convolutional_models_ops():
    keys = {c.key for c in _kernel_cases()}
    wanted = """Conv dfdl.ConvGradInput dfdl.ConvGradWeight ConvTranspose BatchNormalization
    dfdl.BatchNormalizationReluGrad MaxPool dfdl.MaxPoolGrad GlobalAveragePool
    dfdl.AveragePoolGrad Concat""".split()
    assert set(wanted) <= keys, set(wanted) - keys


@pytest.mark.parametrize("case", _kernel_cases(), ids=lambda c: c.name())
def test_gpu_kernel_on_the_standin_matches_the_forward(case, standin):
    op = REGISTRY[case.key]
    inputs = [
        standin.asarray(x)
        if isinstance(x, np.ndarray) and x.ndim and x.dtype.kind == "f" and i not in case.consts
        else x
        for i, x in enumerate(case.inputs)
    ]
    fn = op.kernel("gpu")
    before = sum(device.FALLBACKS.values())
    got = fn(*_present(inputs), **case.attrs)
    fell_back = sum(device.FALLBACKS.values()) > before
    want = op.forward(*case.inputs, **case.attrs)
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for i in range(case.n_outputs):
        assert_matches(device.to_host(got[i]), np.asarray(want[i]), case, f"output {i}")
    takes = fn.accepts is None or fn.accepts(*_present(case.inputs), **case.attrs)
    member = case.attrs.get("update")  # an UpdateGroup runs its member op's tile function
    if member and "gpu" not in REGISTRY[f"dfdl.{member}"].kernels:
        takes = False
    assert fell_back == (not takes)
    if takes:
        assert all(device.is_device_array(g) for g in got[: case.n_outputs] if g is not None)


#: the zoo's models at test size: builder arguments, batch, optimizer
MODELS = {
    "mlp": ({"sizes": (12, 16, 4)}, 8, lambda: dfdl.optim.SGD(lr=0.05, momentum=0.9)),
    "resnet": (
        dict(in_channels=1, image_size=8, stem=4, stages=(4, 8), blocks_per_stage=1),
        4,
        lambda: dfdl.optim.SGD(lr=0.05, momentum=0.9),
    ),
    "unet3d": (
        {"in_channels": 1, "num_classes": 2, "base": 2, "levels": 2, "volume": 4},
        2,
        lambda: dfdl.optim.Adam(lr=0.01),
    ),
    "transformer": (
        dict(vocab=11, d_model=8, heads=2, ff=16, layers=1, seq=5, num_classes=3, dropout=0.1),
        4,
        lambda: dfdl.optim.AdamW(lr=0.01, weight_decay=0.01),
    ),
}
STEPS = 6


def _fallbacks() -> dict:
    from dfdl.ops.gpu.device import FALLBACKS

    runs = dict(FALLBACKS)
    FALLBACKS.clear()
    return runs


@pytest.fixture(scope="module")
def standin_gpu_client(standin, tmp_path_factory):
    """A one-worker ``dfdl.LocalCluster(gpus=1)`` whose worker imports the stand-in as
    cupy (spawned workers take the parent's ``sys.path``)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("CUDA_VISIBLE_DEVICES", "0")
    mp.syspath_prepend(str(STANDIN))
    try:
        with dfdl.LocalCluster(gpus=1) as cluster, Client(cluster) as client:
            yield client
    finally:
        mp.undo()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_zoo_trains_on_a_standin_gpu_worker_as_on_cpu_workers(name, standin_gpu_client, client):
    kw, batch, optimizer = MODELS[name]
    (X,) = dfdl.models.example_inputs(name, batch=STEPS * batch, seed=1, **kw).values()
    classes = kw["sizes"][-1] if name == "mlp" else kw.get("num_classes", 10)
    shape = (len(X), *X.shape[2:]) if name == "unet3d" else (len(X),)
    y = np.random.default_rng(2).integers(0, classes, size=shape, dtype=np.int64)
    common = dict(data=(X, y), batch_size=batch, epochs=1, shuffle=False, seed=3)
    assert dfdl.runtime.cluster.workers_device(standin_gpu_client) == "gpu"
    standin_gpu_client.run(_fallbacks)
    gpu = dfdl.train(ZOO[name](**kw), optimizer=optimizer(), client=standin_gpu_client, **common)
    (runs,) = standin_gpu_client.run(_fallbacks).values()
    cpu = dfdl.train(ZOO[name](**kw), optimizer=optimizer(), client=client, **common)
    np.testing.assert_allclose(gpu.history["loss"], cpu.history["loss"], rtol=1e-5)
    assert runs == {}, f"tiles that ran on the host of the GPU worker: {runs}"


def _device_rows(dask_scheduler=None) -> dict:
    from dfdl.runtime.monitor import monitor_of

    return monitor_of(dask_scheduler).snapshot()["workers"]


def test_the_dashboard_shows_the_gpu_worker_and_its_device_memory(standin_gpu_client):
    # a training registers the monitor; the worker's heartbeats bring its device metric
    kw, batch, optimizer = MODELS["mlp"]
    (X,) = dfdl.models.example_inputs("mlp", batch=4 * batch, seed=1, **kw).values()
    y = np.arange(len(X)) % kw["sizes"][-1]
    dfdl.train(ZOO["mlp"](**kw), data=(X, y), batch_size=batch, client=standin_gpu_client)
    deadline = time.monotonic() + 30
    while True:
        rows = standin_gpu_client.run_on_scheduler(_device_rows)
        if all(r["device_memory_bytes"] is not None for r in rows.values()) or (
            time.monotonic() > deadline
        ):
            break
        time.sleep(0.2)
    (row,) = rows.values()
    assert row["device"] == "gpu" and row["gpu"] == "0"
    assert row["device_memory_bytes"] == 0  # the stand-in's pool holds nothing
