"""dfdl's public entry points: :func:`train`, :func:`training_graph`, :func:`run`,
:func:`plan` and :func:`load`.

Each is the pipeline read top to bottom: load and check the model (:mod:`dfdl.ir`),
build (:mod:`dfdl.training`) and plan (:mod:`dfdl.plan`), then run on a cluster
(:mod:`dfdl.runtime`): the client given, or the embedded one. An unusable model or
argument is a :class:`dfdl.errors.DfdlError` raised before any task reaches a
scheduler. Runs are deterministic: the same model, data, arguments and ``tiles`` give
the same values bit for bit (on the same BLAS library, :mod:`dfdl.ops.cpu.blas`).

Example:
    >>> import dfdl, dfdl.models, numpy as np
    >>> out = dfdl.run(dfdl.models.mlp((4, 8, 3)), {"x": np.ones((2, 4), "float32")})
    >>> out["logits"].shape
    (2, 3)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import onnx

from dfdl.errors import ShapeError
from dfdl.ir.graph import Graph
from dfdl.ir.onnx_io import LARGE_MODEL_BYTES, ModelLike, from_ir, load_model, tensor_bytes, to_ir
from dfdl.ir.torch_folds import unfold
from dfdl.ops.registry import TensorType
from dfdl.plan.compile import Workers, inference_plan
from dfdl.plan.tiling import Plan
from dfdl.runtime.cluster import (
    connect,
    default_workers,
    parse_memory,
    total_threads,
    worker_memory_config,
)
from dfdl.runtime.executor import execute
from dfdl.runtime.result import TrainResult
from dfdl.runtime.session import EngineOptions, EpochEnd, TrainingSession, train_config
from dfdl.training.graph import build_training_graph
from dfdl.training.optimizers import SGD


def load(model: ModelLike) -> Graph:
    """Load, check and convert a model (path, bytes or ModelProto) to dfdl's IR."""
    return to_ir(load_model(model))


def _input_types(
    graph: Graph, batch_size: int | None, dims: Mapping[str, int] | None
) -> dict[str, TensorType]:
    dims = dict(dims or {})
    out = {}
    for name in graph.inputs:
        declared, dtype = graph.declared[name]
        if declared is None:
            raise ShapeError(
                f"input {name!r} has no declared shape; pass an example array to dfdl.run",
                name=name,
            )
        shape = []
        for axis, d in enumerate(declared):
            if isinstance(d, int):
                shape.append(d)
            elif isinstance(d, str) and d in dims:
                shape.append(int(dims[d]))
            elif axis == 0 and batch_size is not None:
                shape.append(int(batch_size))
            else:
                raise ShapeError(
                    f"input {name!r}: axis {axis} ({d!r}) is not fixed; pass batch_size= "
                    f"for the batch axis or dims={{{d!r}: N}}",
                    name=name,
                    expected=declared,
                )
        out[name] = TensorType(tuple(shape), dtype)
    return out


def plan(
    model: ModelLike,
    batch_size: int | None = None,
    tiles=None,
    *,
    dims: Mapping[str, int] | None = None,
    workers: int | None = None,
    memory_limit: int | str | None = None,
) -> Plan:
    """Plan how ``model`` would be tiled, without running anything.

    Args:
        model: ONNX path, bytes or ModelProto.
        batch_size: size of axis 0 of every input whose axis 0 is symbolic.
        tiles: None (automatic), "uneven", or ``{"batch": b, "model": m, "space": s}``
            (``space``: slabs along the first spatial axis of convolutions/pools;
            optionally ``"min_weight_tile"``: bytes below which a weight's model tiles
            keep its outputs' model axes whole, as the automatic tiles do).
        dims: sizes of other symbolic dimensions, e.g. ``{"seq": 256}``.
        workers: worker threads to plan for (default: this machine's cores).
        memory_limit: each worker's memory limit (bytes or a string like ``"1GiB"``);
            tiles are then chosen so every task fits a quarter of it, or
            :class:`~dfdl.errors.MemoryPlanError` is raised. None: unbounded.

    Returns:
        The :class:`~dfdl.plan.tiling.Plan`; ``print(plan.summary())`` shows it.

    Example:
        >>> import dfdl, dfdl.models
        >>> p = dfdl.plan(dfdl.models.mlp((784, 256, 10)), batch_size=64)
        >>> p.n_tasks() > 0
        True
    """
    graph = load(model)
    on = Workers(
        cores=workers or default_workers(),
        memory_limit=parse_memory(memory_limit),
        thresholds=worker_memory_config(),  # the thresholds of dfdl's clusters
    )
    return inference_plan(graph, _input_types(graph, batch_size, dims), tiles, on)


def feed_types(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, TensorType]:
    """Types of the given input arrays; ShapeError for unknown or missing names."""
    if not isinstance(inputs, Mapping):
        raise ShapeError(
            f"inputs must be a dict {{name: array}} (the model's inputs are {graph.inputs})"
        )
    return {k: TensorType(np.shape(v), np.asarray(v).dtype) for k, v in inputs.items()}


