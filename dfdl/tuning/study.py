"""The study behind :func:`dfdl.tune`: its storage, samplers, pruners and seeds.

The study is an ordinary Optuna study in an RDB storage (SQLite by default, any
SQLAlchemy URL such as ``postgresql://user@host/db``), so ``optuna-dashboard URL``
opens it. It records what it was started with (``study.user_attrs["dfdl"]``); a resumed
study must be started with the same, else a :class:`~dfdl.errors.ConfigError` names the
first difference.

Reproducibility: every trial's training seed comes from the study's seed and the
trial's number (:func:`trial_seed`), and every ``ask`` gets a sampler seeded the same
way (:func:`sampler_for`), so a trial's values depend on the study's seed, its number
and the trials that ended before it was asked, never on a random state carried across
asks (which a killed and resumed study would lose).

Example:
    >>> trial_seed(0, 3) == trial_seed(0, 3) != trial_seed(1, 3)
    True
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from dfdl.errors import ConfigError

#: the pruners :func:`dfdl.tune` names; rungs are epochs
PRUNERS = ("asha", "hyperband", "median", "none")
SAMPLERS = ("tpe", "random")
#: what the optimized value is, per ``metric``
DIRECTIONS = {"val_loss": "minimize", "val_accuracy": "maximize"}
#: epochs before the first rung, and the share of trials each rung keeps (1 in 3)
MIN_EPOCHS, REDUCTION_FACTOR = 1, 3


def trial_seed(seed: int, number: int) -> int:
    """The training seed of trial ``number`` of a study seeded ``seed``.

    Example:
        >>> 0 <= trial_seed(0, 0) < 2**31
        True
    """
    return int(np.random.SeedSequence([seed, number]).generate_state(1)[0] % 2**31)


def sampler_for(name: str, seed: int, number: int, startup: int):
    """A fresh Optuna sampler for the ask of trial ``number``, seeded from both.

    Args:
        name: ``"tpe"`` or ``"random"``.
        seed: the study's seed.
        number: the number the asked trial gets.
        startup: trials drawn at random before TPE models the results.
    """
    import optuna

    s = trial_seed(seed, number)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=s)
    return optuna.samplers.TPESampler(seed=s, n_startup_trials=startup)


def make_pruner(pruner, max_epochs: int):
    """The Optuna pruner named by ``pruner`` (an Optuna pruner is kept as it is).

    Raises:
        ConfigError: an unknown name.

    Example:
        >>> type(make_pruner("asha", 12)).__name__  # doctest: +SKIP
        'SuccessiveHalvingPruner'
    """
    import optuna

    if isinstance(pruner, optuna.pruners.BasePruner):
        return pruner
    if pruner == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=MIN_EPOCHS, reduction_factor=REDUCTION_FACTOR
        )
    if pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=MIN_EPOCHS, max_resource=max_epochs, reduction_factor=REDUCTION_FACTOR
        )
    if pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=REDUCTION_FACTOR, n_warmup_steps=0)
    if pruner in ("none", None):
        return optuna.pruners.NopPruner()
    raise ConfigError(
        f"pruner must be one of {', '.join(map(repr, PRUNERS))} or an optuna pruner, not {pruner!r}"
    )


def check_pruner(pruner) -> None:
    """ConfigError for a pruner that is neither a known name nor an Optuna pruner, without
    importing Optuna for a name."""
    if pruner in PRUNERS or pruner is None:
        return
    make_pruner(pruner, 1)


def open_storage(url: str):
    """The Optuna RDB storage at ``url``.

    Raises:
        ConfigError: the URL is not one SQLAlchemy reads, its driver is not installed, or
            the database cannot be reached or created.

    Example:
        >>> open_storage("nope://")  # doctest: +SKIP
        Traceback (most recent call last):
        dfdl.errors.ConfigError: storage 'nope://': ...
    """
    import optuna

    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(
            f"storage must be a database URL such as 'sqlite:///study.db' or "
            f"'postgresql://user@host/db', not {url!r}"
        )
    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        return optuna.storages.RDBStorage(url)
    except Exception as e:  # noqa: BLE001 - SQLAlchemy's errors come in many types
        detail = " ".join(str(e).split())[:300] or type(e).__name__
        raise ConfigError(
            f"storage {url!r} cannot be opened ({detail}): give a database URL such as "
            "'sqlite:///study.db' (a file here) or 'postgresql://user@host/db' with its "
            "driver installed"
        ) from None


def open_study(storage, name: str, direction: str, setup: dict[str, Any], resume: bool):
    """The study ``name`` in ``storage``: created, or loaded to resume.

    Raises:
        ConfigError: ``resume`` without such a study; a study of that name that already
            has trials without ``resume``; a resumed study started with other settings.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    names = {s.study_name: s for s in optuna.study.get_all_study_summaries(storage)}
    if name in names and not resume and names[name].n_trials:
        raise ConfigError(
            f"study {name!r} in the storage already has {names[name].n_trials} trials: pass "
            "resume=True (--resume) to finish it, or give another study_name (--study-name)"
        )
    if name not in names and resume:
        raise ConfigError(
            f"resume=True but the storage holds no study {name!r}: start without resume "
            "(or check storage= and study_name=)"
        )
    study = optuna.create_study(
        storage=storage, study_name=name, direction=direction, load_if_exists=True
    )
    stored = study.user_attrs.get("dfdl")
    if stored is None:
        study.set_user_attr("dfdl", setup)
        return study
    for key in sorted(set(stored) | set(setup)):
        if stored.get(key) != setup.get(key):
            raise ConfigError(
                f"study {name!r} was started with {key}={stored.get(key)!r}, not "
                f"{setup.get(key)!r}: resume it with the same settings, or give another "
                "study_name"
            )
    return study
