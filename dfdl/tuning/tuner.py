"""``dfdl.tune``: many trainings at once on one cluster, the bad ones stopped early.

The loop, each step done before the next starts:

1. the arguments, the space (:mod:`dfdl.tuning.params`), the model and the data (a
   training session of the space's lowest and highest values is checked, as
   :func:`dfdl.train` checks its own), the storage and the study
   (:mod:`dfdl.tuning.study`) and the trials' folder are checked: every error is raised
   before any cluster starts;
2. trials are asked in waves of ``wave`` (default 8) and each wave runs on one cluster,
   ``concurrency`` trials at a time, each a :class:`~dfdl.runtime.session.
   TrainingSession` in a thread of its own: the scheduler interleaves their tasks;
3. every epoch a trial reports its validation metric and the pruner decides, in the
   order of the trials' numbers (:class:`~dfdl.tuning.order.RungGate`); the next wave
   is asked when a wave has ended.

Why waves: a sampler's suggestion depends on the trials that have ended when it is
asked. Asking a wave's trials together, after the previous wave has ended, makes that
set the same at every concurrency, so the same seed and space give the same trials and
the same per-trial losses whether 1 or 8 trials run at once. A wave larger than
``concurrency`` costs nothing; the cost of the barrier is that the last trials of a
wave run with fewer beside them.

Example:
    >>> result = dfdl.tune(model, data=(X, y), validation=(Xv, yv),  # doctest: +SKIP
    ...                    space={"lr": dfdl.space.loguniform(1e-3, 0.3)}, trials=16)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dfdl.data.checks import split_data
from dfdl.errors import ConfigError
from dfdl.plan.compile import Workers
from dfdl.plan.estimate import managed_target, working_set
from dfdl.runtime.cluster import (
    connect,
    default_workers,
    embedded_memory_limit,
    total_threads,
    worker_memory_limit,
)
from dfdl.tuning import study as studies
from dfdl.tuning.params import SearchSpace, describe, resolve_space
from dfdl.tuning.progress import TuneProgress
from dfdl.tuning.result import TuneResult, study_result
from dfdl.tuning.trial import TrialContext, session_for
from dfdl.tuning.waves import run_waves

#: trials asked together (see the module docstring)
DEFAULT_WAVE = 8
#: trials at once per worker thread, at most: a trial's small steps leave threads idle
TRIALS_PER_THREAD = 2


def _positive(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, not {value!r}")


def check_arguments(trials, concurrency, wave, metric, sampler, pruner, seed, validation) -> None:
    """The tuner's own arguments (ConfigError naming the first bad one)."""
    _positive("trials", trials)
    _positive("concurrency", concurrency, allow_none=True)
    _positive("wave", wave)
    if metric not in studies.DIRECTIONS:
        raise ConfigError(
            f"metric must be one of {', '.join(map(repr, studies.DIRECTIONS))}, not {metric!r}"
        )
    if sampler not in studies.SAMPLERS:
        raise ConfigError(
            f"sampler must be one of {', '.join(map(repr, studies.SAMPLERS))}, not {sampler!r}"
        )
    studies.check_pruner(pruner)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, not {seed!r}")
    if validation is None:
        raise ConfigError(
            "dfdl.tune needs validation=(X_val, y_val): trials are compared and pruned on "
            "the validation metric"
        )


def _workers(client) -> Workers:
    if client is None:
        return Workers(cores=default_workers(), memory_limit=embedded_memory_limit())
    return Workers(cores=total_threads(client), memory_limit=worker_memory_limit(client))


def check_trials(space: SearchSpace, ctx: TrialContext, workers: Workers) -> int:
    """Check the space's lowest and highest values as trials (model, data, validation,
    optimizer, plan) before any cluster starts; the largest working set in bytes."""
    biggest = 0
    for values in space.corners():
        session = session_for(ctx, 0, values)
        first = session.check(workers)
        biggest = max(biggest, working_set(first.plan))
    return biggest


