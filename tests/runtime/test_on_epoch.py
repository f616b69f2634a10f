"""``dfdl.train(on_epoch=...)``: told every epoch's losses and validation metrics, and
able to stop training there with the weights of that epoch; the losses are those of a
run to the end, bit for bit; its checkpoint comes after it, so a run resumed after a
stop tells the next epoch only."""

from __future__ import annotations

import numpy as np
import pytest

import dfdl
import dfdl.models
from dfdl.errors import ConfigError

SIZES = (4, 8, 3)
N, BATCH = 16, 4  # 4 steps per epoch


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], size=N, dtype=np.int64)
    return dfdl.models.mlp(SIZES), (X, y), (X[:8], y[:8])


def _train(client, setup, **kw):
    model, data, validation = setup
    return dfdl.train(
        model, data, validation=validation, client=client, progress=False, batch_size=BATCH,
        optimizer=dfdl.optim.SGD(lr=0.1, momentum=0.9), epochs=3, **kw,
    )  # fmt: skip


def test_on_epoch_is_told_each_epoch_and_stops_training(client, setup, tmp_path):
    full = _train(client, setup)
    told = []

    def on_epoch(end):
        told.append(end)
        return end.epoch == 2

    stopped = _train(
        client, setup, on_epoch=on_epoch, checkpoint_dir=tmp_path, checkpoint_every=N // BATCH
    )
    assert [e.epoch for e in told] == [1, 2] and [e.step for e in told] == [4, 8]
    assert stopped.stopped_epoch == 2 and full.stopped_epoch is None
    assert stopped.history["loss"] == full.history["loss"][:8]
    assert [e.losses for e in told] == [full.history["loss"][:4], full.history["loss"][4:8]]
    assert [e.metrics["loss"] for e in told] == full.history["val_loss"][:2]
    assert stopped.history["val_loss"] == full.history["val_loss"][:2]
    # the stop came before epoch 2's checkpoint: resuming replays epoch 2, told again
    assert [p.name for p in tmp_path.glob("step-*")] == ["step-000000004.npz"]
    again = []
    resumed = _train(
        client, setup, on_epoch=again.append, checkpoint_dir=tmp_path,
        checkpoint_every=N // BATCH, resume=True,
    )  # fmt: skip
    assert [e.epoch for e in again] == [2, 3]
    assert resumed.history["loss"] == full.history["loss"][4:]
    for k, v in resumed.params.items():
        assert np.array_equal(v, full.params[k]), k


def test_on_epoch_must_be_callable():
    with pytest.raises(ConfigError, match="on_epoch must be a callable"):
        dfdl.train(dfdl.models.mlp(SIZES), (np.ones((4, 4), np.float32), np.zeros(4, int)),
                   on_epoch=3)  # fmt: skip
