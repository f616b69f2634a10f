"""Validation during training: the loss (and accuracy) of held-out data, in inference mode.

:func:`check_validation` checks ``(X_val, y_val)`` against the model as the training
data are checked (sample counts, the input's shape and dtype, the labels' shape, dtype
and class range, the inference plan), before any cluster starts. :func:`evaluate` runs
the model with the current weights over ``(X_val, y_val)`` in batches of
``batch_size``, as inference passes on the cluster
(:func:`dfdl.runtime.executor.execute`), with the training loss appended to the graph,
and returns the mean loss per sample (and the accuracy for cross-entropy). It reads
the weights and never changes them; BatchNorm runs in inference mode, on its running
statistics.

Example:
    >>> evaluate(client, graph, weights, (X_val, y_val), "cross_entropy", {}, 64,
    ...          None, cores=2)  # doctest: +SKIP
    {'loss': 0.31, 'accuracy': 0.92}
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from dfdl.data.checks import check_labels, split_data
from dfdl.data.sources import ArraySource
from dfdl.errors import DataError, DfdlError, ShapeError
from dfdl.ir.bind import bind
from dfdl.ir.graph import Graph
from dfdl.ops.registry import TensorType
from dfdl.plan.compile import SPLIT_NORMS
from dfdl.plan.tiling import make_plan
from dfdl.runtime.executor import execute
from dfdl.training.autodiff import GradBuilder
from dfdl.training.losses import build_loss, classes_last, label_classes

#: the labels' input name in a validation pass's graph
LABELS = "labels"


def check_validation(
    graph: Graph,
    validation,
    loss: str,
    options: Mapping,
    batch_size: int,
    tiles,
    cores: int,
    memory: int | None = None,
) -> None:
    """Check validation data against the model as :func:`dfdl.train` checks its training
    data, so that a mismatch fails before any cluster starts, not after the first epoch.

    Args:
        graph: the model's IR (unbound, inference form).
        validation: ``(X_val, y_val)`` (or ``X_val`` when ``loss`` is a model output).
        loss, options: the training loss and its options.
        batch_size: samples per inference pass.
        tiles, cores, memory: the tiling the passes are planned with.

    Raises:
        DataError: unreadable data, X and y of different lengths, no samples, no labels
            for a loss that needs them, a class label out of range.
        ShapeError: X's shape or dtype is not what the model's input takes; the labels'
            shape or dtype does not fit the loss.
        MemoryPlanError / PlanError: the inference pass cannot be planned.

    Example:
        >>> X_val = np.zeros((10, 3, 8, 8), np.float32)  # the model takes (N, 3, 16, 16)
        >>> check_validation(graph, (X_val, y_val), "cross_entropy", {}, 64, None,
        ...                  cores=2)  # doctest: +SKIP
        Traceback (most recent call last):
        dfdl.errors.ShapeError: validation X has shape (10, 3, 8, 8); the model's input ...
    """
    Xv, yv = split_data(validation, "validation")
    model_loss = loss in graph.outputs
    if len(Xv) == 0:
        raise DataError("validation X has no samples: pass at least one, or validation=None")
    if yv is None and not model_loss:
        raise DataError(f"validation: loss {loss!r} needs labels: pass validation=(X_val, y_val)")
    _check_input(graph, Xv)
    batch = min(batch_size, len(Xv))
    xt = TensorType((batch, *Xv.shape[1:]), Xv.dtype)
    yt = None if yv is None or model_loss else TensorType((batch, *yv.shape[1:]), yv.dtype)
    try:
        bg = _pass_graph(graph, xt, yt, loss, options)
        make_plan(bg, _inference_tiles(tiles), cores=cores, memory_limit=memory)
    except DfdlError as e:
        e.args = (f"validation data: {e}", *e.args[1:])
        raise
    if yt is not None:
        classes = label_classes(bg.types[graph.outputs[0]], yt)
        check_labels(yv, loss, classes, options.get("ignore_index"), name="validation y")


def _check_input(graph: Graph, X: ArraySource) -> None:
    """X's dtype and per-sample shape against the model input's declaration."""
    name = graph.inputs[0]
    dims, dtype = graph.declared.get(name, (None, None))
    if dtype is not None and np.dtype(dtype) != X.dtype:
        raise ShapeError(
            f"validation X has dtype {X.dtype}; the model's input {name!r} takes "
            f"{np.dtype(dtype)}: convert it (X_val.astype({str(np.dtype(dtype))!r}))",
            name=name,
            expected=np.dtype(dtype),
            given=X.dtype,
        )
    if dims is None:
        return
    # axis 0 is the batch: a fixed batch size is checked by binding
    if len(dims) != len(X.shape) or any(
        isinstance(d, int) and d != g for d, g in zip(dims[1:], X.shape[1:])
    ):
        takes = ", ".join(str(d) if isinstance(d, int) else (d or "?") for d in dims)
        raise ShapeError(
            f"validation X has shape {X.shape}; the model's input {name!r} takes ({takes})",
            name=name,
            expected=tuple(dims),
            given=X.shape,
        )


def _inference_tiles(tiles):
    """``tiles`` for an inference pass: it has no BatchNorm statistics to split."""
    if isinstance(tiles, Mapping):
        return {k: v for k, v in tiles.items() if k != SPLIT_NORMS}
    return tiles


def _pass_graph(
    g: Graph, xt: TensorType, yt: TensorType | None, loss: str, options: Mapping
) -> Graph:
    """``g`` bound to a batch of type ``xt``; with labels of type ``yt``, the loss is
    appended and the outputs are ``[loss, model output]``."""
    bg = bind(g, {g.inputs[0]: xt})
    if yt is not None:
        bg.inputs.append(LABELS)
        bg.types[LABELS] = yt
        lname = build_loss(GradBuilder(bg, phase="loss"), loss, [g.outputs[0]], LABELS, **options)
        bg.outputs = [lname, g.outputs[0]]
    return bg


def evaluate(
    client,
    graph: Graph,
    weights: Mapping[str, np.ndarray],
    validation,
    loss: str,
    options: Mapping,
    batch_size: int,
    tiles,
    cores: int,
    memory: int | None = None,
) -> dict[str, float]:
    """Validation loss (and accuracy for class labels) of ``graph`` with ``weights``.

    Args:
        client: the cluster's client.
        graph: the model's IR (unbound, inference form).
        weights: the current parameters and BatchNorm statistics by name.
        validation: ``(X_val, y_val)`` (or ``X_val`` when ``loss`` is a model output).
        loss, options: the training loss and its options.
        batch_size: samples per inference pass.
        tiles, cores, memory: the tiling the passes are planned with.

    Returns:
        ``{"loss": mean loss}``, with ``"accuracy"`` for cross-entropy: the share of
        labels the largest score predicts, counted per label (per pixel of a
        segmentation, per token of a language model's ``(N, T, V)``), labels equal to
        ``ignore_index`` left out.

    Example:
        >>> evaluate(client, graph, weights, (X_val, y_val), "cross_entropy", {}, 64,
        ...          None, cores=2)  # doctest: +SKIP
        {'loss': 0.31, 'accuracy': 0.92}
    """
    Xv, yv = split_data(validation, "validation")
    tiles = _inference_tiles(tiles)
    g = graph.copy()
    g.initializers.update(weights)
    total_loss, correct, labelled, count = 0.0, 0, 0, 0
    ignore = options.get("ignore_index")
    out_name = g.outputs[0]
    for i in range(0, len(Xv), batch_size):
        xb = Xv.take(np.arange(i, min(i + batch_size, len(Xv))))
        feeds = {g.inputs[0]: xb}
        yb = None
        if yv is not None and loss not in g.outputs:
            yb = yv.take(np.arange(i, i + len(xb)))
            feeds[LABELS] = yb
        bg = _pass_graph(
            g,
            TensorType(xb.shape, xb.dtype),
            None if yb is None else TensorType(yb.shape, yb.dtype),
            loss,
            options,
        )
        out = execute(make_plan(bg, tiles, cores=cores, memory_limit=memory), feeds, client)
        if yb is not None:
            total_loss += float(out[bg.outputs[0]]) * len(xb)
            scores = out[out_name]
            if loss == "cross_entropy" and scores.ndim >= 2:
                as_type = TensorType(scores.shape, scores.dtype), TensorType(yb.shape, yb.dtype)
                predicted = scores.argmax(axis=-1 if classes_last(*as_type) else 1)
                kept = np.ones(yb.shape, bool) if ignore is None else yb != ignore
                correct += int(((predicted == yb) & kept).sum())
                labelled += int(kept.sum())
        elif loss in g.outputs:  # the model computes its own (mean) loss
            total_loss += float(out[loss]) * len(xb)
        count += len(xb)
    metrics = {"loss": total_loss / count}
    if loss == "cross_entropy":
        metrics["accuracy"] = correct / labelled if labelled else math.nan
    return metrics