def run(
    model: ModelLike,
    inputs: Mapping[str, np.ndarray],
    client=None,
    tiles=None,
) -> dict[str, np.ndarray]:
    """Run inference of an ONNX model on a Dask cluster.

    The model is checked, bound to the inputs' shapes and planned before anything is
    submitted: a bad model, an unsupported op or a mismatched input raises a
    :mod:`dfdl.errors` exception with no task sent.

    Args:
        model: ONNX path, bytes or ModelProto.
        inputs: ``{input name: numpy array}``.
        client: a ``distributed.Client``; None uses the embedded cluster (one worker
            process with a thread per core, started at the first call in a process and
            reused by later calls).
        tiles: None (automatic), "uneven", or ``{"batch": b, "model": m, "space": s}``
            (``space``: slabs along the first spatial axis of convolutions/pools;
            optionally ``"min_weight_tile"``: bytes below which a weight's model tiles
            keep its outputs' model axes whole, as the automatic tiles do).

    Returns:
        ``{output name: numpy array}`` for every graph output.

    Example:
        >>> import dfdl, dfdl.models, numpy as np
        >>> out = dfdl.run(dfdl.models.mlp((4, 8, 3)), {"x": np.ones((2, 4), "float32")})
        >>> out["logits"].shape
        (2, 3)
    """
    graph = load(model)
    types = feed_types(graph, inputs)  # ShapeError (not AttributeError) for a non-dict
    feeds = {k: np.asarray(v) for k, v in inputs.items()}
    cores = total_threads(client) if client is not None else default_workers()
    p = inference_plan(graph, types, tiles, Workers(cores=cores), values=feeds)
    with connect(client) as c:
        return execute(p, feeds, c)


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
    resume: bool | str = False,
    frozen: Iterable[str] = (),
    drop_last: bool = False,
    unroll: int | None = None,
    loss_options: Mapping[str, Any] | None = None,
    memory: str = "auto",
    engine: EngineOptions | None = None,
    on_epoch: Callable[[EpochEnd], bool | None] | None = None,
    weights_dir: str | os.PathLike | None = None,
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
        client: a ``distributed.Client``; None uses the embedded cluster (started at
            the first call in a process, reused by later calls).
        tiles: None (automatic), "uneven", or ``{"batch": b, "model": m, "space": s}``
            (``space``: slabs along the first spatial axis of convolutions/pools;
            ``"split_norms": 1`` tiles BatchNormalization over batch and space too;
            ``"min_weight_tile"``: bytes below which a weight's model tiles keep its
            outputs' model axes whole, as the automatic tiles do).
        checkpoint_dir: where checkpoints go; with ``checkpoint_every`` steps. Created if
            missing and checked writable before any cluster starts.
        checkpoint_every: steps between checkpoints (a positive integer; None: none).
        progress: a tqdm bar on a terminal (steps, loss, samples/s); where stderr is
            not a terminal, the same as a line every 30 s.
        resume: True: continue from the latest checkpoint in ``checkpoint_dir`` (an
            error if there is none); ``"auto"``: continue if there is one, else start
            from step 0. The checkpoint must be readable and written by a run with the
            same model, optimizer, loss, batch size, seed and data: else a
            :class:`~dfdl.errors.CheckpointError` naming the first difference, raised
            before any cluster starts.
        frozen: initializer names that must not train.
        drop_last: drop the last partial batch of each epoch.
        unroll: steps per graph submission (default 4).
        loss_options: ``weight`` (class weights) and ``ignore_index`` for cross_entropy.
        memory: how the activations the backward pass reads are kept: ``"spill"`` (in
            the workers' memory, spilled to their disks beyond the limit),
            ``"recompute"`` (forward segments of about √n nodes rebuilt in the backward
            pass from checkpoints, see :mod:`dfdl.training.passes.recompute`), or
            ``"auto"``: spill unless the plan's estimate spills, then recompute the
            segments that are faster to recompute than to spill (rates measured on the
            workers). The numbers are the same bit for bit whichever is chosen.
        engine: the engine's choices for measurements
            (:class:`dfdl.runtime.session.EngineOptions`); the defaults are the measured
            best and no choice changes a result.
        on_epoch: called at the end of every epoch (after its validation) with an
            :class:`~dfdl.runtime.session.EpochEnd` (epoch, step, the epoch's losses, the
            validation metrics); returning True stops training there, and the result
            holds the weights after that epoch (``result.stopped_epoch`` says which).
            :func:`dfdl.tune` reports to its pruner this way. It is called again for an
            epoch replayed after a rollback or a resume from an earlier checkpoint.
        weights_dir: a folder this process and every worker can read and write (a
            shared filesystem on a cluster): the weights then never pass through this
            process. The workers read their tiles of a model file's external data
            themselves, make the optimizer state's tiles, and write the trained
            weights (and the anchors a lost worker rolls back to) into a new folder
            in it, one ``.npy`` file per tensor; the result's ``params`` map those
            files and its ``save`` copies them a block at a time. Checkpoints are then
            folders of such files the workers write, and resuming reads them the same
            way, as do the validation passes. For models larger than this process's
            memory (see ``docs/user/memory.md``).

    Returns:
        :class:`~dfdl.runtime.result.TrainResult`.

    Example:
        >>> result = dfdl.train("mlp.onnx", data=(X, y), loss="cross_entropy",  # doctest: +SKIP
        ...                     optimizer=dfdl.optim.SGD(lr=0.1, momentum=0.9))
        >>> result.save("mlp-trained.onnx")                                       # doctest: +SKIP
    """
    config = train_config(
        loss=loss,
        optimizer=optimizer,
        batch_size=batch_size,
        epochs=epochs,
        steps=steps,
        shuffle=shuffle,
        seed=seed,
        tiles=tiles,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        progress=progress,
        resume=resume,
        frozen=frozen,
        drop_last=drop_last,
        unroll=unroll,
        loss_options=loss_options,
        memory=memory,
        engine=engine,
        on_epoch=on_epoch,
        weights_dir=weights_dir,
    )
    return TrainingSession(model, data, config, validation).run(client)


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
    optimizer = optimizer if optimizer is not None else SGD(lr=0.01)
    graph = to_ir(unfold(load_model(model)))  # as dfdl.train reads it
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
    if tensor_bytes(m) <= LARGE_MODEL_BYTES:  # the in-memory checker stops at 2 GiB
        onnx.checker.check_model(m)
    return m
