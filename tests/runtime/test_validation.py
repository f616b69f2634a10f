"""Validation data: checked as the training data are, before any task reaches the
scheduler (not at the end of the first epoch), and a non-finite validation loss is
reported once while training goes on.

As in ``tests/test_train_errors.py``, a scheduler plugin counts every graph submission
and task transition; each failing ``dfdl.train(..., validation=...)`` is checked to
leave those counters (and the scheduler's task table) unchanged.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from onnx import helper

import dfdl
import dfdl.models
from dfdl.errors import DataError, DfdlError, ShapeError
from tests import scheduler_probe
from tests.ir.helpers import I64, make_model, vi
from tests.scheduler_probe import scheduler_state

SIZES = (4, 8, 3)

#: the probe cluster (counts submissions), overriding the session's client fixture
client = scheduler_probe.client
nothing_submitted = scheduler_probe.nothing_submitted


@pytest.fixture(scope="module")
def mlp():
    return dfdl.models.mlp(SIZES)


def data(n: int = 16, features: int = SIZES[0], classes: int = SIZES[-1]):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, features)).astype(np.float32)
    y = rng.integers(0, classes, size=n, dtype=np.int64)
    return X, y


def validation_fails(client, exc, model, validation, *, match=(), train_data=None, **kwargs):
    """``dfdl.train`` with good training data and ``validation`` raises ``exc`` whose
    message names the validation data and contains every ``match``; returns it."""
    with pytest.raises(exc) as info:
        dfdl.train(
            model,
            data() if train_data is None else train_data,
            validation=validation,
            client=client,
            progress=False,
            batch_size=4,
            epochs=2,
            **kwargs,
        )
    message = str(info.value)
    assert message.startswith("validation"), message
    for m in match:
        assert m in message, f"{m!r} not in {message!r}"
    assert isinstance(info.value, DfdlError)
    return info.value


@pytest.mark.usefixtures("nothing_submitted")
def test_wrong_sample_shape_names_the_input_and_its_shape(client, mlp):
    X, y = data(10, features=5)
    err = validation_fails(
        client, ShapeError, mlp, (X, y), match=["validation X has shape (10, 5)", "(batch, 4)"]
    )
    assert err.name == "x" and err.given == (10, 5)
    X3 = np.zeros((10, 2, SIZES[0]), np.float32)
    validation_fails(client, ShapeError, mlp, (X3, y), match=["(10, 2, 4)", "'x' takes"])


@pytest.mark.usefixtures("nothing_submitted")
def test_wrong_dtype_says_what_to_convert_to(client, mlp):
    X, y = data(10)
    err = validation_fails(
        client,
        ShapeError,
        mlp,
        (X.astype(np.float64), y),
        match=["validation X has dtype float64", "takes float32", "astype('float32')"],
    )
    assert err.expected == np.float32


@pytest.mark.usefixtures("nothing_submitted")
def test_sample_counts_and_missing_labels(client, mlp):
    X, y = data(10)
    validation_fails(client, DataError, mlp, (X, y[:7]), match=["10", "7"])
    validation_fails(client, DataError, mlp, (X[:0], y[:0]), match=["no samples"])
    validation_fails(client, DataError, mlp, X, match=["needs labels", "(X_val, y_val)"])


@pytest.mark.usefixtures("nothing_submitted")
def test_labels_out_of_range_or_of_the_wrong_kind(client, mlp):
    X, y = data(10)
    y[8] = 3
    validation_fails(client, DataError, mlp, (X, y), match=["validation y: label 3", "3 classes"])
    y[8] = -2
    validation_fails(client, DataError, mlp, (X, y), match=["label -2"])
    # float labels and a wrong label shape, as the loss refuses training labels
    validation_fails(client, ShapeError, mlp, (X, y.astype(np.float32)), match=["integer"])
    wide = np.zeros((10, 2), np.int64)
    validation_fails(client, ShapeError, mlp, (X, wide), match=["labels of shape [4, 2]"])


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


def token_model(vocab: int = 7, seq: int = 5):
    """A language model: tokens (N, T) -> embedding -> logits (N, T, vocab)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Gather", ["embed", "tokens"], ["h"], name="embed_lookup"),
        helper.make_node("MatMul", ["h", "head"], ["logits"], name="head_matmul"),
    ]
    inits = {
        "embed": rng.standard_normal((vocab, 6)).astype(np.float32),
        "head": rng.standard_normal((6, vocab)).astype(np.float32),
    }
    return make_model(
        nodes, [vi("tokens", ["batch", seq], I64)], [vi("logits", ["batch", seq, vocab])], inits
    )


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


@pytest.mark.usefixtures("nothing_submitted")
def test_language_model_labels_are_checked_against_the_vocabulary(client):
    """Logits (N, T, V) with labels (N, T): the classes are the last axis, V."""
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 7, (8, 5))
    train = (tokens, rng.integers(0, 7, (8, 5)))
    y_val = rng.integers(0, 7, (6, 5))
    y_val[4, 2] = 7
    validation_fails(
        client,
        DataError,
        token_model(),
        (tokens[:6], y_val),
        train_data=train,
        match=["validation y: label 7", "7 classes (valid labels 0..6)"],
    )


@pytest.mark.usefixtures("nothing_submitted")
def test_the_training_data_are_still_checked_first(client, mlp):
    X, y = data()
    y[3] = 9
    with pytest.raises(DataError, match="^label 9 is out of range"):
        dfdl.train(mlp, (X, y), validation=data(4), client=client, progress=False, batch_size=4)


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
