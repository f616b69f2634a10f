"""dfdl: train deep neural networks given as ONNX on Dask clusters, without memory limits.

Example:
    >>> import dfdl, dfdl.models, numpy as np
    >>> out = dfdl.run(dfdl.models.mlp((4, 8, 3)), {"x": np.ones((2, 4), "float32")})
"""

from __future__ import annotations

from dfdl import cluster, errors, optim
from dfdl.api import load, plan, run
from dfdl.onnx_backend import DfdlBackend
from dfdl.runtime.cluster import local_cluster as LocalCluster
from dfdl.runtime.session import TrainResult, train, training_graph

#: the ONNX backend (``onnx.backend.test.BackendTest(dfdl.backend, __name__)``)
backend = DfdlBackend

__version__ = "0.1.0"

__all__ = [
    "LocalCluster",
    "TrainResult",
    "backend",
    "cluster",
    "errors",
    "load",
    "optim",
    "plan",
    "run",
    "train",
    "training_graph",
    "__version__",
]
