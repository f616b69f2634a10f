"""Public entry points: :func:`plan` and :func:`run` (inference on a Dask cluster)."""

from __future__ import annotations

from collections.abc import Mapping

import dask
import numpy as np

from dfdl.errors import ShapeError
from dfdl.ir.bind import bind
from dfdl.ir.graph import Graph
from dfdl.ir.onnx_io import ModelLike, load_model, to_ir
from dfdl.ops.registry import TensorType
from dfdl.plan.tiling import Plan, make_plan
from dfdl.runtime.cluster import (
    connect,
    default_workers,
    parse_memory,
    total_threads,
    worker_memory_config,
)
from dfdl.runtime.executor import execute


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
    bound = bind(graph, _input_types(graph, batch_size, dims))
    with dask.config.set(worker_memory_config()):  # the thresholds of dfdl's clusters
        return make_plan(
            bound,
            tiles,
            cores=workers or default_workers(),
            memory_limit=parse_memory(memory_limit),
        )


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
        client: a ``distributed.Client``; None starts an embedded LocalCluster (one
            worker process per core) and shuts it down afterwards.
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
    bound = bind(graph, types, values=feeds)
    cores = total_threads(client) if client is not None else default_workers()
    p = make_plan(bound, tiles, cores=cores)
    with connect(client) as c:
        return execute(p, feeds, c)