def choose_concurrency(working_bytes: int, workers: Workers, threads: int, wave: int) -> int:
    """Trials at once: as many as the workers' memory holds by the plan's working set,
    at most :data:`TRIALS_PER_THREAD` per worker thread and at most a wave.

    Example:
        >>> choose_concurrency(2**20, Workers(cores=2, memory_limit=2**30), 2, 8)
        4
    """
    by_threads = TRIALS_PER_THREAD * max(1, threads)
    limit = workers.memory_limit
    by_memory = by_threads if not limit else int(managed_target() * limit // max(working_bytes, 1))
    return max(1, min(by_threads, by_memory, wave))


def tune(
    model,
    data,
    validation,
    space: Mapping[str, Any],
    trials: int = 20,
    *,
    metric: str = "val_loss",
    pruner: Any = "asha",
    sampler: str = "tpe",
    seed: int = 0,
    concurrency: int | None = None,
    wave: int = DEFAULT_WAVE,
    storage: str | None = None,
    study_name: str = "dfdl-tune",
    trials_dir: str | os.PathLike | None = None,
    resume: bool = False,
    client=None,
    progress: bool = True,
    **train_options: Any,
) -> TuneResult:
    """Search hyperparameters: train ``trials`` configurations drawn from ``space``, many
    at once on one cluster, stopping the bad ones early; return the best.

    Args:
        model: ONNX path, bytes or ModelProto; or a callable returning one, whose
            arguments the space may search (``model.<name>`` or the bare name).
        data: ``(X, y)`` as for :func:`dfdl.train`.
        validation: ``(X_val, y_val)``: the metric trials are compared on, each epoch.
        space: key -> a :mod:`dfdl.space` distribution, an Optuna distribution or a fixed
            value. Keys: :func:`dfdl.train` arguments (``batch_size``, ``epochs``,
            ``optimizer`` as ``"sgd"``/``"adam"``/``"adamw"``, ``loss_options`` ...),
            optimizer hyperparameters (``lr``, ``momentum``, ``weight_decay``,
            ``schedule`` ...), ``loss_options.<name>``, model-builder arguments.
        trials: trials in the study (a resumed study counts those it has).
        metric: ``"val_loss"`` (minimized) or ``"val_accuracy"`` (maximized).
        pruner: ``"asha"`` (Optuna's asynchronous successive halving), ``"hyperband"``,
            ``"median"``, ``"none"``, or an Optuna pruner; rungs are epochs.
        sampler: ``"tpe"`` (Optuna's TPE, random for the first wave) or ``"random"``.
        seed: the study's seed: the same seed and space give the same trials and the
            same per-trial losses, bit for bit, at any ``concurrency``.
        concurrency: trials at once (default: what the workers' memory holds by the
            plan's estimate, at most two per worker thread and at most ``wave``).
        wave: trials asked together (see :mod:`dfdl.tuning.tuner`); changing it changes
            the trials.
        storage: an Optuna RDB URL (default ``sqlite:///<study_name>.db`` here); the
            study opens in ``optuna-dashboard``.
        study_name: the study's name in the storage.
        trials_dir: the trials' checkpoints and models (default ``<study_name>-trials``).
        resume: finish a study a killed tuner left: ended trials are kept, running ones
            restart from their last checkpoint.
        client: a ``distributed.Client``; None: the embedded cluster.
        progress: a bar of trials running, finished, pruned, failed and the best value.
        **train_options: fixed :func:`dfdl.train` arguments and hyperparameters for every
            trial (``epochs=12``, ``momentum=0.9``).

    Returns:
        :class:`~dfdl.tuning.result.TuneResult`: the best trial's values, value and
        trained model (``save()``), and every trial's history.

    Raises:
        ConfigError / DataError / ModelError / ...: a bad argument, space, model, data or
            storage, before any cluster starts. A trial that fails is recorded as failed
            and the study goes on; TrainingError if no trial completes.

    Example:
        >>> result = dfdl.tune(  # doctest: +SKIP
        ...     model, data=(X, y), validation=(X_val, y_val), epochs=9, trials=24,
        ...     space={"lr": dfdl.space.loguniform(1e-3, 0.3),
        ...            "momentum": dfdl.space.uniform(0.5, 0.95)})
        >>> result.save("best.onnx")  # doctest: +SKIP
    """
    tuner = Tuner(
        model,
        data,
        validation,
        space,
        trials,
        metric=metric,
        pruner=pruner,
        sampler=sampler,
        seed=seed,
        concurrency=concurrency,
        wave=wave,
        storage=storage,
        study_name=study_name,
        trials_dir=trials_dir,
        resume=resume,
        client=client,
        progress=progress,
        **train_options,
    )
    return tuner.run(client)


class Tuner:
    """A study checked and opened, ready to run: what :func:`tune` does in two steps, so
    that a caller (``dfdl tune --scheduler``) connects to its cluster only once every
    check passed. The arguments are :func:`tune`'s; ``client`` (optional here) gives
    the workers the trials are planned for, else this machine's.

    Raises:
        ConfigError / DataError / ModelError / ...: as :func:`tune`, when made.

    Example:
        >>> tuner = Tuner(model, (X, y), (Xv, yv), space, 16)  # doctest: +SKIP
        >>> result = tuner.run(client)                           # doctest: +SKIP
    """

    def __init__(
        self,
        model,
        data,
        validation,
        space: Mapping[str, Any],
        trials: int = 20,
        *,
        metric: str = "val_loss",
        pruner: Any = "asha",
        sampler: str = "tpe",
        seed: int = 0,
        concurrency: int | None = None,
        wave: int = DEFAULT_WAVE,
        storage: str | None = None,
        study_name: str = "dfdl-tune",
        trials_dir: str | os.PathLike | None = None,
        resume: bool = False,
        client=None,
        progress: bool = True,
        **train_options: Any,
    ):

        check_arguments(trials, concurrency, wave, metric, sampler, pruner, seed, validation)
        if not isinstance(study_name, str) or not study_name:
            raise ConfigError(f"study_name must be a non-empty string, not {study_name!r}")
        if not isinstance(resume, bool):
            raise ConfigError(f"resume must be True or False, not {resume!r}")
        for name in train_options:
            if name in ("seed", "checkpoint_dir", "checkpoint_every", "on_epoch"):
                raise ConfigError(f"dfdl.tune sets {name} itself for every trial: leave it out")
        resolved = resolve_space(space, train_options, model)
        X, _ = split_data(data, "data")
        folder = Path(trials_dir if trials_dir is not None else f"{study_name}-trials")
        url = storage if storage is not None else f"sqlite:///{study_name}.db"
        setup = {
            "space": describe(resolved),
            "seed": seed,
            "metric": metric,
            "sampler": sampler,
            "pruner": pruner if isinstance(pruner, str) else type(pruner).__name__,
            "wave": wave,
            "trials": trials,
        }
        workers = _workers(client)
        ctx = TrialContext(
            study=None,
            study_name=study_name,
            space=resolved,
            model=model,
            data=data,
            samples=len(X),
            validation=validation,
            metric=metric,
            seed=seed,
            trials_dir=folder,
            client=client,
            on_end=None,
        )
        biggest = check_trials(resolved, ctx, workers)
        epochs = (
            max(int(v) for v in resolved.options("epochs")) if "epochs" in resolved.where else 1
        )
        pruner_obj = studies.make_pruner(pruner, epochs)
        rdb = studies.open_storage(url)
        study = studies.open_study(rdb, study_name, studies.DIRECTIONS[metric], setup, resume)
        study.pruner = pruner_obj
        if not resume and folder.exists() and any(folder.glob("trial-*")):
            raise ConfigError(
                f"trials_dir {folder} holds another study's trials: give another trials_dir, "
                "remove it, or pass resume=True to finish that study"
            )
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"trials_dir {folder} cannot be created: {e}") from None
        ctx.study = study
        self.ctx, self.space, self.study, self.folder = ctx, resolved, study, folder
        self.trials, self.wave, self.concurrency = trials, wave, concurrency
        self.metric, self.sampler, self.seed, self.progress = metric, sampler, seed, progress
        self.workers, self.biggest = workers, biggest

    def run(self, client=None) -> TuneResult:
        """Run the study to ``trials`` trials on ``client``'s cluster (None: the
        embedded one) and return its result."""
        ctx, study, trials, wave = self.ctx, self.study, self.trials, self.wave
        done = sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))
        bar = TuneProgress(
            show=self.progress,
            total=trials,
            done=done,
            metric=self.metric,
            maximize=self.metric == "val_accuracy",
        )
        ctx.on_end = bar.ended
        try:
            with connect(client) as c:
                # None stays None: the trials then run on the embedded cluster as dfdl's own
                ctx.client = client
                threads = total_threads(c)
                n = self.concurrency or choose_concurrency(
                    self.biggest, self.workers, threads, wave
                )
                run_waves(ctx, self.sampler, trials, wave, min(n, wave), bar)
        finally:
            bar.close()
        return study_result(study, self.space, self.seed, self.metric, self.folder)
