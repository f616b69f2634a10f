"""dfdl as an ONNX backend, so ONNX's own backend test suite runs through dfdl.

:class:`DfdlBackend` (``dfdl.backend``) follows ``onnx.backend.base.Backend``:
``prepare(model)`` loads and checks the model, and the :class:`DfdlRep` it returns
plans each call for its inputs' shapes (:func:`dfdl.plan.compile.inference_plan`) and
runs it as tiled tasks, returning the outputs in graph order: on the ``client=`` given
to ``prepare``, or on one embedded cluster that every backend call of the process
shares (:func:`shared_client`). Only the CPU device is supported;
:meth:`DfdlBackend.with_tiles` fixes a tiling for test suites.

Example:
    >>> import onnx.backend.test
    >>> import dfdl
    >>> suite = onnx.backend.test.BackendTest(dfdl.backend, __name__)  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import threading

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from dfdl.api import feed_types, load
from dfdl.plan.compile import Workers, inference_plan
from dfdl.runtime.cluster import local_cluster, total_threads
from dfdl.runtime.executor import execute

_lock = threading.Lock()
_shared: dict = {}


def shared_client():
    """A lazily started embedded cluster, reused by every backend call of the process."""
    with _lock:
        if "client" not in _shared:
            from distributed import Client

            cluster = local_cluster(2)
            _shared["cluster"] = cluster
            _shared["client"] = Client(cluster)
            atexit.register(close_shared_client)
        return _shared["client"]


def close_shared_client() -> None:
    """Shut the shared backend cluster down (also registered at exit)."""
    with _lock:
        client = _shared.pop("client", None)
        cluster = _shared.pop("cluster", None)
    if client is not None:
        client.close()
    if cluster is not None:
        cluster.close()


class DfdlRep(BackendRep):
    """A prepared model: ``run(list_of_arrays)`` returns outputs in graph order."""

    def __init__(self, model: onnx.ModelProto, tiles=None, client=None):
        self.graph = load(model)
        self.tiles = tiles
        self.client = client

    def run(self, inputs, **kwargs) -> tuple:
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if not isinstance(inputs, list | tuple):
                inputs = [inputs]
            feeds = dict(zip(self.graph.inputs, inputs))
        feeds = {k: np.asarray(v) for k, v in feeds.items()}
        client = self.client or shared_client()
        types = feed_types(self.graph, feeds)
        workers = Workers(cores=total_threads(client))
        plan = inference_plan(self.graph, types, self.tiles, workers, values=feeds)
        out = execute(plan, feeds, client)
        return tuple(out[name] for name in self.graph.outputs)


class DfdlBackend(Backend):
    """ONNX backend running models through dfdl's planner and lowering on Dask.

    ``prepare(model, device, tiles=..., client=...)`` accepts dfdl's ``tiles`` argument
    and a Dask client; :meth:`with_tiles` makes a backend class with a fixed tiling (for
    test suites). The class attribute ``client`` (None: :func:`shared_client`) is the
    client of every ``prepare`` that names none.
    """

    tiles = None
    client = None

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs):
        super().prepare(model, device, **kwargs)
        tiles, client = kwargs.get("tiles", cls.tiles), kwargs.get("client", cls.client)
        return DfdlRep(model, tiles=tiles, client=client)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def with_tiles(cls, tiles) -> type[DfdlBackend]:
        """A backend class whose prepared models always use ``tiles``."""
        return type(f"DfdlBackend_{tiles}", (cls,), {"tiles": tiles})
