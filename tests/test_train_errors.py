"""Bad training input fails with a named dfdl error before any task reaches the scheduler.

As in ``tests/ir/test_errors.py``, a scheduler plugin counts every graph submission
and task transition; each failing ``dfdl.train(..., client=client)`` is checked to leave
those counters (and the scheduler's task table) unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import dfdl
import dfdl.models
from dfdl.errors import ConfigError, DataError, DfdlError, ShapeError
from dfdl.training.losses import LOSSES
from tests import scheduler_probe
from tests.ir.helpers import make_model, vi
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


def train_fails(client, exc, model, train_data, *, match=(), **kwargs):
    """``dfdl.train`` raises ``exc`` whose message contains every ``match``; returns it."""
    kwargs.setdefault("optimizer", dfdl.optim.SGD(lr=0.1))
    with pytest.raises(exc) as info:
        dfdl.train(model, train_data, client=client, progress=False, batch_size=4, **kwargs)
    message = str(info.value)
    for m in match:
        assert m in message, f"{m!r} not in {message!r}"
    assert isinstance(info.value, DfdlError)
    return info.value


def test_successful_training_is_seen_by_the_measure(client, mlp):
    """Positive control: a good run does change every counter the other tests compare."""
    before = scheduler_state(client)
    result = dfdl.train(mlp, data(8), client=client, progress=False, batch_size=4)
    assert len(result.history["loss"]) == 2
    after = scheduler_state(client)
    assert after["update_graph"] > before["update_graph"]
    assert after["plugin_transitions"] > before["plugin_transitions"]
    assert after["transition_counter"] > before["transition_counter"]


@pytest.mark.usefixtures("nothing_submitted")
def test_label_out_of_range(client, mlp):
    X, y = data()
    y[11] = 7
    train_fails(client, DataError, mlp, (X, y), match=["label 7", "3 classes"])
    y[11] = -1
    train_fails(client, DataError, mlp, (X, y), match=["label -1", "3 classes"])


@pytest.mark.usefixtures("nothing_submitted")
def test_label_out_of_range_per_voxel(client):
    """Segmentation labels (N, D, H, W) are range-checked too."""
    model = dfdl.models.unet3d(base=2, levels=1, volume=2, num_classes=2)
    X = np.zeros((4, 1, 2, 2, 2), np.float32)
    y = np.zeros((4, 2, 2, 2), np.int64)
    y[3, 1, 0, 1] = 2
    train_fails(client, DataError, model, (X, y), match=["label 2", "2 classes"])


@pytest.mark.usefixtures("nothing_submitted")
def test_wrong_feature_shape_names_the_input(client, mlp):
    X, y = data(features=SIZES[0] + 1)
    err = train_fails(client, ShapeError, mlp, (X, y), match=["'x'", str(SIZES[0])])
    assert err.name == "x"
    # wrong rank
    X3 = np.zeros((16, 2, SIZES[0]), np.float32)
    err = train_fails(client, ShapeError, mlp, (X3, y), match=["'x'", "rank"])
    assert err.name == "x"


@pytest.mark.usefixtures("nothing_submitted")
def test_unknown_loss_lists_the_valid_ones(client, mlp):
    err = train_fails(client, ConfigError, mlp, data(), loss="crossentropy")
    message = str(err)
    assert "crossentropy" in message
    for name in LOSSES:
        assert name in message


@pytest.mark.usefixtures("nothing_submitted")
@pytest.mark.parametrize("make", [dfdl.optim.SGD, dfdl.optim.Adam, dfdl.optim.AdamW])
def test_negative_learning_rate(client, mlp, make):
    with pytest.raises(ConfigError, match="lr") as info:
        make(lr=-0.1)
    assert "-0.1" in str(info.value)


@pytest.mark.usefixtures("nothing_submitted")
def test_schedule_reaching_a_negative_learning_rate(client, mlp):
    """A schedule whose lr turns negative mid-run is refused before the first step."""
    opt = dfdl.optim.SGD(lr=0.1, schedule=lambda step, base: base - 0.05 * step)
    train_fails(client, ConfigError, mlp, data(), optimizer=opt, match=["learning rate"])


@pytest.mark.usefixtures("nothing_submitted")
def test_no_trainable_parameters(client, mlp):
    relu = helper.make_node("Relu", ["x"], ["logits"], name="relu")
    model = make_model([relu], [vi("x", ["batch", 3])], [vi("logits", ["batch", 3])])
    train_fails(client, ConfigError, model, data(features=3), match=["no trainable parameters"])
    everything = [f"layers.{i}.{k}" for i in range(len(SIZES) - 1) for k in ("weight", "bias")]
    train_fails(client, ConfigError, mlp, data(), frozen=everything, match=["no trainable"])


@pytest.mark.usefixtures("nothing_submitted")
def test_x_y_length_mismatch(client, mlp):
    X, y = data()
    train_fails(client, DataError, mlp, (X, y[:-3]), match=["16", "13"])
    train_fails(client, DataError, mlp, (X[:5], y), match=["5", "16"])
