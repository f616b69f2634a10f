"""dfdl: train deep neural networks given as ONNX on Dask clusters, without memory limits.

The public API is what ``import dfdl`` gives: :func:`train`, :func:`run`, :func:`plan`,
:func:`load`, :func:`training_graph`, :class:`TrainResult`, :class:`EngineOptions`,
:func:`tune` (with :mod:`dfdl.space` and :class:`TuneResult`), :func:`LocalCluster`,
:mod:`dfdl.cluster`, :mod:`dfdl.optim`, :mod:`dfdl.errors` and the ONNX backend
:data:`backend`; everything else is internal. Importing dfdl starts no cluster, does not
load MKL (:mod:`dfdl.ops.cpu.blas`) and does not import Optuna.

Example:
    >>> import dfdl, dfdl.models, numpy as np
    >>> out = dfdl.run(dfdl.models.mlp((4, 8, 3)), {"x": np.ones((2, 4), "float32")})
"""

from __future__ import annotations

# first: under ``python -m dfdl``, a Ctrl-C while the imports below run is one line
from dfdl import interrupts  # noqa: F401

# isort: split
from dfdl import cluster, errors, optim, space
from dfdl.api import load, plan, run, train, training_graph
from dfdl.onnx_backend import DfdlBackend
from dfdl.runtime.cluster import local_cluster as LocalCluster
from dfdl.runtime.result import TrainResult
from dfdl.runtime.session import EngineOptions
from dfdl.tuning import TuneResult, tune

#: the ONNX backend (``onnx.backend.test.BackendTest(dfdl.backend, __name__)``)
backend = DfdlBackend

__version__ = "0.1.0"

__all__ = [
    "EngineOptions",
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
    "space",
    "training_graph",
    "tune",
    "TuneResult",
    "__version__",
]
