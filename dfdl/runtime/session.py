"""A training run: :class:`TrainingSession` is what ``dfdl.train`` runs.

A session is built in separate, testable parts, each done before the next starts:

1. :class:`TrainConfig` checks the arguments (``ConfigError`` before anything is loaded);
2. the session loads the model and the data and checks them against each other, checks
   the checkpoint folder and the checkpoint to resume from (:meth:`TrainingSession.
   resume_point`), and compiles the first step (:mod:`dfdl.plan.compile`): a bad model,
   bad data, a bad checkpoint or a plan that cannot fit raise here, before any cluster
   starts;
3. :meth:`TrainingSession.run` connects to the cluster (the embedded one by default),
   sends the initial weights, and submits the steps ``unroll`` at a time
   (:func:`dfdl.runtime.trainer.run_steps`), collecting losses a submission late;
   checkpoints, validation and anchors happen between submissions;
4. a worker lost with data Dask cannot rebuild rolls training back to the latest anchor
   or checkpoint (:mod:`dfdl.runtime.recovery`): the result is the same bits.

Example:
    >>> session = TrainingSession(model, (X, y), TrainConfig(batch_size=32))  # doctest: +SKIP
    >>> result = session.run()                                                 # doctest: +SKIP
"""

from __future__ import annotations

import functools
import gc
import logging
import math
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import psutil
from distributed.scheduler import KilledWorker

from dfdl.data.checks import check_labels, split_data
from dfdl.data.order import batch_plan, steps_per_epoch
from dfdl.errors import (
    CheckpointError,
    ClientMemoryWarning,
    ConfigError,
    DataError,
    FoldedParametersWarning,
    TiedParametersWarning,
)
from dfdl.ir.canonical import tied_initializers
from dfdl.ir.onnx_io import ModelLike, exporter_folded, file_tensor_bytes, load_model, to_ir
from dfdl.ir.torch_folds import unfold
from dfdl.ops.registry import TensorType
from dfdl.plan.compile import StepPlan, Workers, choose_variant, training_plan
from dfdl.plan.estimate import format_bytes
from dfdl.runtime import checkpoint, pinning, worker_setup
from dfdl.runtime.cluster import (
    connect,
    default_workers,
    embedded_memory_limit,
    gpu_workers,
    placement,
    total_threads,
    worker_memory_config,
    worker_memory_limit,
    workers_device,
)
from dfdl.runtime.device_memory import device_memory_limit
from dfdl.runtime.gc_freeze import frozen_heaps
from dfdl.runtime.monitor import Reporter
from dfdl.runtime.probe import cluster_speeds
from dfdl.runtime.progress import Progress
from dfdl.runtime.recovery import (
    MAX_ROLLBACKS,
    MEMORY_EVENT_WAIT_S,
    MEMORY_RESTART_ADVICE,
    Anchor,
    AnchorPolicy,
    MemoryRestarts,
    describe_memory_restart,
    is_lost_data,
    killed_worker_error,
    memory_restart_error,
    rollback_error,
    wait_for_workers,
)
from dfdl.runtime.result import TrainResult, stored_model, trained_model
from dfdl.runtime.stored import Stored, Zeros, of_memmap, safe_name, source_of
from dfdl.runtime.trainer import (
    ClusterState,
    Constants,
    LossCollector,
    SpillMeter,
    StepInput,
    run_steps,
)
from dfdl.runtime.validation import check_validation, evaluate
from dfdl.taskgraph.lower import new_token
from dfdl.taskgraph.optimize import GraphOptions
from dfdl.training.graph import build_training_graph
from dfdl.training.losses import label_classes
from dfdl.training.optimizers import SGD, Optimizer
from dfdl.training.passes.recompute import MODES

logger = logging.getLogger("dfdl")

#: steps per graph submission when ``unroll`` is not given
DEFAULT_UNROLL = 4


@dataclass(frozen=True)
class EngineOptions:
    """How the engine runs a training, for measurements (``bench/ab.py``): the defaults
    are the measured best, and no choice changes a result.

    Attributes:
        graph: the task-graph optimizer's choices (:class:`~dfdl.taskgraph.optimize.
            GraphOptions`).
        freeze_heaps: freeze the Python heaps of the trainer, the workers and the
            scheduler while training (:mod:`dfdl.runtime.gc_freeze`).
    """

    graph: GraphOptions = GraphOptions()
    freeze_heaps: bool = True


