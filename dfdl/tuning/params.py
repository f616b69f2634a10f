"""What a trial trains with: the search space resolved against :func:`dfdl.train`'s
arguments, the optimizer and the model builder, and a trial's values turned into them.

A key of the space (or of the fixed training options) names, in this order:

- a :func:`dfdl.train` argument (``batch_size``, ``epochs``, ``loss``, ``loss_options``,
  ``optimizer`` as a name ``"sgd"``/``"adam"``/``"adamw"`` or a :mod:`dfdl.optim` class, ...);
- a hyperparameter of the optimizer's constructor (``lr``, ``momentum``, ``weight_decay``,
  ``schedule``, ``clip_norm``, ...), or ``optimizer.<name>``;
- ``loss_options.<name>``: one loss option (``loss_options.ignore_index``);
- an argument of the model builder when ``model`` is a callable returning ONNX, or
  ``model.<name>``.

Anything else is a :class:`~dfdl.errors.ConfigError` naming the key, raised before any
cluster starts, as is a hyperparameter one of the searched optimizers does not take.

Example:
    >>> from dfdl.space import loguniform
    >>> s = resolve_space({"lr": loguniform(1e-3, 1e-1), "momentum": 0.9}, {}, None)
    >>> args = s.arguments({"lr": 0.01})
    >>> args.optimizer.lr, args.optimizer.momentum
    (0.01, 0.9)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dfdl.errors import ConfigError
from dfdl.space import Choice, is_distribution, to_optuna
from dfdl.training.optimizers import SGD, Adam, AdamW

#: the dfdl.train arguments a trial may take from the space or the fixed options
TRAIN_ARGS = (
    "loss",
    "optimizer",
    "batch_size",
    "epochs",
    "steps",
    "shuffle",
    "tiles",
    "frozen",
    "drop_last",
    "unroll",
    "loss_options",
    "memory",
    "engine",
)
#: dfdl.train arguments the tuner sets itself, per trial
TUNER_ARGS = (
    "seed",
    "checkpoint_dir",
    "checkpoint_every",
    "resume",
    "progress",
    "on_epoch",
    "client",
    "validation",
    "data",
    "model",
)
OPTIMIZERS = {"sgd": SGD, "adam": Adam, "adamw": AdamW}


def optimizer_class(value) -> type:
    """The :mod:`dfdl.optim` class named by ``value`` (a name or the class itself).

    Example:
        >>> optimizer_class("adamw").__name__
        'AdamW'
    """
    if isinstance(value, str) and value.lower() in OPTIMIZERS:
        return OPTIMIZERS[value.lower()]
    if isinstance(value, type) and value in OPTIMIZERS.values():
        return value
    raise ConfigError(
        f"optimizer must be one of {', '.join(map(repr, OPTIMIZERS))} or a dfdl.optim class "
        f"(SGD, Adam, AdamW), not {value!r}: give its hyperparameters in space, "
        "e.g. space={'lr': dfdl.space.loguniform(1e-3, 1e-1), 'momentum': 0.9}"
    )


def _parameters(fn) -> list[str]:
    return [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


@dataclass(frozen=True)
class TrialArguments:
    """One trial's :func:`dfdl.train` arguments and model-builder arguments."""

    train: dict[str, Any]
    optimizer: Any
    model_kwargs: dict[str, Any]


@dataclass(frozen=True)
class SearchSpace:
    """A resolved search space (see the module docstring).

    Attributes:
        searched: key -> the Optuna distribution its values are drawn from.
        fixed: key -> the value every trial takes.
        where: key -> ``"train"``, ``"optimizer"``, ``"loss_options"`` or ``"model"``.
        names: key -> the argument's name where it goes (the key without its prefix).
        choices: key -> the :class:`~dfdl.space.Choice` whose labels Optuna stores.
    """

    searched: dict[str, Any]
    fixed: dict[str, Any]
    where: dict[str, str]
    names: dict[str, str]
    choices: dict[str, Choice] = field(default_factory=dict)
    builder: Callable | None = None

    def decode(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Optuna's stored values of a trial as the values trained with (a choice's
        label back to its value).

        Example:
            >>> space.decode({"optimizer": "AdamW"})  # doctest: +SKIP
            {'optimizer': <class 'dfdl.training.optimizers.AdamW'>}
        """
        out = {}
        for key, value in params.items():
            c = self.choices.get(key)
            out[key] = c.values[c.labels().index(value)] if c is not None else value
        return out

    def arguments(self, values: Mapping[str, Any]) -> TrialArguments:
        """The trial's arguments from its decoded values (missing keys: the fixed ones).

        Raises:
            ConfigError: the optimizer refuses a value (a hyperparameter out of range).
        """
        given = {**self.fixed, **values}
        train: dict[str, Any] = {}
        opt: dict[str, Any] = {}
        loss_options: dict[str, Any] = {}
        model_kwargs: dict[str, Any] = {}
        for key, value in given.items():
            where, name = self.where[key], self.names[key]
            target = {"train": train, "optimizer": opt, "loss_options": loss_options}.get(where)
            (model_kwargs if target is None else target)[name] = value
        if loss_options:
            train["loss_options"] = {**dict(train.get("loss_options") or {}), **loss_options}
        cls = optimizer_class(train.pop("optimizer", "sgd"))
        try:
            optimizer = cls(**opt)
        except TypeError as e:
            raise ConfigError(f"{cls.__name__}: {e}") from None
        return TrialArguments(train, optimizer, model_kwargs)

    def corners(self) -> list[dict[str, Any]]:
        """Values at the low and at the high end of every searched key (a choice's
        first and last value), and each other value of a choice: the trials checked
        before any cluster starts.

        Example:
            >>> len(space.corners())  # doctest: +SKIP
            2
        """
        low, high = {}, {}
        middles = []
        for key, dist in self.searched.items():
            if key in self.choices or hasattr(dist, "choices"):
                values = self.options(key)
                low[key], high[key] = values[0], values[-1]
                middles += [(key, v) for v in values[1:-1]]
            else:
                low[key], high[key] = dist.low, dist.high
        return [low, high, *({**low, key: v} for key, v in middles)]

    def options(self, key: str) -> list:
        """Every value a searched key can take where there are few (a choice), else its
        bounds; a fixed key's one value."""
        if key in self.fixed:
            return [self.fixed[key]]
        if key in self.choices:
            return list(self.choices[key].values)
        dist = self.searched[key]
        return list(dist.choices) if hasattr(dist, "choices") else [dist.low, dist.high]


