"""The space resolved against dfdl.train's arguments, the optimizer and the model builder."""

from __future__ import annotations

import pytest

import dfdl
import dfdl.models
from dfdl.errors import ConfigError
from dfdl.space import choice, loguniform, uniform
from dfdl.tuning.params import resolve_space

pytest.importorskip("optuna")


def builder(width: int = 8, lr: float = 0.0):
    return dfdl.models.mlp((4, width, 3))


def test_keys_go_to_train_optimizer_loss_options_and_the_builder():
    s = resolve_space(
        {
            "optimizer.lr": loguniform(1e-3, 0.1),
            "batch_size": choice([8, 16]),
            "optimizer": choice(["sgd", dfdl.optim.AdamW]),
            "loss_options.ignore_index": -1,
            "model.width": choice([4, 8]),
        },
        {"epochs": 2, "weight_decay": 0.01},
        builder,
    )
    values = s.decode({"optimizer.lr": 0.01, "batch_size": 16, "optimizer": "AdamW",
                       "model.width": 4})  # fmt: skip
    args = s.arguments(values)
    assert type(args.optimizer) is dfdl.optim.AdamW
    assert (args.optimizer.lr, args.optimizer.weight_decay) == (0.01, 0.01)
    assert args.train == {"batch_size": 16, "epochs": 2, "loss_options": {"ignore_index": -1}}
    assert args.model_kwargs == {"width": 4}
    low, high = s.corners()
    assert (low["batch_size"], high["batch_size"]) == (8, 16)
    assert (low["optimizer.lr"], high["optimizer.lr"]) == (1e-3, 0.1)


@pytest.mark.parametrize(
    "space, fixed, model, match",
    [
        ({"nope": uniform(0, 1)}, {}, None, "space key 'nope' is not a dfdl.train argument"),
        ({"seed": choice([1, 2])}, {}, None, "dfdl.tune sets seed itself"),
        ({"lr": uniform(0, 1)}, {"lr": 0.1}, None, "'lr' is given both in space"),
        ({"lr": 0.1}, {}, None, "space has no distribution to search"),
        ({}, {}, None, "space must be a non-empty dict"),
        (
            {"momentum": uniform(0, 0.9), "optimizer": choice(["sgd", "adam"])},
            {},
            None,
            "Adam takes no 'momentum'",
        ),
        (
            {"lr": uniform(0, 1)},
            {},
            builder,
            "both an optimizer hyperparameter and a model-builder",
        ),
        ({"optimizer": choice(["sgd", "rmsprop"])}, {}, None, "optimizer must be one of"),
        ({"lr": uniform(0, 1)}, {"optimizer": dfdl.optim.SGD(lr=0.1)}, None, "optimizer must be"),
    ],
)
def test_bad_spaces_name_the_key(space, fixed, model, match):
    with pytest.raises(ConfigError, match=match):
        resolve_space(space, fixed, model)
