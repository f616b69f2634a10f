"""The per-op tests' runner: a model planned as ``dfdl.run`` plans it, its tile tasks run
by dask's synchronous scheduler in the test process.

The per-op tests run thousands of graphs of a few tiny tasks each; on a Dask cluster,
even one inside the test process, the scheduler's and workers' bookkeeping was more than
half of their time. What they check (shape and tile rules, kernels, VJPs) is in the
tasks, which are the ones :func:`dfdl.runtime.executor.execute` submits; running ops on a
cluster is checked by ONNX's node tests through ``dfdl.backend`` (``tests/test_backend_nodes.py``)
and by the training tests.
"""

from __future__ import annotations

import dask
import numpy as np

from dfdl.api import feed_types, load
from dfdl.plan.compile import Workers, inference_plan
from dfdl.runtime.executor import assemble, lowered

#: the threads the plans are made for (those of ``tests/conftest.py``'s two workers)
CORES = 2


def run_plan(plan, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every graph output of one forward pass of ``plan``, tasks run in this process."""
    p = lowered(plan, feeds)
    values = dict(zip(p.want, dask.get(p.dsk, p.want))) if p.want else {}
    return assemble(plan, feeds, p, values)


def run_model(model, inputs: dict, tiles=None) -> dict[str, np.ndarray]:
    """``dfdl.run(model, inputs, tiles=tiles)`` on a cluster of :data:`CORES` threads,
    with the tasks run by dask's synchronous scheduler."""
    graph = load(model)
    types = feed_types(graph, inputs)
    feeds = {k: np.asarray(v) for k, v in inputs.items()}
    plan = inference_plan(graph, types, tiles, Workers(cores=CORES), values=feeds)
    return run_plan(plan, feeds)