def _place(key: str, optimizer_params: set[str], builder_params: set[str]) -> tuple[str, str]:
    """(where, name) of a key (see the module docstring)."""
    prefix, dot, rest = key.partition(".")
    if dot:
        if prefix == "optimizer" and rest in optimizer_params:
            return "optimizer", rest
        if prefix == "loss_options" and rest:
            return "loss_options", rest
        if prefix == "model" and rest in builder_params:
            return "model", rest
    elif key in TRAIN_ARGS:
        return "train", key
    elif key in TUNER_ARGS:
        raise ConfigError(
            f"space key {key!r}: dfdl.tune sets {key} itself for every trial "
            "(seed: from the study's seed and the trial's number); leave it out"
        )
    else:
        in_opt, in_model = key in optimizer_params, key in builder_params
        if in_opt and in_model:
            raise ConfigError(
                f"space key {key!r} is both an optimizer hyperparameter and a model-builder "
                f"argument: write 'optimizer.{key}' or 'model.{key}'"
            )
        if in_opt:
            return "optimizer", key
        if in_model:
            return "model", key
    known = [*TRAIN_ARGS, *sorted(optimizer_params)]
    if builder_params:
        known.append("the model builder's " + ", ".join(sorted(builder_params)))
    raise ConfigError(
        f"space key {key!r} is not a dfdl.train argument, an optimizer hyperparameter, "
        f"'loss_options.<name>' or a model-builder argument: use one of {', '.join(known)}"
    )


def resolve_space(space: Mapping[str, Any], fixed: Mapping[str, Any], model) -> SearchSpace:
    """Check ``space`` and the fixed training options and resolve every key.

    Args:
        space: key -> distribution (:mod:`dfdl.space` or Optuna's) or fixed value.
        fixed: :func:`dfdl.tune`'s other keyword arguments: fixed :func:`dfdl.train`
            arguments and hyperparameters.
        model: the model (a callable returning ONNX takes the ``model`` keys).

    Raises:
        ConfigError: a key that is nowhere, is set twice, or is the tuner's own; a
            hyperparameter that a searched optimizer does not take; an empty space.

    Example:
        >>> resolve_space({"nope": 1}, {}, None)
        Traceback (most recent call last):
        dfdl.errors.ConfigError: space key 'nope' is not a dfdl.train argument, ...
    """
    if not isinstance(space, Mapping) or not space:
        raise ConfigError(
            f"space must be a non-empty dict {{argument: distribution}}, not {space!r}: e.g. "
            "{'lr': dfdl.space.loguniform(1e-4, 1e-1)}"
        )
    both = sorted(set(space) & set(fixed))
    if both:
        raise ConfigError(
            f"{both[0]!r} is given both in space and as a fixed argument: give it once"
        )
    builder = model if callable(model) else None
    builder_params = set(_parameters(builder)) if builder is not None else set()
    entries = {**dict(fixed), **dict(space)}
    opt_choice = entries.get("optimizer", "sgd")
    classes = (
        [optimizer_class(v) for v in opt_choice.values]
        if isinstance(opt_choice, Choice)
        else [SGD, Adam, AdamW]
        if is_distribution(opt_choice)
        else [optimizer_class(opt_choice)]
    )
    every = [set(_parameters(c.__init__)) - {"self"} for c in classes]
    optimizer_params = set.union(*every)
    searched, kept, where, names, choices = {}, {}, {}, {}, {}
    for key, value in entries.items():
        if not isinstance(key, str):
            raise ConfigError(f"space keys are argument names (strings), not {key!r}")
        where[key], names[key] = _place(key, optimizer_params, builder_params)
        if where[key] == "optimizer":
            lacking = [c.__name__ for c, p in zip(classes, every) if names[key] not in p]
            if lacking:
                raise ConfigError(
                    f"space key {key!r}: {', '.join(lacking)} takes no {names[key]!r}; "
                    "search it only with optimizers that take it"
                )
        if isinstance(value, Choice):
            choices[key] = value
        if is_distribution(value):
            if key in fixed:
                raise ConfigError(f"{key}={value!r} is a distribution: put it in space=")
            searched[key] = to_optuna(value)
        else:
            kept[key] = value
    if not searched:
        raise ConfigError(
            "space has no distribution to search: give at least one, e.g. "
            "{'lr': dfdl.space.loguniform(1e-4, 1e-1)}"
        )
    return SearchSpace(searched, kept, where, names, choices, builder)


def describe(space: SearchSpace) -> dict[str, str]:
    """The space as text, key -> distribution or value (what a resumed study compares).

    Example:
        >>> describe(resolve_space({"lr": loguniform(0.01, 0.1)}, {}, None))  # doctest: +SKIP
        {'lr': 'FloatDistribution(high=0.1, log=True, low=0.01, step=None)'}
    """
    out = {k: repr(v) for k, v in space.searched.items()}
    for k, v in space.fixed.items():
        out[k] = f"fixed {getattr(v, '__name__', None) or v!r}"
    return dict(sorted(out.items()))
