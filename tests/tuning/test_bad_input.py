"""Bad input to ``dfdl.tune``: a :mod:`dfdl.errors` exception naming the argument and
what to do, raised before any cluster starts (the embedded cluster is not started) and,
where the storage is not the problem, before a study file is written."""

from __future__ import annotations

import numpy as np
import pytest

import dfdl
import dfdl.models
from dfdl.errors import ConfigError, DfdlError, ShapeError
from dfdl.runtime import cluster
from dfdl.space import choice, uniform
from tests.tuning.helpers import SIZES, data

optuna = pytest.importorskip("optuna")

LR = {"lr": uniform(0.01, 0.5)}
CASES = [
    ("trials", dict(trials=0), ConfigError, "trials must be a positive integer"),
    ("concurrency", dict(concurrency=0), ConfigError, "concurrency must be a positive integer"),
    ("wave", dict(wave=-1), ConfigError, "wave must be a positive integer"),
    ("metric", dict(metric="acc"), ConfigError, "metric must be one of 'val_loss'"),
    ("pruner", dict(pruner="fast"), ConfigError, "pruner must be one of 'asha'"),
    ("sampler", dict(sampler="grid"), ConfigError, "sampler must be one of 'tpe'"),
    ("seed", dict(seed=-1), ConfigError, "seed must be a non-negative integer"),
    ("no-validation", dict(validation=None), ConfigError, "needs validation=(X_val, y_val)"),
    ("space-key", dict(space={"nope": uniform(0, 1)}), ConfigError, "space key 'nope'"),
    ("space-empty", dict(space={}), ConfigError, "space must be a non-empty dict"),
    ("tuner-arg", dict(checkpoint_dir="x"), ConfigError, "sets checkpoint_dir itself"),
    ("lr-range", dict(space={"lr": uniform(-1.0, 0.5)}), ConfigError, "lr"),
    ("epochs", dict(epochs=0), ConfigError, "epochs must be a positive integer"),
    ("batch-choice", dict(space={"batch_size": choice([8, 0, 16])}), ConfigError, "batch_size"),
    (
        "data-shape",
        dict(data=(np.ones((8, 5), np.float32), np.zeros(8, np.int64))),
        ShapeError,
        "x",
    ),
    ("storage-url", dict(storage="study.db"), ConfigError, "storage must be a database URL"),
    ("storage-dir", dict(storage="sqlite:////no/such/dir/s.db"), ConfigError, "cannot be opened"),
    ("storage-driver", dict(storage="nosuchdb://u@h/d"), ConfigError, "cannot be opened"),
    ("resume-none", dict(resume=True), ConfigError, "holds no study 'dfdl-tune'"),
]


def _tune(**kw):
    args = dict(
        data=data(16, 0), validation=data(8, 1), space=LR, trials=2, epochs=1, progress=False
    )
    args.update(kw)
    return dfdl.tune(dfdl.models.mlp(SIZES, seed=1), **args)


@pytest.mark.parametrize("kw, error, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_fails_before_any_cluster(kw, error, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = cluster._embedded.get("client")
    with pytest.raises(error) as e:
        _tune(**kw)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, DfdlError)
    assert cluster._embedded.get("client") is before  # no embedded cluster started
    if not kw.get("resume"):
        assert list(tmp_path.iterdir()) == []  # no study file, no trials folder


def _study_with_a_trial(url: str, setup: dict | None = None):
    s = optuna.create_study(storage=url, study_name="dfdl-tune")
    if setup is not None:
        s.set_user_attr("dfdl", setup)
    s.ask()


def test_a_study_with_trials_needs_resume(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _study_with_a_trial("sqlite:///dfdl-tune.db")
    with pytest.raises(ConfigError, match="already has 1 trials: pass resume=True"):
        _tune()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dfdl-tune.db"]


def test_resume_with_other_settings_names_the_difference(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    setup = {"space": {}, "seed": 7, "metric": "val_loss", "sampler": "tpe",
             "pruner": "asha", "wave": 8, "trials": 2}  # fmt: skip
    _study_with_a_trial("sqlite:///dfdl-tune.db", setup)
    with pytest.raises(ConfigError, match="was started with seed=7, not 0"):
        _tune(resume=True)
