"""Training with spatial slabs: one sample's activations split across tasks and workers.

A 3-D U-Net (Conv, BatchNormalization, MaxPool, ConvTranspose, Concat) trained with its
volumes cut into slabs along depth gives the losses and weights of the run without
slabs, to float rounding; under a memory limit that one sample's activations exceed,
the planner splits space by itself.
"""

from __future__ import annotations

import numpy as np
import pytest

import dfdl
import dfdl.models
from dfdl.plan.compile import plan_graph
from dfdl.plan.tiling import TASK_MEMORY_FRACTION

UNET = dict(in_channels=1, num_classes=2, base=2, levels=2, volume=8)


def _fit(client, tiles, steps=2):
    model = dfdl.models.unet3d(**UNET)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2 * steps, 1, 8, 8, 8)).astype(np.float32)
    y = rng.integers(0, 2, size=(2 * steps, 8, 8, 8))
    return dfdl.train(
        model,
        data=(X, y),
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=0.05, momentum=0.9),
        batch_size=2,
        steps=steps,
        shuffle=False,
        client=client,
        tiles=tiles,
        progress=False,
    )


@pytest.fixture(scope="module")
def whole(client):
    return _fit(client, {"batch": 1})


@pytest.mark.parametrize("tiles", [{"batch": 1, "space": 3}, {"batch": 2, "space": 2}, "uneven"])
def test_slabs_train_like_whole_volumes(client, whole, tiles):
    sliced = _fit(client, tiles)
    assert sliced.tiles == (tiles if tiles == "uneven" else {"model": 1, **tiles})
    np.testing.assert_allclose(sliced.history["loss"], whole.history["loss"], rtol=1e-5)
    for k, w in whole.params.items():
        np.testing.assert_allclose(sliced.params[k], w, rtol=1e-4, atol=1e-6, err_msg=k)


def test_slab_plan_splits_every_sliding_window_node():
    plan = dfdl.plan(dfdl.models.unet3d(**UNET), batch_size=1, tiles={"space": 4})
    for np_ in plan.nodes:
        if np_.node.op_type in ("Conv", "ConvTranspose", "MaxPool"):
            depth = np_.spec.spatial[0]
            assert len(np_.letters[depth]) > 1, np_.node.name


def test_memory_limit_below_one_sample_splits_space():
    """Batch 1 cannot be split further: only slabs bring the tasks under the limit."""
    model = dfdl.models.unet3d(in_channels=1, num_classes=2, base=4, levels=2, volume=32)
    whole = dfdl.plan(model, batch_size=1)
    limit = whole.peak_task()[1] // 3  # a third of the largest task's estimate
    with pytest.raises(dfdl.errors.MemoryPlanError):
        dfdl.plan(model, batch_size=1, tiles={"batch": 1, "model": 1}, memory_limit=limit)
    bounded = dfdl.plan(model, batch_size=1, memory_limit=limit / TASK_MEMORY_FRACTION)
    assert bounded.tiles.get("space", 1) > 1
    assert bounded.peak_task()[1] <= limit


def test_training_plan_under_a_limit_splits_space():
    """The training graph (backward convolutions included) plans with slabs as well."""
    from dfdl.ir.onnx_io import to_ir
    from dfdl.ops.registry import TensorType
    from dfdl.training.graph import build_training_graph

    model = dfdl.models.unet3d(in_channels=1, num_classes=2, base=4, levels=2, volume=32)
    tg = build_training_graph(
        to_ir(model),
        {"x": TensorType((1, 1, 32, 32, 32), np.dtype("float32"))},
        loss="cross_entropy",
        optimizer=dfdl.optim.Adam(lr=1e-3),
        labels=TensorType((1, 32, 32, 32), np.dtype("int64")),
    )
    free = plan_graph(tg)
    limit = free.peak_task()[1] // 3
    bounded = plan_graph(tg, memory_limit=limit / TASK_MEMORY_FRACTION)
    assert bounded.tiles.get("space", 1) > 1
    assert bounded.peak_task()[1] <= limit
    kinds = {
        n.node.op_type
        for n in bounded.nodes
        if n.spec.spatial and len(n.letters[n.spec.spatial[0]]) > 1
    }
    assert {"Conv", "ConvGradInput", "ConvGradWeight", "ConvTranspose", "MaxPool"} <= kinds


def test_batch_norm_split_when_a_channel_does_not_fit(tmp_path):
    """Under a limit that one BatchNorm channel of the batch exceeds, training splits
    BatchNorm into tiled passes, spills, and still trains like whole volumes."""
    import dask
    from distributed import Client

    from tests.test_train_spill import MANAGED_ONLY

    rng = np.random.default_rng(0)
    X = rng.standard_normal((4, 1, 16, 16, 16)).astype(np.float32)
    y = rng.integers(0, 2, size=(4, 16, 16, 16))
    common = dict(
        data=(X, y),
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=0.05, momentum=0.9),
        batch_size=2,
        steps=2,
        shuffle=False,
        progress=False,
    )
    model = dfdl.models.unet3d(base=2, levels=2, volume=16)
    with (
        dask.config.set(MANAGED_ONLY),
        dfdl.LocalCluster(2, memory_limit=512 * 2**10, local_directory=str(tmp_path)) as c,
        Client(c) as client,
    ):
        capped = dfdl.train(model, client=client, memory="spill", **common)
    with dfdl.LocalCluster(2) as c, Client(c) as client:
        free = dfdl.train(model, client=client, tiles={"batch": 1}, **common)
        same_plan = dfdl.train(model, client=client, tiles=capped.tiles, **common)
    assert capped.tiles["space"] > 1 and capped.tiles["split_norms"] == 1
    # the tiling handed back repeats the split graph: the same numbers, bit for bit
    assert same_plan.tiles == capped.tiles
    assert same_plan.history["loss"] == capped.history["loss"]
    assert sum(capped.history["spilled_bytes"]) > 0
    np.testing.assert_allclose(capped.history["loss"], free.history["loss"], rtol=1e-5)
    for k, w in free.params.items():
        np.testing.assert_allclose(capped.params[k], w, rtol=1e-4, atol=1e-6, err_msg=k)
