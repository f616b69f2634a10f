"""``dfdl.train``: train an ONNX model on a Dask cluster, and ``dfdl.training_graph``."""

from __future__ import annotations

import copy
import logging
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnx
from dask.utils import format_bytes
from distributed.scheduler import KilledWorker
from onnx import numpy_helper

from dfdl.data.order import batch_plan, steps_per_epoch
from dfdl.data.sources import ArraySource, as_source
from dfdl.errors import ConfigError, DataError
from dfdl.ir.bind import bind
from dfdl.ir.onnx_io import ModelLike, from_ir, load_model, to_ir
from dfdl.ops.registry import TensorType
from dfdl.plan.compile import (
    SPLIT_NORMS,
    StepPlan,
    Workers,
    choose_variant,
    training_plan,
)
from dfdl.plan.tiling import make_plan
from dfdl.runtime import checkpoint
from dfdl.runtime.cluster import (
    connect,
    default_workers,
    embedded_memory_limit,
    total_threads,
    worker_memory_config,
    worker_memory_limit,
)
from dfdl.runtime.gc_freeze import frozen_heaps
from dfdl.runtime.monitor import Reporter
from dfdl.runtime.probe import cluster_speeds
from dfdl.runtime.recovery import (
    MAX_ROLLBACKS,
    Anchor,
    AnchorPolicy,
    is_lost_data,
    killed_worker_error,
    rollback_error,
    wait_for_workers,
)
from dfdl.runtime.trainer import (
    ClusterState,
    Constants,
    LossCollector,
    SpillMeter,
    StepInput,
    Throughput,
    run_steps,
)
from dfdl.taskgraph.lower import new_token
from dfdl.training.graph import TrainingGraph, build_training_graph
from dfdl.training.passes.recompute import MODES

logger = logging.getLogger("dfdl")

#: steps per graph submission when ``unroll`` is not given
DEFAULT_UNROLL = 4
#: fuse single-consumer tasks into their consumer where the plan allows it (:func:`_fusing`)
FUSE_TASKS = True


@dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        history: ``"loss"``: one float per step, in order; ``"spilled_bytes"`` and
            ``"unspilled_bytes"``: bytes the workers wrote to and read back from their
            spill directories, per step (read from the workers at most once a
            second and shared evenly by the steps in between: their tasks overlap);
            with validation, ``"val_loss"`` (and ``"val_accuracy"`` for
            classification) per epoch.
        model: the ONNX model with the trained initializers (and BatchNorm statistics).
        params: the trained parameters by name.
        timings: seconds spent on the client: ``setup_s`` (loading, planning, sending
            the initial weights), ``graph_s`` (building step graphs), ``submit_s``
            (handing them to the scheduler), ``wait_s`` (waiting for losses and the
            final weights; the cluster computes meanwhile), ``total_s``.
        tiles: the tiling the steps ran with (``{"batch": b, "model": m}``, or
            "uneven"): the automatic choice, split further where the workers' memory
            limit required it. Pass it as ``tiles=`` to repeat the same plan.
        recomputed: the forward nodes whose outputs the backward pass rebuilt instead
            of keeping (``memory="recompute"``, or what ``"auto"`` chose).
        rollbacks: how often a lost worker took data Dask could not rebuild with it,
            so that training went back to the initial weights or the latest
            checkpoint and replayed the steps since (the result is the same either
            way; see :mod:`dfdl.runtime.recovery`).
        fused: whether the steps ran with single-consumer tasks fused into their
            consumer (:mod:`dfdl.taskgraph.fuse`, fewer and larger tasks, the same values):
            off where the plan recomputes or its estimate spills.
    """

    history: dict[str, list] = field(default_factory=dict)
    model: onnx.ModelProto | None = None
    params: dict[str, np.ndarray] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    tiles: dict[str, int] | str | None = None
    recomputed: list[str] = field(default_factory=list)
    rollbacks: int = 0
    fused: bool = False

    def save(self, path) -> None:
        """Write the trained model as an ONNX file (onnxruntime runs it)."""
        onnx.save(self.model, str(path))


def _split_data(data, name: str) -> tuple[ArraySource, ArraySource | None]:
    if isinstance(data, tuple | list) and len(data) == 2:
        X, y = as_source(data[0], f"{name} X"), as_source(data[1], f"{name} y")
        if len(X) != len(y):
            raise DataError(f"{name}: X has {len(X)} samples but y has {len(y)}")
        return X, y
    return as_source(data, f"{name} X"), None


def _check_labels(y: ArraySource, tg: TrainingGraph, loss: str, options: Mapping) -> None:
    if loss not in ("cross_entropy", "dice"):
        return
    if y.dtype.kind not in "iu":
        raise DataError(f"loss {loss!r} needs integer class labels; y has dtype {y.dtype}")
    logits = tg.graph.types[tg.output]
    classes = logits.shape[1] if logits.rank > 1 else logits.shape[0]
    ignore = options.get("ignore_index")
    for block in y.chunks():
        bad = (block < 0) | (block >= classes)
        if ignore is not None:
            bad &= block != ignore
        if bad.any():
            v = block[bad].flat[0]
            raise DataError(
                f"label {int(v)} is out of range: the model has {classes} classes "
                f"(valid labels 0..{classes - 1})"
            )


def train(
    model: ModelLike,
    data,
    loss: str = "cross_entropy",
    optimizer=None,
    batch_size: int = 64,
    epochs: int = 1,
    steps: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
    validation=None,
    client=None,
    tiles=None,
    checkpoint_dir=None,
    checkpoint_every: int | None = None,
    progress: bool = True,
    *,
    resume: bool = False,
    frozen: Iterable[str] = (),
    drop_last: bool = False,
    unroll: int | None = None,
    loss_options: Mapping[str, Any] | None = None,
    memory: str = "auto",
) -> TrainResult:
    """Train ``model`` on ``data`` on a Dask cluster.

    Args:
        model: ONNX path, bytes or ModelProto.
        data: ``(X, y)`` (numpy arrays, dask arrays or ``.npy`` paths); or ``X`` alone
            when ``loss`` names a model output.
        loss: "cross_entropy", "mse", "bce_with_logits", "dice", or the name of a
            model output that already is the loss.
        optimizer: a :mod:`dfdl.optim` optimizer (default ``SGD(lr=0.01)``).
        batch_size: samples per step.
        epochs: passes over the data.
        steps: stop after this many steps (default: ``epochs`` full passes).
        shuffle: reshuffle every epoch from ``seed``; False keeps the order.
        seed: seed of the data order and of Dropout masks.
        validation: ``(X_val, y_val)`` evaluated (inference mode) after each epoch.
        client: a ``distributed.Client``; None starts an embedded LocalCluster.
        tiles: None (automatic), "uneven", or ``{"batch": b, "model": m, "space": s}``
            (``space``: slabs along the first spatial axis of convolutions/pools;
            ``"split_norms": 1`` tiles BatchNormalization over batch and space too;
            ``"min_weight_tile"``: bytes below which a weight's model tiles keep its
            outputs' model axes whole, as the automatic tiles do).
        checkpoint_dir: where checkpoints go; with ``checkpoint_every`` steps.
        checkpoint_every: steps between checkpoints.
        progress: a tqdm bar on a terminal (steps, loss, samples/s).
        resume: continue from the latest checkpoint in ``checkpoint_dir``.
        frozen: initializer names that must not train.
        drop_last: drop the last partial batch of each epoch.
        unroll: steps per graph submission (default 4).
        loss_options: ``weight`` (class weights) and ``ignore_index`` for cross_entropy.
        memory: how the activations the backward pass reads are kept: ``"spill"`` (in
            the workers' memory, spilled to their disks beyond the limit),
            ``"recompute"`` (forward segments of about √n nodes rebuilt in the backward
            pass from checkpoints, see :mod:`dfdl.training.passes.recompute`), or ``"auto"``: spill
            unless the plan's estimate spills, then recompute the segments that are
            faster to recompute than to spill (rates measured on the workers). The
            numbers are the same bit for bit whichever is chosen.

    Returns:
        :class:`TrainResult`.

    Example:
        >>> result = dfdl.train("mlp.onnx", data=(X, y), loss="cross_entropy",  # doctest: +SKIP
        ...                     optimizer=dfdl.optim.SGD(lr=0.1, momentum=0.9))
        >>> result.save("mlp-trained.onnx")                                       # doctest: +SKIP
    """
    from dfdl import optim

    t_start = time.perf_counter()
    timings = {"setup_s": 0.0, "graph_s": 0.0, "submit_s": 0.0, "wait_s": 0.0}
    optimizer = optimizer if optimizer is not None else optim.SGD(lr=0.01)
    options = dict(loss_options or {})
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, not {batch_size!r}")
    if not isinstance(epochs, int) or epochs < 1:
        raise ConfigError(f"epochs must be a positive integer, not {epochs!r}")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ConfigError(f"steps must be a positive integer, not {steps!r}")
    if checkpoint_every is not None and checkpoint_dir is None:
        raise ConfigError("checkpoint_every needs checkpoint_dir")
    if memory not in MODES:
        raise ConfigError(f"memory must be one of {', '.join(map(repr, MODES))}, not {memory!r}")
    proto = load_model(model)
    graph = to_ir(proto)
    X, y = _split_data(data, "data")
    if len(graph.inputs) != 1:
        raise ConfigError(
            f"dfdl.train supports models with one data input; this one has {graph.inputs}"
        )
    n = len(X)
    if n == 0:
        raise DataError("data has no samples")
    model_loss = loss in graph.outputs
    if not model_loss and y is None:
        raise DataError(f"loss {loss!r} needs labels: pass data=(X, y)")
    cache: dict[int, StepPlan] = {}
    cores = total_threads(client) if client is not None else default_workers()
    limit = worker_memory_limit(client) if client is not None else embedded_memory_limit()
    # tiles fit between the workers' own pause line and the headroom (graph.estimate)
    workers = Workers(cores=cores, memory_limit=limit, thresholds=worker_memory_config(client))

    def spilling_plan(b: int) -> StepPlan:
        if b not in cache:
            types = {graph.inputs[0]: TensorType((b, *X.shape[1:]), X.dtype)}
            labels = None if y is None else TensorType((b, *y.shape[1:]), y.dtype)
            tg = build_training_graph(
                graph,
                types,
                loss=loss,
                optimizer=optimizer,
                labels=labels,
                frozen=frozen,
                seed=seed,
                loss_options=options,
            )
            cache[b] = training_plan(tg, tiles, workers)
        return cache[b]

    first = spilling_plan(min(batch_size, n))  # model/data mismatches raise here, before any task
    if y is not None and not model_loss:
        _check_labels(y, first.tg, loss, options)
    tg = first.tg
    start = 0
    values: dict[str, np.ndarray] = {}
    if resume:
        if checkpoint_dir is None:
            raise ConfigError("resume=True needs checkpoint_dir")
        found = checkpoint.load_latest(checkpoint_dir)
        if found is not None:
            start, values, _meta = found
    if not values:
        for p in tg.params + tg.buffers:
            values[p] = _initial(graph, p)
        for p in tg.params:
            for sname, v in zip(tg.states[p], optimizer.init_state(values[p])):
                values[sname] = v
    history: dict[str, list] = {"loss": []}
    per_epoch = steps_per_epoch(n, batch_size, drop_last)
    schedule = list(
        batch_plan(
            n,
            batch_size,
            epochs=epochs,
            steps=steps,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            start=start,
        )
    )
    total = start + len(schedule)
    # every step's lr from the schedule, so a bad schedule fails before any task
    feeds = {
        step: optimizer.step_feeds(step + 1, tg.scalars[0], tg.step_inputs)
        for step, _epoch, _idx in schedule
    }
    unroll = unroll or DEFAULT_UNROLL
    bar = _progress(progress, total, start)
    with connect(client) as c:
        chosen: dict[int, StepPlan] = {}

        nthreads = c.nthreads()
        on = replace(workers, processes=len(nthreads), threads=max(nthreads.values()))

        def plans(b: int) -> StepPlan:
            if b not in chosen:
                sp = choose_variant(spilling_plan(b), memory, on, lambda: cluster_speeds(c))
                chosen[b] = sp if FUSE_TASKS else replace(sp, fits=False)
            return chosen[b]

        first = plans(min(batch_size, n))
        carried = tg.carried()
        for k in tg.frozen:  # float initializers that stay constant are inputs of the graph
            if k in tg.graph.inputs:
                tg.graph.initializers.setdefault(k, _initial(graph, k))
        anchor = Anchor(start, {k: values[k] for k in carried})
        del values
        speed = Throughput()
        losses_by_step: dict[int, float] = {}
        validated: dict[int, dict[str, float]] = {}

        def on_loss(step: int, value: float) -> None:
            losses_by_step[step] = value
            reporter.step(step, value)
            if bar is not None:
                bar.update(1)
                shown = {"loss": f"{value:.4g}", "samples_s": f"{speed.add(batch_size):.0f}"}
                if collector.total[0]:
                    shown["spilled"] = format_bytes(collector.total[0])
                bar.set_postfix(shown)

        collector = LossCollector(c, on_loss, SpillMeter(c))
        anchors = AnchorPolicy()
        name = _model_name(model, proto)
        reporter = Reporter(
            c,
            f"{name}-{new_token()}",
            model=name,
            batch_size=batch_size,
            total=total,
            threads=cores,
        )
        timings["setup_s"] = time.perf_counter() - t_start

        def attempt() -> dict[str, np.ndarray]:
            """Train from the anchor to the end of the schedule; the final carried values."""
            nonlocal anchor
            state = ClusterState.scatter(c, anchor.arrays, first.plan.chunks)
            token = new_token()
            reporter.token(token)
            constants = Constants(c)
            group: list[StepInput] = []
            for i, (step, epoch, idx) in enumerate(schedule):
                if step < anchor.step:
                    continue
                arrays = {graph.inputs[0]: X.batch(idx)}
                if y is not None and not model_loss:
                    arrays[tg.labels] = y.batch(idx)
                group.append(StepInput(step, arrays, feeds[step]))
                last = i == len(schedule) - 1
                ckpt_now = checkpoint_every and (step + 1) % checkpoint_every == 0
                epoch_end = (step + 1) % per_epoch == 0
                if len(group) >= unroll or last or ckpt_now or (epoch_end and validation):
                    state, losses = run_steps(
                        c, plans, group, state, constants, seed=seed, token=token, timings=timings
                    )
                    collector.add(losses)
                    t_wait = time.perf_counter()
                    collector.collect(keep_last=len(losses))
                    reporter.flush()
                    timings["wait_s"] += time.perf_counter() - t_wait
                    group = []
                    if ckpt_now:
                        collector.collect()
                        arrays_now = state.gather(c, tg.graph.types)
                        checkpoint.save(
                            checkpoint_dir,
                            step + 1,
                            arrays_now,
                            {"seed": seed, "batch_size": batch_size},
                        )
                        anchor = Anchor(step + 1, {k: arrays_now[k] for k in carried})
                    elif not last and anchors.due():
                        t_anchor = time.perf_counter()
                        collector.collect()
                        anchor = Anchor(step + 1, state.gather(c, tg.graph.types))
                        anchors.taken(time.perf_counter() - t_anchor)
                    if epoch_end and validation is not None:
                        collector.collect()
                        validated[epoch] = evaluate(
                            c,
                            graph,
                            state,
                            tg,
                            validation,
                            loss,
                            options,
                            batch_size,
                            tiles,
                            cores,
                            limit,
                        )
                        reporter.validation(step + 1, validated[epoch])
            t_wait = time.perf_counter()
            collector.collect(final=True)
            out = state.gather(c, tg.graph.types)
            timings["wait_s"] += time.perf_counter() - t_wait
            return out

        rollbacks = 0
        while True:
            try:
                with frozen_heaps(c):
                    final = attempt()
                reporter.end("done")
                break
            except Exception as e:  # noqa: BLE001 - only lost data is retried
                if not is_lost_data(e) or rollbacks >= MAX_ROLLBACKS:
                    reporter.end("failed")
                if isinstance(e, KilledWorker):
                    raise killed_worker_error(e) from e
                if not is_lost_data(e):
                    raise
                rollbacks += 1
                if rollbacks > MAX_ROLLBACKS:
                    raise rollback_error(e, rollbacks) from e
                logger.warning(
                    "dfdl: a worker was lost with data Dask cannot rebuild (%s); replaying "
                    "from step %d (rollback %d of at most %d)",
                    e,
                    anchor.step,
                    rollbacks,
                    MAX_ROLLBACKS,
                )
                collector.drop_pending()
                reporter.rollback(anchor.step)
                if bar is not None:
                    bar.n = anchor.step
                    bar.refresh()
                wait_for_workers(c)
    if bar is not None:
        bar.close()
    done = sorted(losses_by_step)
    spilled = [collector.spilled.get(s, (0, 0)) for s in done]
    history["loss"] = [losses_by_step[s] for s in done]
    history["spilled_bytes"] = [written for written, _ in spilled]
    history["unspilled_bytes"] = [read for _, read in spilled]
    for epoch in sorted(validated):
        for k, v in validated[epoch].items():
            history.setdefault(f"val_{k}", []).append(v)
    params = {k: final[k] for k in tg.params + tg.buffers}
    timings["total_s"] = time.perf_counter() - t_start
    return TrainResult(
        history,
        _trained_model(proto, params),
        params,
        timings,
        first.plan.tiles,
        sorted(set(first.tg.recomputed.values())),
        rollbacks,
        bool(chosen) and all(sp.fits for sp in chosen.values()),
    )


def _model_name(model, proto: onnx.ModelProto) -> str:
    """A short name for the dashboard: the file's stem, else the ONNX graph's name."""
    if isinstance(model, str) or hasattr(model, "__fspath__"):
        from pathlib import Path

        return Path(model).stem
    return proto.graph.name or "model"


def _initial(graph, name: str) -> np.ndarray:
    return np.array(graph.initializers[name], copy=True)


def _progress(progress: bool, total: int, start: int):
    if not progress or not sys.stderr.isatty():
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, unit="step", desc="dfdl.train")


def _trained_model(proto: onnx.ModelProto, params: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    out = copy.deepcopy(proto)
    for t in out.graph.initializer:
        if t.name in params:
            t.CopyFrom(numpy_helper.from_array(np.asarray(params[t.name]), t.name))
    return out


def evaluate(
    client, graph, state, tg, validation, loss, options, batch_size, tiles, cores, memory=None
):
    """Validation loss (and accuracy for class labels) with the current weights."""
    from dfdl.runtime.executor import execute
    from dfdl.training.autodiff import GradBuilder
    from dfdl.training.losses import build_loss

    Xv, yv = _split_data(validation, "validation")
    if isinstance(tiles, Mapping):  # inference has no BatchNorm statistics to split
        tiles = {k: v for k, v in tiles.items() if k != SPLIT_NORMS}
    current = state.gather(client, tg.graph.types)
    g = graph.copy()
    for k in tg.params + tg.buffers:
        g.initializers[k] = current[k]
    total_loss, correct, count = 0.0, 0, 0
    out_name = g.outputs[0]
    for i in range(0, len(Xv), batch_size):
        xb = Xv.take(np.arange(i, min(i + batch_size, len(Xv))))
        feeds = {g.inputs[0]: xb}
        types = {g.inputs[0]: TensorType(xb.shape, xb.dtype)}
        bg = bind(g, types)
        if yv is not None and loss not in g.outputs:
            yb = yv.take(np.arange(i, i + len(xb)))
            bg.inputs.append("labels")
            bg.types["labels"] = TensorType(yb.shape, yb.dtype)
            feeds["labels"] = yb
            lname = build_loss(GradBuilder(bg, phase="loss"), loss, [out_name], "labels", **options)
            bg.outputs = [lname, out_name]
        out = execute(make_plan(bg, tiles, cores=cores, memory_limit=memory), feeds, client)
        if yv is not None and loss not in g.outputs:
            total_loss += float(out[bg.outputs[0]]) * len(xb)
            if loss in ("cross_entropy",) and out[out_name].ndim >= 2:
                correct += int((out[out_name].argmax(axis=1) == yb).sum())
        count += len(xb)
    metrics = {"loss": total_loss / count}
    if loss == "cross_entropy":
        metrics["accuracy"] = correct / count
    return metrics


def training_graph(
    model: ModelLike,
    loss: str = "cross_entropy",
    optimizer=None,
    *,
    batch_size: int = 1,
    labels_shape: tuple[int, ...] | None = None,
    labels_dtype=np.int64,
    frozen: Iterable[str] = (),
) -> onnx.ModelProto:
    """The training graph (forward, loss, backward, update) as an ONNX model.

    The model passes ``onnx.checker``; dfdl's backward ops live in the ``dfdl`` domain,
    declared in the opset imports. Open it in a model viewer (Netron) to see what
    ``dfdl.train`` runs.

    Example:
        >>> m = dfdl.training_graph(dfdl.models.mlp(), "cross_entropy",  # doctest: +SKIP
        ...                         dfdl.optim.SGD(lr=0.1, momentum=0.9))
    """
    from dfdl import optim

    optimizer = optimizer if optimizer is not None else optim.SGD(lr=0.01)
    graph = to_ir(load_model(model))
    declared, dtype = graph.declared[graph.inputs[0]]
    shape = tuple(batch_size if not isinstance(d, int) else d for d in declared)
    labels = None
    if loss not in graph.outputs:
        labels = TensorType(labels_shape or (batch_size,), labels_dtype)
    tg = build_training_graph(
        graph,
        {graph.inputs[0]: TensorType(shape, dtype)},
        loss=loss,
        optimizer=optimizer,
        labels=labels,
        frozen=frozen,
    )
    m = from_ir(tg.graph, symbolic=False)
    onnx.checker.check_model(m)
    return m
