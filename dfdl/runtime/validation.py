"""Validation during training: the loss (and accuracy) of held-out data, in inference mode.

:func:`evaluate` runs the model with the current weights over ``(X_val, y_val)`` in
batches of ``batch_size``, as inference passes on the cluster
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

from collections.abc import Mapping

import numpy as np

from dfdl.data.checks import split_data
from dfdl.ir.bind import bind
from dfdl.ir.graph import Graph
from dfdl.ops.registry import TensorType
from dfdl.plan.compile import SPLIT_NORMS
from dfdl.plan.tiling import make_plan
from dfdl.runtime.executor import execute
from dfdl.training.autodiff import GradBuilder
from dfdl.training.losses import build_loss


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
        ``{"loss": mean loss}``, with ``"accuracy"`` for cross-entropy.

    Example:
        >>> evaluate(client, graph, weights, (X_val, y_val), "cross_entropy", {}, 64,
        ...          None, cores=2)  # doctest: +SKIP
        {'loss': 0.31, 'accuracy': 0.92}
    """
    Xv, yv = split_data(validation, "validation")
    if isinstance(tiles, Mapping):  # inference has no BatchNorm statistics to split
        tiles = {k: v for k, v in tiles.items() if k != SPLIT_NORMS}
    g = graph.copy()
    g.initializers.update(weights)
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
