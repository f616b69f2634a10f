"""Validation data: what is accepted (ignored labels, a language model's labels, a
model computing its own loss), and a non-finite validation loss reported once while
training goes on. Bad validation data (refused before any task reaches the scheduler,
not at the end of the first epoch) are rows of the bad-input table,
``tests/test_bad_input.py``.

The cluster is the scheduler probe's (``tests/scheduler_probe.py``), which counts what
reaches the scheduler.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from onnx import helper

import dfdl
import dfdl.models
from tests import scheduler_probe
from tests.ir.helpers import make_model, token_model, vi
from tests.scheduler_probe import scheduler_state

SIZES = (4, 8, 3)

#: the probe cluster (counts submissions), overriding the session's client fixture
client = scheduler_probe.client


@pytest.fixture(scope="module")
def mlp():
    return dfdl.models.mlp(SIZES)


def data(n: int = 16, features: int = SIZES[0], classes: int = SIZES[-1]):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, features)).astype(np.float32)
    y = rng.integers(0, classes, size=n, dtype=np.int64)
    return X, y


def test_ignore_index_is_allowed_in_validation_labels(client, mlp):
    X, y = data(10)
    y[8] = -100
    result = dfdl.train(
        mlp,
        data(8),
        validation=(X, y),
        client=client,
        progress=False,
        batch_size=4,
        loss_options={"ignore_index": -100},
    )
    assert len(result.history["val_loss"]) == 1


def test_language_model_accuracy_is_per_token_without_ignored_labels(client):
    """A language model's accuracy: each token's largest score (the last axis) against its
    label, tokens labelled ``ignore_index`` left out (it was the argmax over the
    sequence axis, divided by the samples)."""
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, 7, (8, 5))
    y_val = rng.integers(0, 7, (6, 5))
    y_val[1, :3] = -100
    result = dfdl.train(
        token_model(),
        (tokens, rng.integers(0, 7, (8, 5))),
        validation=(tokens[:6], y_val),
        client=client,
        progress=False,
        batch_size=4,
        loss_options={"ignore_index": -100},
    )
    logits = dfdl.run(result.model, {"tokens": tokens[:6]}, client=client)["logits"]
    kept = y_val != -100
    want = ((logits.argmax(axis=-1) == y_val) & kept).sum() / kept.sum()
    assert result.history["val_accuracy"] == [pytest.approx(want)]
    assert 0.0 <= want <= 1.0


def test_nan_validation_data_warn_once_naming_the_epoch(client, mlp, caplog):
    """NaN in the validation data: the validation loss is NaN, reported once (at the
    first epoch), and training goes on to the end with finite losses."""
    before = scheduler_state(client)
    X, y = data(8)
    Xv, yv = data(6)
    Xv[2, 1] = np.nan
    with caplog.at_level(logging.WARNING, logger="dfdl"):
        result = dfdl.train(
            mlp,
            (X, y),
            validation=(Xv, yv),
            client=client,
            progress=False,
            batch_size=4,
            epochs=3,
        )
    assert scheduler_state(client)["update_graph"] > before["update_graph"]
    assert len(result.history["loss"]) == 6 and np.isfinite(result.history["loss"]).all()
    assert len(result.history["val_loss"]) == 3 and np.isnan(result.history["val_loss"]).all()
    warned = [r.getMessage() for r in caplog.records if "validation loss" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "the validation loss is nan after epoch 1 (step 2)" in warned[0]
    assert "NaN or infinite" in warned[0]
    # finite validation data: no warning
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dfdl"):
        result = dfdl.train(
            mlp, (X, y), validation=data(6), client=client, progress=False, batch_size=4
        )
    assert np.isfinite(result.history["val_loss"]).all()
    assert not [r for r in caplog.records if "validation loss" in r.getMessage()]


def test_a_model_computing_its_own_loss_reports_it_on_validation_data(client):
    """``loss=`` a model output: the validation loss is that output over the validation
    data (it used to be 0.0), and NaN in them is reported as for other losses."""
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["recon"], name="decode"),
        helper.make_node("Sub", ["recon", "x"], ["err"], name="err"),
        helper.make_node("Mul", ["err", "err"], ["sq"], name="square"),
        helper.make_node("ReduceMean", ["sq"], ["mse"], name="mean", keepdims=0),
    ]
    w = rng.standard_normal((4, 4)).astype(np.float32)
    model = make_model(
        nodes, [vi("x", ["batch", 4])], [vi("mse", []), vi("recon", ["batch", 4])], {"w": w}
    )
    X = rng.standard_normal((8, 4)).astype(np.float32)
    Xv = rng.standard_normal((4, 4)).astype(np.float32)
    kwargs = dict(loss="mse", client=client, progress=False, batch_size=4, epochs=2)
    result = dfdl.train(model, X, validation=Xv, **kwargs)
    expected = dfdl.run(result.model, {"x": Xv}, client=client)["mse"]
    assert result.history["val_loss"][-1] == pytest.approx(float(expected), rel=1e-6)
    assert result.history["val_loss"][0] > result.history["val_loss"][-1] > 0
