"""GPU clusters as far as a machine without a GPU can check them: which device a
cluster's workers get, a GPU per worker, and clear errors before any work for clusters
that cannot run dfdl's GPU kernels. Training on a GPU runs in tests/gpu."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from distributed import Client, get_task_stream

import dfdl
from dfdl.errors import ConfigError
from dfdl.models import ZOO
from dfdl.runtime.cluster import gpu_workers, placement, visible_gpus, workers_device
from dfdl.runtime.worker_setup import GPU_LIST_ENV
from tests.ops.gpu.standin import PATH as STANDIN


def _has_cupy_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001
        return False


def test_a_cluster_without_gpus_trains_on_cpus():
    with dfdl.LocalCluster(1, dashboard_address=None) as cluster, Client(cluster) as client:
        assert workers_device(client) == "cpu"


@pytest.mark.skipif(_has_cupy_gpu(), reason="this machine can run GPU kernels")
def test_workers_that_declare_a_gpu_they_cannot_use_are_refused_before_training():
    x = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    y = np.arange(16) % 3
    with (
        dfdl.LocalCluster(1, resources={"GPU": 1}) as cluster,
        Client(cluster) as client,
    ):
        with pytest.raises(ConfigError, match="declare a GPU cannot run GPU kernels") as e:
            dfdl.train(ZOO["mlp"](sizes=(4, 8, 3)), data=(x, y), batch_size=8, client=client)
        assert "gpu extra" in str(e.value) and "cupy" in str(e.value).lower()
        assert not client.who_has()  # nothing was computed or scattered


def test_a_cluster_mixing_gpu_and_cpu_workers_trains_on_its_gpu_workers(client):
    """A CPU worker of dfdl's and a plain ``dask worker --resources GPU=1`` that imports
    the cupy stand-in (tests/ops/gpu/standin): every task of the training runs on the GPU
    worker, the weights are scattered there, and the losses are a CPU cluster's."""
    x = np.random.default_rng(0).standard_normal((48, 6)).astype(np.float32)
    y = np.arange(48) % 3
    kw = dict(data=(x, y), batch_size=8, epochs=1, shuffle=False, seed=1)
    val = {"validation": (x[:16], y[:16])}
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(STANDIN), os.getcwd(), os.environ.get("PYTHONPATH", "")]
        ),
    }
    with (
        dfdl.LocalCluster(1, security=False) as cluster,
        Client(cluster) as hybrid,
    ):
        extra = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address]
            + ["--nthreads", "2", "--resources", "GPU=1", "--no-dashboard"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        try:
            hybrid.wait_for_workers(2, timeout=60)
            (gpu,) = gpu_workers(hybrid)
            assert workers_device(hybrid) == "gpu"
            assert placement(hybrid, "gpu") == {"resources": {"GPU": 1}, "workers": [gpu]}
            with get_task_stream(hybrid) as stream:
                got = dfdl.train(ZOO["mlp"](sizes=(6, 16, 3)), client=hybrid, **kw)
            ran_on = {r["worker"] for r in stream.data}
            assert stream.data and ran_on == {gpu}, ran_on
            # validation passes (numpy weights, CPU tile functions) may run on any worker
            checked = dfdl.train(ZOO["mlp"](sizes=(6, 16, 3)), client=hybrid, **kw, **val)
        finally:
            extra.terminate()
            extra.wait(30)
    want = dfdl.train(ZOO["mlp"](sizes=(6, 16, 3)), client=client, **kw)
    np.testing.assert_allclose(got.history["loss"], want.history["loss"], rtol=1e-5)
    on_cpu = dfdl.train(ZOO["mlp"](sizes=(6, 16, 3)), client=client, **kw, **val)
    np.testing.assert_allclose(checked.history["val_loss"], on_cpu.history["val_loss"], rtol=1e-5)


def test_a_cluster_without_gpu_workers_has_no_placement():
    with dfdl.LocalCluster(1, dashboard_address=None) as cluster, Client(cluster) as client:
        assert placement(client, workers_device(client)) == {}


def _worker_gpu(dask_worker) -> tuple:
    return dask_worker.name, os.environ["CUDA_VISIBLE_DEVICES"]


def test_each_worker_of_a_gpu_cluster_sees_its_own_gpu():
    # the worker setup's part of dfdl.LocalCluster(gpus=2), on any machine
    with (
        dfdl.LocalCluster(2, env={GPU_LIST_ENV: "5,7"}) as cluster,
        Client(cluster) as client,
    ):
        seen = client.run(_worker_gpu)
    assert sorted(seen.values()) == [(0, "5"), (1, "7")]


@pytest.mark.skipif(bool(visible_gpus()), reason="this machine has a GPU")
def test_asking_for_more_gpus_than_the_machine_has_is_refused():
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="gpus=1, but this machine has 0 NVIDIA GPU"):
        dfdl.LocalCluster(gpus=1)
    assert time.monotonic() - t0 < 30  # no cluster was started


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(gpus=-1), "gpus must be a non-negative integer"),
        (dict(gpus=True), "gpus must be a non-negative integer"),
        (dict(gpus=2, n_workers=3), "one worker per GPU"),
    ],
)
def test_bad_gpu_arguments_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        dfdl.LocalCluster(**kwargs)