@dataclass(frozen=True)
class EpochEnd:
    """What ``on_epoch`` (:func:`dfdl.train`) is told at the end of every epoch.

    Attributes:
        epoch: the epoch that ended, counted from 1.
        step: steps trained so far.
        losses: the training loss of each of the epoch's steps trained in this run
            (a run resumed mid-epoch has only those since the checkpoint).
        metrics: the validation metrics after the epoch (``"loss"``, and ``"accuracy"``
            for class labels); empty without ``validation``.

    Example:
        >>> EpochEnd(epoch=1, step=10, losses=[2.3], metrics={"loss": 2.1}).metrics["loss"]
        2.1
    """

    epoch: int
    step: int
    losses: list[float]
    metrics: dict[str, float]


@dataclass(frozen=True)
class TrainConfig:
    """The arguments of a training run, checked when made (see :func:`dfdl.train` for
    their meaning).

    Raises:
        ConfigError: a value out of range, or options that need one another.

    Example:
        >>> TrainConfig(batch_size=0)
        Traceback (most recent call last):
        dfdl.errors.ConfigError: batch_size must be a positive integer, not 0
    """

    loss: str = "cross_entropy"
    optimizer: Optimizer = field(default_factory=lambda: SGD(lr=0.01))
    batch_size: int = 64
    epochs: int = 1
    steps: int | None = None
    shuffle: bool = True
    seed: int = 0
    tiles: Any = None
    checkpoint_dir: Any = None
    checkpoint_every: int | None = None
    progress: bool = True
    resume: bool | str = False
    frozen: tuple[str, ...] = ()
    drop_last: bool = False
    unroll: int = DEFAULT_UNROLL
    loss_options: Mapping[str, Any] = field(default_factory=dict)
    memory: str = "auto"
    engine: EngineOptions = EngineOptions()
    on_epoch: Callable[[EpochEnd], bool | None] | None = None
    weights_dir: Any = None

    def __post_init__(self) -> None:
        for name in ("batch_size", "epochs"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, not {value!r}")
        for name in ("steps", "unroll"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be a positive integer, not {value!r}")
        every = self.checkpoint_every
        if every is not None and (
            isinstance(every, bool) or not isinstance(every, int) or every < 1
        ):
            raise ConfigError(
                f"checkpoint_every must be a positive integer (steps between checkpoints), "
                f"not {every!r}: leave it out for no checkpoints"
            )
        if self.checkpoint_every is not None and self.checkpoint_dir is None:
            raise ConfigError("checkpoint_every needs checkpoint_dir")
        ckpt = self.checkpoint_dir
        if ckpt is not None and (not isinstance(ckpt, (str, os.PathLike)) or str(ckpt) == ""):
            raise ConfigError(f"checkpoint_dir must be a folder path, not {ckpt!r}")
        if not (isinstance(self.resume, bool) or self.resume == "auto"):
            raise ConfigError(
                f"resume must be True, False or 'auto' (continue if a checkpoint exists), "
                f"not {self.resume!r}"
            )
        if self.memory not in MODES:
            raise ConfigError(
                f"memory must be one of {', '.join(map(repr, MODES))}, not {self.memory!r}"
            )
        wdir = self.weights_dir
        if wdir is not None:
            if not isinstance(wdir, (str, os.PathLike)) or str(wdir) == "":
                raise ConfigError(f"weights_dir must be a folder path, not {wdir!r}")
        if self.resume and self.checkpoint_dir is None:
            raise ConfigError(f"resume={self.resume!r} needs checkpoint_dir")
        if self.on_epoch is not None and not callable(self.on_epoch):
            raise ConfigError(
                f"on_epoch must be a callable (EpochEnd) -> bool, not {self.on_epoch!r}"
            )
        object.__setattr__(self, "frozen", tuple(self.frozen))
        object.__setattr__(self, "loss_options", dict(self.loss_options))


class TrainingSession:
    """One training run of a model on data (see the module docstring).

    Args:
        model: ONNX path, bytes or ModelProto.
        data: ``(X, y)``, or ``X`` alone when the loss is a model output.
        config: the run's arguments.
        validation: ``(X_val, y_val)`` evaluated after each epoch, or None.
        tags: extra fields of the run on the dashboard page (``{"study": name,
            "trial": number}`` for :func:`dfdl.tune`'s trials).

    Raises:
        ModelError / UnsupportedOpError / ShapeError / DataError / MemoryPlanError /
            CheckpointError: on :meth:`run`, before any cluster starts.
    """

    def __init__(
        self,
        model: ModelLike,
        data,
        config: TrainConfig,
        validation=None,
        tags: Mapping[str, Any] | None = None,
    ):
        t_start = time.perf_counter()
        self.config = config
        self.validation = validation
        self.tags = dict(tags or {})
        if config.weights_dir is None and isinstance(model, str | os.PathLike):
            check_client_memory(model)  # before the client loads what it cannot hold
        # with weights_dir the workers read the model's external data themselves
        # torch's optimizing exporter merged, transposed and expanded parameters: undone
        self.proto = unfold(load_model(model, map_external=config.weights_dir is not None))
        self.graph = to_ir(self.proto)
        self.name = _model_name(model, self.proto)
        folded = exporter_folded(self.proto)
        if folded:
            shown = ", ".join(folded[:3]) + (
                f" and {len(folded) - 3} more" if len(folded) > 3 else ""
            )
            warnings.warn(
                f"{self.name} was written by torch's optimizing exporter (optimize=True), "
                f"which stored copies of parameters it folded ({shown}): training trains "
                "those copies, not the network PyTorch trains; export with "
                "torch.onnx.export(..., optimize=False) to train it",
                FoldedParametersWarning,
                stacklevel=3,
            )
        tied = tied_initializers(self.graph)
        if tied:
            shown = ", ".join(f"{k} = {v}" for k, v in list(tied.items())[:3]) + (
                f" and {len(tied) - 3} more" if len(tied) > 3 else ""
            )
            warnings.warn(
                f"{self.name} reads {len(tied)} float initializers through Identity nodes "
                f"under other names ({shown}): each group trains as one tensor, as the file "
                "says; if they are separate parameters in PyTorch (TorchScript's exporter "
                "in eval mode stores equal ones once), export with "
                "training=torch.onnx.TrainingMode.TRAINING or dynamo=True",
                TiedParametersWarning,
                stacklevel=3,
            )
        self.X, self.y = split_data(data, "data")
        if len(self.graph.inputs) != 1:
            raise ConfigError(
                f"dfdl.train supports models with one data input; this one has {self.graph.inputs}"
            )
        if len(self.X) == 0:
            raise DataError("data has no samples")
        self.model_loss = config.loss in self.graph.outputs
        if not self.model_loss and self.y is None:
            raise DataError(f"loss {config.loss!r} needs labels: pass data=(X, y)")
        self.timings = {"setup_s": 0.0, "graph_s": 0.0, "submit_s": 0.0, "wait_s": 0.0}
        self._load_s = time.perf_counter() - t_start  # counted in the run's setup time
        self._graphs: dict[int, Any] = {}
        self._resume: tuple[int, dict[str, np.ndarray] | None] | None = None
        #: with weights_dir: this run's folder in it (made by :meth:`resume_point`)
        self.run_dir: Path | None = None
        self._checked = False
        self._spilling: dict[int, StepPlan] = {}
        self._chosen: dict[int, StepPlan] = {}

    # ------------------------------------------------------------------ compiling

    def training_graph(self, batch: int):
        """The training graph for batches of ``batch`` samples (cached per batch size)."""
        if batch not in self._graphs:
            cfg = self.config
            X, y = self.X, self.y
            labels = None if y is None else TensorType((batch, *y.shape[1:]), y.dtype)
            self._graphs[batch] = build_training_graph(
                self.graph,
                {self.graph.inputs[0]: TensorType((batch, *X.shape[1:]), X.dtype)},
                loss=cfg.loss,
                optimizer=cfg.optimizer,
                labels=labels,
                frozen=cfg.frozen,
                seed=cfg.seed,
                loss_options=cfg.loss_options,
            )
        return self._graphs[batch]

    def spilling_plan(self, batch: int, workers: Workers) -> StepPlan:
        """The step plan for batches of ``batch`` samples, every activation kept
        (cached per batch size; the last batch of an epoch may be smaller)."""
        if batch not in self._spilling:
            tg = self.training_graph(batch)
            self._spilling[batch] = training_plan(tg, self.config.tiles, workers)
        return self._spilling[batch]

    def chosen_plan(self, batch: int, workers: Workers, client) -> StepPlan:
        """The step plan a run submits: spill or recompute chosen on the client's workers
        (:func:`dfdl.plan.compile.choose_variant`)."""
        if batch not in self._chosen:
            sp = choose_variant(
                self.spilling_plan(batch, workers),
                self.config.memory,
                workers,
                lambda: cluster_speeds(client),
            )
            tg = sp.tg
            for k in tg.frozen:  # float initializers that stay constant are graph inputs
                if k in tg.graph.inputs:
                    tg.graph.initializers.setdefault(k, _initial(self.graph, k))
            self._chosen[batch] = sp
        return self._chosen[batch]

    def check_model_and_data(self) -> None:
        """Build the first step's training graph and check the labels against it: the
        errors of the model (unsupported ops, shapes), the loss and the data that need no
        cluster, so a run on a user's scheduler fails before it connects (cached).

        Raises:
            DfdlError: the model, the loss or the data cannot train (the subclass names
                which).

        Example:
            >>> session.check_model_and_data()  # doctest: +SKIP
        """
        if self._checked:
            return
        cfg = self.config
        tg = self.training_graph(min(cfg.batch_size, len(self.X)))
        if self.y is not None and not self.model_loss:
            logits = tg.graph.types[tg.output]
            labels = TensorType((logits.shape[0], *self.y.shape[1:]), self.y.dtype)
            classes = label_classes(logits, labels)
            check_labels(self.y, cfg.loss, classes, cfg.loss_options.get("ignore_index"))
        self._checked = True

    def check(self, workers: Workers) -> StepPlan:
        """Compile the first step and check the labels and the validation data against
        the model: every error the model, the data or the plan can raise, before any
        cluster starts."""
        cfg = self.config
        self.check_model_and_data()
        first = self.spilling_plan(min(cfg.batch_size, len(self.X)), workers)
        if self.validation is not None:
            check_validation(
                self.graph,
                self.validation,
                cfg.loss,
                cfg.loss_options,
                cfg.batch_size,
                cfg.tiles,
                workers.cores,
                workers.memory_limit,
            )
        return first

    def resume_point(self) -> tuple[int, dict[str, np.ndarray] | None]:
        """The step to start at and, resuming, the checkpoint's carried values (None
        when starting from the model): the checkpoint folder and the checkpoint checked
        before any cluster starts (cached; :meth:`run` calls it first).

        With ``resume`` the latest checkpoint must be readable and written by a run like
        this one (:func:`dfdl.runtime.checkpoint.mismatch`); ``resume=True`` needs one,
        ``resume="auto"`` starts from step 0 without one. With ``checkpoint_every`` the
        folder is created if missing and must be writable.

        Raises:
            CheckpointError: the folder cannot be written, the checkpoint is missing
                (``resume=True``), unreadable or of another run; or a run without
                ``resume`` would overwrite the folder's checkpoints.

        Example:
            >>> session.resume_point()  # doctest: +SKIP
            (100, {...})
        """
        if self._resume is not None:
            return self._resume
        cfg = self.config
        found = None
        if cfg.resume:
            path = checkpoint.find(cfg.checkpoint_dir)
            if path is None and cfg.resume is True:
                raise CheckpointError(
                    f"resume=True but checkpoint_dir {cfg.checkpoint_dir} holds no checkpoint "
                    f"(its '{checkpoint.POINTER}' pointer is missing or empty): start without "
                    "resume, or with resume='auto' (--resume-if-any) to start from step 0 when "
                    "there is none",
                    path=str(cfg.checkpoint_dir),
                )
            if path is not None:
                found = (path, *checkpoint.load(path))
        elif cfg.checkpoint_every is not None:
            existing = checkpoint.find(cfg.checkpoint_dir)
            if existing is not None:
                raise CheckpointError(
                    f"checkpoint_dir {cfg.checkpoint_dir} holds another run's checkpoints "
                    f"(latest {existing.name}), which a new run would overwrite: continue "
                    "that run with resume=True (--resume) or resume='auto' "
                    "(--resume-if-any), or give another checkpoint_dir",
                    path=str(existing),
                )
        if cfg.checkpoint_every is not None:
            checkpoint.prepare(cfg.checkpoint_dir)
        if cfg.weights_dir is not None:
            self.run_dir = _prepare_weights_dir(cfg.weights_dir, self.name)
        if found is None:
            self._resume = (0, None)
            return self._resume
        path, step, arrays, meta = found
        tg = self.training_graph(min(cfg.batch_size, len(self.X)))
        expected = {k: (tg.graph.types[k].shape, tg.graph.types[k].dtype) for k in tg.carried()}
        wrong = checkpoint.mismatch(path, meta, arrays, self.checkpoint_meta(tg), expected)
        if wrong is not None:
            raise CheckpointError(wrong, path=str(path))
        self._resume = (step, arrays)
        return self._resume

    def checkpoint_meta(self, tg) -> dict[str, Any]:
        """What a checkpoint records about the run that writes it, to be compared with
        the run that resumes from it (:func:`dfdl.runtime.checkpoint.mismatch`)."""
        cfg = self.config
        return {
            "params": sorted(tg.params + tg.buffers),
            "optimizer": {
                "kind": type(cfg.optimizer).__name__,
                "states": list(cfg.optimizer.state_suffixes),
            },
            "loss": cfg.loss,
            "batch_size": cfg.batch_size,
            "seed": cfg.seed,
            "samples": len(self.X),
            "shuffle": cfg.shuffle,
            "drop_last": cfg.drop_last,
        }

    # ------------------------------------------------------------------ running

    def run(self, client=None) -> TrainResult:
        """Train to the end of the schedule on ``client``'s cluster (None: the embedded
        one) and return the result."""
        t_start = time.perf_counter()
        cfg = self.config
        self.resume_point()
        self.check_model_and_data()
        if client is not None:
            # before the thresholds are read: the plan is made for the workers as set up
            worker_setup.install(client)
        device = workers_device(client) if client is not None else "cpu"
        cores = total_threads(client) if client is not None else default_workers()
        if device == "gpu":  # a GPU runs a tile's kernels one after another on one stream:
            # tiles for more threads would only mean more launches and partial sums
            cores = len(gpu_workers(client))
        memory_limit = (
            worker_memory_limit(client) if client is not None else embedded_memory_limit()
        )
        if device == "gpu":  # a GPU worker's tiles live in its device memory
            memory_limit = min(
                (v for v in (memory_limit, device_memory_limit(client)) if v), default=None
            )
        workers = Workers(
            cores=cores,
            memory_limit=memory_limit,
            # tiles fit between the workers' own pause line and the headroom (plan.estimate)
            thresholds=worker_memory_config(client),
            device=device,
        )
        first = self.check(workers)
        tg = first.tg
        start, values = self._start(tg)
        schedule = list(
            batch_plan(
                len(self.X),
                cfg.batch_size,
                epochs=cfg.epochs,
                steps=cfg.steps,
                shuffle=cfg.shuffle,
                seed=cfg.seed,
                drop_last=cfg.drop_last,
                start=start,
            )
        )
        # every step's lr from the schedule, so a bad schedule fails before any task
        feeds = {
            step: cfg.optimizer.step_feeds(step + 1, tg.scalars[0], tg.step_inputs)
            for step, _epoch, _idx in schedule
        }
        total = start + len(schedule)
        with connect(client) as c:
            pinning.install(c)  # the workers' shares of a step stay on their workers
            nthreads = c.nthreads()
            on = replace(workers, processes=len(nthreads), threads=max(nthreads.values()))
            anchor = Anchor(start, {k: values[k] for k in tg.carried()})
            del values
            reporter = Reporter(
                c,
                f"{self.name}-{new_token()}",
                model=self.name,
                batch_size=cfg.batch_size,
                total=total,
                threads=workers.cores,
                **self.tags,
            )
            progress = Progress(
                reporter, show=cfg.progress, total=total, start=start, batch_size=cfg.batch_size
            )
            collector = LossCollector(
                c,
                lambda step, v: progress.loss(step, v, collector.total[0], collector.total[2]),
                SpillMeter(c),
            )
            # client None: the embedded cluster, whose processes are dfdl's own
            run = _Run(self, c, client is None, on, schedule, feeds, anchor, collector, reporter)
            self.timings["setup_s"] = self._load_s + time.perf_counter() - t_start
            interrupted = False
            try:
                final = run.with_recovery(progress)
            except KeyboardInterrupt:
                interrupted = True
            finally:
                progress.close()
            if interrupted:
                # the run's futures live in the caught interrupt's traceback, which a
                # notebook keeps (sys.last_traceback): raise a fresh one, so the cluster
                # drops the run's tasks and tiles now instead of computing them for nobody
                del run, collector, anchor
                gc.collect()
                raise KeyboardInterrupt
        return self._result(run, progress, collector, final, t_start)

    def _start(self, tg) -> tuple[int, dict[str, np.ndarray]]:
        """The step to start at and the carried values there: the checkpoint's when
        resuming (:meth:`resume_point`), else the model's initializers and fresh
        optimizer state."""
        cfg = self.config
        start, resumed = self.resume_point()
        self._resume = None  # the arrays are the anchor's now
        if resumed is not None:
            return start, resumed
        zeros = type(cfg.optimizer).init_state is Optimizer.init_state
        if cfg.weights_dir is not None and zeros:  # the workers read and zero their tiles
            values = {p: self.graph.initializers[p] for p in tg.params + tg.buffers}
            for p in tg.params:
                for sname in tg.states[p]:
                    t = tg.graph.types[sname]
                    values[sname] = Zeros(tuple(t.shape), np.dtype(t.dtype).str)
            return 0, values
        values = {p: _initial(self.graph, p) for p in tg.params + tg.buffers}
        for p in tg.params:
            for sname, v in zip(tg.states[p], cfg.optimizer.init_state(values[p])):
                values[sname] = v
        return 0, values

    def _result(self, run, progress, collector, final, t_start) -> TrainResult:
        first = run.first
        tg = first.tg
        history: dict[str, list] = {"loss": []}
        done = sorted(progress.losses)
        spilled = [collector.spilled.get(s, (0, 0, 0, 0)) for s in done]
        history["loss"] = [progress.losses[s] for s in done]
        history["spilled_bytes"] = [m[0] for m in spilled]
        history["unspilled_bytes"] = [m[1] for m in spilled]
        if run.workers.device == "gpu":
            history["device_spilled_bytes"] = [m[2] for m in spilled]
            history["device_unspilled_bytes"] = [m[3] for m in spilled]
        for epoch in sorted(run.validated):
            for k, v in run.validated[epoch].items():
                history.setdefault(f"val_{k}", []).append(v)
        params = {k: final[k] for k in tg.params + tg.buffers}
        if self.config.weights_dir is not None:  # where the workers wrote them
            model = stored_model(self.proto, params)
            params = {k: v.mapped() for k, v in params.items()}
        else:
            model = trained_model(self.proto, params)
        self.timings["total_s"] = self._load_s + time.perf_counter() - t_start
        fused = self.config.engine.graph.fuse and all(sp.fits for sp in self._chosen.values())
        return TrainResult(
            history,
            model,
            params,
            dict(self.timings),
            first.plan.tiles,
            sorted(set(first.tg.recomputed.values())),
            run.rollbacks,
            bool(self._chosen) and fused,
            run.stopped,
            self.run_dir,
        )


class _Run:
    """The submission loop of one :meth:`TrainingSession.run` on a connected client."""

    def __init__(
        self, session, client, owned, workers, schedule, feeds, anchor, collector, reporter
    ):
        self.session = session
        self.client = client
        self.owned = owned
        self.workers = workers
        self.schedule = schedule
        self.feeds = feeds
        self.anchor = anchor
        self.collector = collector
        self.reporter = reporter
        self.validated: dict[int, dict[str, float]] = {}
        self.warned_nonfinite = False
        self.rollbacks = 0
        #: the epoch (from 1) after which ``on_epoch`` stopped training, if it did
        self.stopped: int | None = None
        cfg = session.config
        self.first = session.chosen_plan(min(cfg.batch_size, len(session.X)), workers, client)
        self.graph_options = cfg.engine.graph
        if workers.device == "gpu":  # steps of milliseconds: one task per submitted group
            self.graph_options = replace(
                self.graph_options,
                steps_per_task=self.graph_options.steps_per_task or cfg.unroll,
                programs=True,
            )
        elif self.graph_options.steps_per_task is None and workers.processes > 1:
            # one share per worker of a submitted group: a step's layers start on a worker
            # once their weights are updated, not once the previous step ended everywhere
            self.graph_options = replace(self.graph_options, steps_per_task=cfg.unroll)
        #: compiled step groups by shape (dfdl.taskgraph.program), kept across attempts
        self.programs = {} if self.graph_options.programs else None
        self.tg = self.first.tg
        self.per_epoch = steps_per_epoch(len(session.X), cfg.batch_size, cfg.drop_last)

    def plan(self, batch: int) -> StepPlan:
        return self.session.chosen_plan(batch, self.workers, self.client)

    def tell_epoch(self, epoch: int, step: int) -> bool:
        """Call ``on_epoch`` at the end of ``epoch`` (0-based); whether it asks to stop."""
        self.collector.collect()
        values = self.collector.values
        first = epoch * self.per_epoch
        report = EpochEnd(
            epoch=epoch + 1,
            step=step + 1,
            losses=[values[k] for k in range(first, step + 1) if k in values],
            metrics=dict(self.validated.get(epoch, {})),
        )
        return bool(self.session.config.on_epoch(report))

    def warn_nonfinite(self, epoch: int, step: int) -> None:
        """Warn, once per run, of a validation loss that is NaN or infinite."""
        value = self.validated[epoch]["loss"]
        if math.isfinite(value) or self.warned_nonfinite:
            return
        self.warned_nonfinite = True
        logger.warning(
            "dfdl: the validation loss is %s after epoch %d (step %d); training goes on. "
            "Check the validation data for NaN or infinite values (np.isfinite(X_val).all()); "
            "later epochs' non-finite validation losses are not reported again",
            value,
            epoch + 1,
            step + 1,
        )

    def with_recovery(self, progress: Progress) -> dict[str, np.ndarray]:
        """:meth:`attempt`, replayed from the anchor while lost data can be rebuilt that
        way (at most ``MAX_ROLLBACKS`` times)."""
        c = self.client
        restarts = MemoryRestarts(c)
        while True:
            try:
                with frozen_heaps(c, self.session.config.engine.freeze_heaps, owned=self.owned):
                    final = self.attempt()
                for event in restarts.new():  # Dask rebuilt what the worker held
                    logger.warning(
                        "dfdl: %s. %s", describe_memory_restart(event), MEMORY_RESTART_ADVICE
                    )
                self.reporter.end("done" if self.stopped is None else "stopped")
                return final
            except Exception as e:  # noqa: BLE001 - only lost data is retried
                lost = is_lost_data(e) or isinstance(e, KilledWorker)
                # a restart for memory is a defect to explain, not a loss to replay
                for_memory = restarts.new(wait=MEMORY_EVENT_WAIT_S) if lost else []
                if for_memory or not is_lost_data(e) or self.rollbacks >= MAX_ROLLBACKS:
                    self.reporter.end("failed")
                if for_memory:
                    task = e.task if isinstance(e, KilledWorker) else None
                    raise memory_restart_error(for_memory, task) from e
                if isinstance(e, KilledWorker):
                    raise killed_worker_error(e) from e
                if not is_lost_data(e):
                    raise
                self.rollbacks += 1
                if self.rollbacks > MAX_ROLLBACKS:
                    raise rollback_error(e, self.rollbacks) from e
                logger.warning(
                    "dfdl: a worker was lost with data Dask cannot rebuild (%s); replaying "
                    "from step %d (rollback %d of at most %d)",
                    e,
                    self.anchor.step,
                    self.rollbacks,
                    MAX_ROLLBACKS,
                )
                self.collector.drop_pending()
                progress.rollback(self.anchor.step)
                wait_for_workers(c)

    def attempt(self) -> dict[str, np.ndarray]:
        """Train from the anchor to the end of the schedule; the final carried values."""
        s, c, cfg, tg = self.session, self.client, self.session.config, self.tg
        timings = s.timings
        place = placement(c, self.workers.device)
        state = ClusterState.scatter(c, self.anchor.arrays, self.first.plan.chunks, place)
        token = new_token()
        self.reporter.token(token)
        constants = Constants(c, place)
        anchors = AnchorPolicy()
        group: list[StepInput] = []
        done = self.anchor.step
        for i, (step, epoch, idx) in enumerate(self.schedule):
            if step < self.anchor.step:
                continue
            arrays = {s.graph.inputs[0]: s.X.batch(idx)}
            if s.y is not None and not s.model_loss:
                arrays[tg.labels] = s.y.batch(idx)
            group.append(StepInput(step, arrays, self.feeds[step]))
            last = i == len(self.schedule) - 1
            ckpt_now = cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0
            epoch_end = (step + 1) % self.per_epoch == 0
            validate = epoch_end and s.validation is not None
            hook = epoch_end and cfg.on_epoch is not None
            if not (len(group) >= cfg.unroll or last or ckpt_now or validate or hook):
                continue
            state, losses = run_steps(
                c,
                self.plan,
                group,
                state,
                constants,
                seed=cfg.seed,
                token=token,
                timings=timings,
                options=self.graph_options,
                device=self.workers.device,
                programs=self.programs,
            )
            done = step + 1
            self.collector.add(losses)
            t_wait = time.perf_counter()
            self.collector.collect(keep_last=len(losses))
            self.reporter.flush()
            timings["wait_s"] += time.perf_counter() - t_wait
            group = []
            if validate:
                self.collector.collect()
                if cfg.weights_dir is None:
                    current = state.gather(c, tg.graph.types)
                else:  # an anchor on disk, whose files the validation pass reads
                    self.anchor = Anchor(step + 1, self.keep(state, step + 1))
                    current = {k: v.mapped() for k, v in self.anchor.arrays.items()}
                self.validated[epoch] = evaluate(
                    c,
                    s.graph,
                    {k: current[k] for k in tg.params + tg.buffers},
                    s.validation,
                    cfg.loss,
                    cfg.loss_options,
                    cfg.batch_size,
                    cfg.tiles,
                    self.workers.cores,
                    self.workers.memory_limit,
                )
                self.reporter.validation(step + 1, self.validated[epoch])
                self.warn_nonfinite(epoch, step)
            # before the checkpoint: a run killed in between replays the epoch and tells
            # on_epoch again, instead of resuming past an epoch it never told
            if hook and self.tell_epoch(epoch, step):
                self.stopped = epoch + 1
                break
            if ckpt_now and cfg.weights_dir is not None:  # the workers write it
                self.collector.collect()
                now = checkpoint.save_stored(
                    cfg.checkpoint_dir,
                    step + 1,
                    functools.partial(state.store, c, types=tg.graph.types),
                    s.checkpoint_meta(tg),
                )
                self.anchor = Anchor(step + 1, {k: now[k] for k in tg.carried()})
                _remove_anchors(s.run_dir)
            elif ckpt_now:
                self.collector.collect()
                now = state.gather(c, tg.graph.types)
                checkpoint.save(cfg.checkpoint_dir, step + 1, now, s.checkpoint_meta(tg))
                self.anchor = Anchor(step + 1, {k: now[k] for k in tg.carried()})
            elif not last and anchors.due():
                t_anchor = time.perf_counter()
                self.collector.collect()
                self.anchor = Anchor(step + 1, self.keep(state, step + 1))
                anchors.taken(time.perf_counter() - t_anchor)
        t_wait = time.perf_counter()
        self.collector.collect(final=True)
        out = self.keep(state, done)
        timings["wait_s"] += time.perf_counter() - t_wait
        return out

    def keep(self, state: ClusterState, step: int) -> dict[str, Any]:
        """The carried tensors after ``step`` steps, where the client can restart from
        them: gathered, or with ``weights_dir`` written by the workers to
        ``<run folder>/step-<step>`` (the folder of the step before is removed)."""
        s = self.session
        types = self.tg.graph.types
        if s.config.weights_dir is None:
            return state.gather(self.client, types)
        on_disk = {k: source_of(v) for k, v in self.anchor.arrays.items()}
        if step == self.anchor.step and all(isinstance(v, Stored) for v in on_disk.values()):
            return on_disk  # already on disk (never rewrite the files it reads)
        folder = s.run_dir / f"step-{step}"
        out = state.store(self.client, folder, types)
        _remove_anchors(s.run_dir, but=folder)
        return out


def _remove_anchors(run_dir: Path, but: Path | None = None) -> None:
    """Remove the anchor folders of ``run_dir`` but ``but``: a newer anchor (or a
    checkpoint) is on disk."""
    for old in run_dir.glob("step-*"):
        if old != but:
            shutil.rmtree(old, ignore_errors=True)


def _model_name(model, proto: onnx.ModelProto) -> str:
    """A short name for the dashboard: the file's stem, else the ONNX graph's name."""
    if isinstance(model, str) or hasattr(model, "__fspath__"):
        return Path(model).stem
    return proto.graph.name or "model"


#: the client's peak memory while training without weights_dir, in copies of the weights
#: (the loaded model and its arrays, the initial and the gathered values, the result)
CLIENT_COPIES = 3
#: model files smaller than this are parsed to count their external data
PARSE_BELOW = 64 * 2**20


def check_client_memory(path: str | os.PathLike, available: int | None = None) -> None:
    """Refuse a model file whose weights do not fit this process's free memory, and warn
    where :data:`CLIENT_COPIES` copies of them do not: without ``weights_dir`` the client
    loads, sends and gathers them all.

    Raises:
        ConfigError: the weights alone are more than the free memory (``available``,
            default: what the OS reports).

    Example:
        >>> check_client_memory("unet3d.onnx")  # doctest: +SKIP
    """
    if not Path(path).is_file():
        return  # load_model says what is wrong with it
    size = os.path.getsize(path)
    # a file with its weights inside is its own measure (no need to parse it twice)
    need = file_tensor_bytes(path) if size < PARSE_BELOW else size
    free = psutil.virtual_memory().available if available is None else available
    fix = (
        "train with weights_dir= (dfdl train --weights-dir), a folder this process and "
        "the workers share, to keep the weights on the workers"
    )
    if need > free:
        raise ConfigError(
            f"{Path(path).name} holds {format_bytes(need)} of weights, more than this "
            f"process's {format_bytes(free)} of free memory: the client would load, send "
            f"and gather them all; {fix}"
        )
    if CLIENT_COPIES * need > free:
        warnings.warn(
            f"{Path(path).name} holds {format_bytes(need)} of weights, and this process "
            f"has {format_bytes(free)} of free memory: the client holds up to "
            f"{CLIENT_COPIES} copies of them while training; {fix}",
            ClientMemoryWarning,
            stacklevel=4,
        )


def _prepare_weights_dir(folder, name: str) -> Path:
    """A new folder for this run's stored weights in ``folder`` (created), checked to be
    writable before any cluster starts."""
    root = Path(folder).absolute()
    try:
        root.mkdir(parents=True, exist_ok=True)
        run = Path(tempfile.mkdtemp(prefix=f"{safe_name(name)}-", dir=root))
    except OSError as e:
        raise ConfigError(
            f"weights_dir {root} cannot be written ({e.strerror or e}): give a folder this "
            "process and every worker can write (a shared filesystem on a cluster)"
        ) from e
    return run


def _initial(graph, name: str) -> np.ndarray:
    value = graph.initializers[name]
    if of_memmap(value) is not None:  # read-only, and read by the workers (weights_dir)
        return value
    return np.array(value, copy=True)


def train_config(frozen: Iterable[str] = (), **kwargs) -> TrainConfig:
    """A :class:`TrainConfig` from :func:`dfdl.train`'s keyword arguments (None: the
    default of that argument)."""
    given = {k: v for k, v in kwargs.items() if v is not None}
    return TrainConfig(frozen=tuple(frozen), **given)
