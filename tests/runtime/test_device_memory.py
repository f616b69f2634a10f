"""A GPU worker's device memory limit (dfdl.runtime.device_memory) on the cupy stand-in
(tests/ops/gpu/standin): the buffer keeps device values within the limit and brings
moved ones back as they were; a training whose weights and optimizer state are 4x the
device limit trains with device spilling to the losses of an unlimited GPU worker."""

from __future__ import annotations

import numpy as np
import pytest
from distributed import Client

import dfdl
from dfdl.errors import ConfigError
from dfdl.models import ZOO
from dfdl.runtime.device_memory import DeviceSpillBuffer, OnHost, device_spill_counts
from tests.ops.gpu.standin import PATH as STANDIN
from tests.ops.gpu.standin import as_cupy


@pytest.fixture(scope="module")
def cupy():
    with as_cupy() as module:
        yield module


def test_device_values_past_the_limit_move_to_the_host_and_come_back(cupy, tmp_path):
    buf = DeviceSpillBuffer(device_limit=64, host_target=2**20, worker_local_directory=tmp_path)
    a, b, c = (cupy.asarray(np.full(8, v, np.float32)) for v in (1, 2, 3))  # 32 bytes each
    buf["a"], buf["b"] = a, b
    assert buf.device_bytes == 64 and not buf.host
    buf["c"] = c  # past the limit: the least recently used (a) goes to the host
    assert list(buf.device) == ["b", "c"] and isinstance(buf.host["a"], OnHost)
    assert buf.device_spilled == [1, 32]
    got = buf["a"]  # back on the device, and b (now the oldest) leaves
    assert type(got) is cupy.ndarray and np.array_equal(got.get(), a.get())
    assert list(buf.device) == ["c", "a"] and buf.device_unspilled == [1, 32]
    assert buf.device_bytes <= 64 and len(buf) == 3 and set(buf) == {"a", "b", "c"}
    del buf["b"], buf["a"]
    assert set(buf) == {"c"} and buf.device_bytes == 32


def test_a_moved_tuple_comes_back_with_its_host_leaves_on_the_host(cupy, tmp_path):
    buf = DeviceSpillBuffer(device_limit=16, host_target=2**20, worker_local_directory=tmp_path)
    mask = np.array([True, False])
    buf["t"] = (cupy.asarray(np.ones(4, np.float32)), mask, 7)
    buf["u"] = cupy.asarray(np.zeros(4, np.float32))  # t leaves the device
    t = buf["t"]
    assert type(t[0]) is cupy.ndarray and type(t[1]) is np.ndarray and t[2] == 7
    buf["h"] = np.ones(3)  # a host value never counts against the device
    assert "h" in buf.host and buf.device_bytes <= 16


def test_one_value_larger_than_the_limit_stays_while_newest(cupy, tmp_path):
    buf = DeviceSpillBuffer(device_limit=8, host_target=2**20, worker_local_directory=tmp_path)
    buf["big"] = cupy.asarray(np.ones(16, np.float32))
    assert "big" in buf.device
    buf["next"] = cupy.asarray(np.ones(1, np.float32))
    assert "big" in buf.host and "next" in buf.device


def test_a_device_memory_limit_needs_gpu_workers_and_a_byte_count(monkeypatch):
    with pytest.raises(ConfigError, match="give gpus=N too"):
        dfdl.LocalCluster(1, device_memory_limit="1GiB")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(ConfigError, match="device_memory_limit must be a positive"):
        dfdl.LocalCluster(gpus=1, device_memory_limit="lots")


def _gpu_cluster(monkeypatch, **kw):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.syspath_prepend(str(STANDIN))
    return dfdl.LocalCluster(gpus=1, **kw)


def test_a_working_set_4x_the_device_limit_trains_as_without_a_limit(monkeypatch):
    limit = 2 * 2**20
    model = ZOO["mlp"](sizes=(64, 1024, 1024, 10))
    n_weights = 64 * 1024 + 1024 * 1024 + 1024 * 10 + 1024 + 1024 + 10
    assert 2 * 4 * n_weights >= 4 * limit  # weights and momentum: 4x the device limit
    x = np.random.default_rng(0).standard_normal((48, 64)).astype(np.float32)
    y = np.arange(48) % 10
    kw = dict(
        data=(x, y), batch_size=8, epochs=1, shuffle=False, seed=2,
        optimizer=dfdl.optim.SGD(lr=0.01, momentum=0.9),
    )  # fmt: skip
    with _gpu_cluster(monkeypatch, device_memory_limit=limit) as cluster, Client(cluster) as c:
        capped = dfdl.train(model, client=c, **kw)
        (counts,) = c.run(device_spill_counts).values()
    with _gpu_cluster(monkeypatch) as cluster, Client(cluster) as c:
        free = dfdl.train(model, client=c, **kw)
        assert list(c.run(device_spill_counts).values()) == [None]
    assert counts["spilled"][1] > 0 and counts["unspilled"][1] > 0
    assert counts["device_bytes"] <= limit
    # the history reports it per step (not what gathering the weights moved afterwards)
    assert 0 < sum(capped.history["device_spilled_bytes"]) <= counts["spilled"][1]
    assert 0 < sum(capped.history["device_unspilled_bytes"]) <= counts["unspilled"][1]
    assert sum(free.history["device_spilled_bytes"]) == 0
    np.testing.assert_allclose(capped.history["loss"], free.history["loss"], rtol=1e-5)
    for name, value in free.params.items():
        np.testing.assert_allclose(capped.params[name], value, rtol=1e-4, atol=1e-6)
