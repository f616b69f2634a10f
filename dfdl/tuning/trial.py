"""One trial of :func:`dfdl.tune`: a :func:`dfdl.train` run that reports each epoch's
validation metric to the study and stops when the pruner says so.

A trial trains in its own folder (``<trials_dir>/trial-<number>``), checkpointing at
every epoch's end, after reporting that epoch: a trial restarted after the tuner was
killed resumes from its last checkpoint, and a reported epoch's decision (stored as
the trial's ``dfdl_rung_<epoch>`` attribute) is not taken again. What the trial learns is
kept in the study as it goes: each epoch's training losses and validation metrics
(user attributes ``losses_<epoch>``, ``val_<epoch>``), and how often it started
(``starts``: more than 1 after a resume); a completed trial's trained model
is written to ``model.onnx`` in its folder, and its checkpoints are then removed.

A trial whose training raises (a NaN loss, a plan that does not fit memory, a
non-finite validation metric) is recorded as failed with the reason
(``fail_reason``) and the study goes on.

Example:
    >>> run_trial(context, frozen_trial, gate)  # doctest: +SKIP
    'complete'
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dfdl.data.order import steps_per_epoch
from dfdl.errors import TrainingError
from dfdl.runtime.session import EpochEnd, TrainingSession, train_config
from dfdl.tuning.order import RungGate
from dfdl.tuning.params import SearchSpace
from dfdl.tuning.study import trial_seed

logger = logging.getLogger("dfdl")

RUNG = "dfdl_rung_"
MODEL_FILE = "model.onnx"


@dataclass
class TrialContext:
    """What every trial of a study shares."""

    study: Any
    study_name: str
    space: SearchSpace
    model: Any
    data: Any
    samples: int
    validation: Any
    metric: str
    seed: int
    trials_dir: Path
    client: Any  # the user's client, None for the embedded cluster
    on_end: Any  # (number, state, value) -> None


def decided_rungs(frozen) -> dict[int, str]:
    """The epochs a trial already decided at, and what: ``"continue"`` or ``"prune"``."""
    return {int(k[len(RUNG) :]): v for k, v in frozen.user_attrs.items() if k.startswith(RUNG)}


def model_of(space: SearchSpace, model, kwargs: dict[str, Any]):
    """The trial's model: ``model`` itself, or what the builder returns for ``kwargs``."""
    return space.builder(**kwargs) if space.builder is not None else model


def session_for(ctx: TrialContext, number: int, values: dict[str, Any], on_epoch=None):
    """The :class:`TrainingSession` of trial ``number`` with decoded ``values``."""
    args = ctx.space.arguments(values)
    train = dict(args.train)
    folder = ctx.trials_dir / f"trial-{number}"
    batch = train.get("batch_size", 64)
    every = None  # a bad batch size is TrainConfig's error, named there
    if isinstance(batch, int) and batch >= 1:
        every = steps_per_epoch(ctx.samples, batch, bool(train.get("drop_last", False)))
    config = train_config(
        optimizer=args.optimizer,
        seed=trial_seed(ctx.seed, number),
        checkpoint_dir=str(folder / "checkpoints"),
        checkpoint_every=every,
        resume="auto",
        progress=False,
        on_epoch=on_epoch,
        **train,
    )
    tags = {"study": ctx.study_name, "trial": number}
    return TrainingSession(
        model_of(ctx.space, ctx.model, args.model_kwargs), ctx.data, config, ctx.validation, tags
    )


def run_trial(ctx: TrialContext, frozen, gate: RungGate) -> str:
    """Train trial ``frozen`` (an Optuna ``FrozenTrial`` that is running) to its end, its
    pruning or its failure, and tell the study; the state it ended in."""
    import optuna
    from optuna.trial import TrialState

    study, number = ctx.study, frozen.number
    trial = optuna.trial.Trial(study, frozen._trial_id)
    decided = decided_rungs(frozen)
    reported = dict(frozen.intermediate_values)
    key = ctx.metric.removeprefix("val_")
    folder = ctx.trials_dir / f"trial-{number}"
    values = ctx.space.decode(frozen.params)
    epochs = 1  # the trial's, set below where a bad value fails the trial

    def on_epoch(end: EpochEnd) -> bool:
        value = end.metrics.get(key, math.nan)
        if not math.isfinite(value):
            raise TrainingError(f"the validation {key} is {value} after epoch {end.epoch}")
        trial.set_user_attr(f"losses_{end.epoch}", list(end.losses))
        trial.set_user_attr(f"val_{end.epoch}", dict(end.metrics))
        with gate.turn(number, end.epoch):
            if end.epoch not in decided:
                if end.epoch not in reported:
                    trial.report(value, end.epoch)
                    reported[end.epoch] = value
                # the last epoch has nothing left to save: the trial completes
                last = end.epoch >= epochs
                decided[end.epoch] = "prune" if not last and trial.should_prune() else "continue"
                trial.set_user_attr(f"{RUNG}{end.epoch}", decided[end.epoch])
        return decided[end.epoch] == "prune"

    trial.set_user_attr("starts", int(frozen.user_attrs.get("starts", 0)) + 1)
    state, value = "failed", None
    try:
        if "prune" in decided.values():  # killed after the decision, before the tell
            state = "pruned"
        else:
            epochs = ctx.space.arguments(values).train.get("epochs", 1)
            t0 = time.perf_counter()
            result = session_for(ctx, number, values, on_epoch).run(ctx.client)
            trial.set_user_attr("train_s", time.perf_counter() - t0)
            state = "pruned" if result.stopped_epoch is not None else "complete"
            if state == "complete":
                value = reported[max(reported)] if reported else None
                if value is None:
                    raise TrainingError("the trial trained no epoch to report")
                result.save(folder / MODEL_FILE)
    except Exception as e:  # noqa: BLE001 - a failed trial is recorded, the study goes on
        reason = " ".join(str(e).split())[:500] or type(e).__name__
        logger.warning("dfdl.tune: trial %d failed: %s", number, reason)
        trial.set_user_attr("fail_reason", f"{type(e).__name__}: {reason}")
        state = "failed"
    finally:
        gate.end(number)
    if state == "complete":
        study.tell(trial, value)
    elif state == "pruned":
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, state=TrialState.FAIL)
    shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    ctx.on_end(number, state, value)
    return state
