"""``dfdl.tune`` on a real cluster with real Optuna and SQLite: the same seed gives the
same trials and per-trial losses at concurrency 1 and 4; the result holds the best trial's
trained model and every trial's history; a trial with a NaN loss is recorded as failed and
the study goes on; the dashboard's monitor keeps every trial's validation curve; a tuner
killed midway (SIGKILL) resumes without rerunning its ended trials and finds the best
configuration an uninterrupted study finds."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import dfdl
import dfdl.models
from dfdl.runtime.monitor import monitor_of
from dfdl.space import choice
from tests.tuning.helpers import EPOCHS, SIZES, TRIALS, data, study

ROOT = Path(__file__).resolve().parents[2]
#: a hung subprocess fails the test instead of blocking CI (not a speed check)
KILL_TIMEOUT_S = 120

optuna = pytest.importorskip("optuna")


@pytest.fixture(scope="module")
def two_runs(client, tmp_path_factory):
    import copy

    import dask

    config = copy.deepcopy(dask.config.get("distributed"))
    d = tmp_path_factory.mktemp("tune")
    four = study(client, f"sqlite:///{d / 'four.db'}", d / "four", concurrency=4)
    one = study(client, f"sqlite:///{d / 'one.db'}", d / "one", concurrency=1)
    # trials that plan and submit in threads at once leave no setting behind (the
    # workers' thresholds once stayed, and clusters started later paused at spill)
    assert dask.config.get("distributed") == config
    return four, one, d


def test_same_seed_same_trials_and_losses_at_concurrency_1_and_4(two_runs):
    four, one, _ = two_runs
    assert len(four.trials) == len(one.trials) == TRIALS
    for a, b in zip(four.trials, one.trials):
        assert (a.number, a.state, a.params, a.seed) == (b.number, b.state, b.params, b.seed)
        assert a.history == b.history and a.value == b.value
    assert four.best_params == one.best_params and four.best_trial == one.best_trial
    # the sampler drew different values per trial, and the pruner stopped some trials
    assert len({t.params["lr"] for t in four.trials}) == TRIALS
    assert {t.state for t in four.trials} == {"complete", "pruned"}


def test_result_holds_best_model_and_every_history(two_runs):
    four, _, d = two_runs
    best = next(t for t in four.trials if t.number == four.best_trial)
    complete = [t for t in four.trials if t.state == "complete"]
    assert four.best_value == min(t.value for t in complete) == best.value
    for t in four.trials:
        epochs = len(t.history["val_loss"])
        if t.state == "complete":
            assert epochs == EPOCHS, t
        else:  # pruned after a rung, before the last epoch (which has nothing left to save)
            assert t.state == "pruned" and 1 <= epochs < EPOCHS, t
        per_epoch = -(-64 // t.params["batch_size"])
        assert len(t.history["loss"]) == epochs * per_epoch
        assert t.value == t.history["val_loss"][-1]
    # the saved model is the best trial's, retrained alone with its values and seed
    again = dfdl.train(
        dfdl.models.mlp(SIZES, seed=1), data(64, 0), validation=data(32, 1), epochs=EPOCHS,
        batch_size=best.params["batch_size"], seed=best.seed, progress=False,
        optimizer=dfdl.optim.SGD(lr=best.params["lr"], momentum=best.params["momentum"]),
    )  # fmt: skip
    assert again.history["loss"] == best.history["loss"]
    path = d / "best.onnx"
    four.save(path)
    X, _ = data(32, 1)
    got = ort.InferenceSession(str(path)).run(None, {"x": X})[0]
    want = ort.InferenceSession(again.model.SerializeToString()).run(None, {"x": X})[0]
    np.testing.assert_array_equal(got, want)
    # the study is an ordinary Optuna study in the SQLite file
    loaded = optuna.load_study(study_name="dfdl-tune", storage=f"sqlite:///{d / 'four.db'}")
    assert loaded.best_trial.number == four.best_trial


def test_monitor_keeps_every_trial_curve(client, two_runs):
    studies = client.run_on_scheduler(lambda dask_scheduler: monitor_of(dask_scheduler).snapshot())
    rows = studies["studies"]["dfdl-tune"]
    assert [r["trial"] for r in rows] == list(range(TRIALS))
    _, one, _ = two_runs  # the latest run of the study's name
    status = {"complete": "done", "pruned": "stopped"}
    assert [r["status"] for r in rows] == [status[t.state] for t in one.trials]
    assert [[v["loss"] for v in r["validation"]] for r in rows] == [
        t.history["val_loss"] for t in one.trials
    ]


def test_a_trial_with_a_nan_loss_fails_and_the_study_goes_on(client, tmp_path):
    """Also: the model is a builder whose hidden width is searched (``model.width``)."""

    def builder(width: int):
        return dfdl.models.mlp((SIZES[0], width, SIZES[-1]), seed=1)

    result = dfdl.tune(
        builder, data=data(64, 0), validation=data(32, 1),
        space={"lr": choice([0.1, 1e30]), "model.width": choice([4, 12])}, trials=4, wave=4,
        epochs=2, pruner="none", sampler="random", seed=3,
        storage=f"sqlite:///{tmp_path / 's.db'}", trials_dir=tmp_path / "t", client=client,
        progress=False, batch_size=16,
    )  # fmt: skip
    failed = [t for t in result.trials if t.state == "failed"]
    assert failed and all(t.params["lr"] == 1e30 for t in failed)
    assert all("TrainingError: the loss is" in t.reason for t in failed)
    assert {t.number for t in result.trials if t.state == "complete"} == {
        t.number for t in result.trials if t.params["lr"] == 0.1
    }
    assert result.counts()["complete"] >= 1 and result.best_params["lr"] == 0.1
    width = result.best_params["model.width"]
    shapes = {tuple(t.dims) for t in result.model.graph.initializer}
    assert (width, SIZES[0]) in shapes or (SIZES[0], width) in shapes, shapes
    assert {t.params["model.width"] for t in result.trials} == {4, 12}


def _states(db: Path) -> list[str]:
    try:
        with sqlite3.connect(db) as con:
            return [r[0] for r in con.execute("SELECT state FROM trials ORDER BY number")]
    except sqlite3.Error:  # not created yet
        return []


def test_killed_tuner_resumes_without_rerunning_ended_trials(client, two_runs, tmp_path):
    four, _, _ = two_runs
    db, folder = tmp_path / "study.db", tmp_path / "trials"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    address = client.scheduler.address
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.tuning.helpers", address, f"sqlite:///{db}", str(folder)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + KILL_TIMEOUT_S
    try:
        while sum(s != "RUNNING" for s in _states(db)) < 2:
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the tuner did not end 2 trials in time"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    killed = optuna.load_study(study_name="dfdl-tune", storage=f"sqlite:///{db}")
    ended = {t.number: t for t in killed.get_trials() if t.state.is_finished()}
    assert 2 <= len(ended) < TRIALS and "RUNNING" in _states(db)

    resumed = study(client, f"sqlite:///{db}", folder, concurrency=2, resume=True)
    after = {t.number: t for t in resumed.study.get_trials()}
    assert sorted(after) == list(range(TRIALS))
    for n, t in ended.items():  # not rerun: started once, ended as before
        assert after[n].user_attrs["starts"] == 1
        assert after[n].datetime_complete == t.datetime_complete and after[n].value == t.value
    assert any(t.user_attrs["starts"] == 2 for t in after.values())  # restarted trials
    assert resumed.best_params == four.best_params and resumed.best_trial == four.best_trial
    assert [(t.state, t.value) for t in resumed.trials] == [(t.state, t.value) for t in four.trials]
