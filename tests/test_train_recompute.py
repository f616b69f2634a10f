"""``dfdl.train(memory=...)``: recomputing activations instead of keeping (and spilling)
them gives the same losses and weights, bit for bit, on a cluster that spills."""

from __future__ import annotations

import dask
import numpy as np
import pytest
from distributed import Client

import dfdl
import dfdl.models
from dfdl.errors import ConfigError
from dfdl.training.passes.recompute import Segment, choose

UNET = dict(base=4, levels=3, volume=16)
LIMIT = 4 * 2**20  # per worker; Dask keeps a fifth of it in memory, spills the rest
SPILL_EARLY = {
    "distributed.worker.memory.target": 0.2,
    "distributed.worker.memory.spill": False,
    "distributed.worker.memory.pause": False,
    "distributed.worker.memory.terminate": False,
}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 1, 16, 16, 16)).astype(np.float32)
    return x, rng.integers(0, 2, size=(4, 16, 16, 16))


def _fit(client, data, memory, tiles=None, model=None, optimizer=None):
    return dfdl.train(
        model or dfdl.models.unet3d(**UNET),
        data=data,
        loss="cross_entropy",
        optimizer=optimizer or dfdl.optim.Adam(lr=1e-3),
        batch_size=2,
        steps=2,
        shuffle=False,
        client=client,
        tiles=tiles,
        progress=False,
        memory=memory,
    )


@pytest.fixture(scope="module")
def capped(data, tmp_path_factory):
    with (
        dask.config.set(SPILL_EARLY),
        dfdl.LocalCluster(
            2, memory_limit=LIMIT, local_directory=str(tmp_path_factory.mktemp("spill"))
        ) as cluster,
        Client(cluster) as client,
    ):
        runs = {m: _fit(client, data, m) for m in ("spill", "recompute")}
        # auto with pinned rates (dask config): a slow disk makes recomputing pay, a
        # fast one does not
        for name, disk in (("auto_slow_disk", 1e6), ("auto_fast_disk", 1e12)):
            speeds = {"dfdl.speeds.flops-per-s": 1e10, "dfdl.speeds.disk-bytes-per-s": disk}
            with dask.config.set(speeds):
                runs[name] = _fit(client, data, "auto")
        assert len(client.scheduler_info()["workers"]) == 2  # no worker lost
    return runs


def test_recompute_equals_spill_bit_for_bit(capped):
    spill, rc = capped["spill"], capped["recompute"]
    assert spill.tiles == rc.tiles
    assert spill.history["loss"] == rc.history["loss"]
    for k in spill.params:
        np.testing.assert_array_equal(rc.params[k], spill.params[k], err_msg=k)
    assert spill.recomputed == []
    assert rc.recomputed and all(not n.endswith(".recompute") for n in rc.recomputed)
    assert not rc.fused and not spill.fused  # beyond-memory plans run their tasks unfused
    # the spilling run really ran beyond the workers' memory
    assert sum(spill.history["spilled_bytes"]) > 0


@pytest.mark.parametrize("name", ["auto_slow_disk", "auto_fast_disk"])
def test_auto_changes_no_number(capped, name):
    auto = capped[name]
    assert auto.history["loss"] == capped["spill"].history["loss"]
    for k in auto.params:
        np.testing.assert_array_equal(auto.params[k], capped["spill"].params[k], err_msg=k)


def test_auto_recomputes_what_is_cheaper_than_spilling(capped):
    # at 1 MB/s every conv segment recomputes faster than its activations spill, and
    # together they bring the estimated working set under the workers' memory
    slow = capped["auto_slow_disk"].recomputed
    assert slow and set(slow) <= set(capped["recompute"].recomputed)
    # at 1 TB/s spilling is cheaper than any recomputation
    assert capped["auto_fast_disk"].recomputed == []


def test_unlimited_same_plan_equals_capped_recompute(capped, data, client):
    free = _fit(client, data, "spill", tiles=capped["recompute"].tiles)
    assert free.fused  # fits: its tasks ran fused, with the same numbers
    assert free.history["loss"] == capped["recompute"].history["loss"]
    auto = _fit(client, data, "auto", tiles=capped["recompute"].tiles)
    assert auto.recomputed == []  # nothing would spill: nothing recomputed


def test_dropout_recomputed_draws_the_same_masks(client):
    model = dfdl.models.transformer(
        vocab=20, d_model=8, heads=2, ff=16, layers=2, seq=6, num_classes=3, dropout=0.5
    )
    rng = np.random.default_rng(3)
    data = (rng.integers(0, 20, size=(8, 6)), rng.integers(0, 3, size=8))
    runs = {
        m: _fit(client, data, m, model=model, optimizer=dfdl.optim.SGD(lr=0.1))
        for m in ("spill", "recompute")
    }
    assert any("dropout" in n for n in runs["recompute"].recomputed)
    assert runs["spill"].history["loss"] == runs["recompute"].history["loss"]
    for k in runs["spill"].params:
        np.testing.assert_array_equal(runs["recompute"].params[k], runs["spill"].params[k])


def test_unknown_memory_mode_is_a_config_error_before_any_cluster():
    with pytest.raises(ConfigError, match="memory must be one of 'spill', 'recompute', 'auto'"):
        dfdl.train(
            dfdl.models.mlp((4, 3)),
            data=(np.ones((2, 4), np.float32), np.zeros(2, int)),
            memory="swap",
            progress=False,
        )


def _seg(i, saved, flops):
    return Segment(i, (f"n{i}",), (f"a{i}",), saved, flops, (f"n{i}",), f"g{i}")


def test_auto_takes_segments_cheaper_to_recompute_than_to_spill():
    # 1 GFLOP/s and 1 GB/s: recomputing costs flops/1e9 s, spilling 2 * bytes/1e9 s
    cheap, dear, mid = _seg(0, 10**6, 10**5), _seg(1, 10**6, 10**8), _seg(2, 10**6, 10**6)
    assert choose([cheap, dear, mid], 2 * 10**6, 1e9, 1e9) == [cheap, mid]
    # only as many as needed to cover the bytes that would spill, best ratio first
    assert choose([mid, cheap], 10**5, 1e9, 1e9) == [cheap]
    assert choose([cheap, mid], 0, 1e9, 1e9) == []
    # the qualifying segments cannot keep the step from spilling: none (dear does not
    # qualify, and cheap + mid save 2 MB of 3 MB)
    assert choose([cheap, dear, mid], 3 * 10**6, 1e9, 1e9) == []
    # a very slow disk makes even the dear one worth recomputing
    assert choose([cheap, dear], 2 * 10**6, 1e9, 1e6) == [cheap, dear]
