"""Clusters to train on: the embedded local one and SLURM jobs (the public names).

``dfdl.cluster.local`` is :func:`dfdl.runtime.cluster.local_cluster` (also
``dfdl.LocalCluster``) and ``dfdl.cluster.slurm`` is :func:`dfdl.runtime.slurm.slurm`:
both start Dask clusters whose workers run dfdl's worker setup, for
``dfdl.train(..., client=Client(cluster))``. :func:`parse_slurm` reads the command
line's ``--slurm`` settings (:data:`SLURM_KEYS`).

Example:
    >>> import dfdl
    >>> from distributed import Client
    >>> cluster = dfdl.cluster.slurm(jobs=4, cores=16, memory="64GiB",  # doctest: +SKIP
    ...                              walltime="02:00:00", queue="gpu", gpus=1)
    >>> result = dfdl.train("unet3d.onnx", data=(X, y), client=Client(cluster))  # doctest: +SKIP
"""

from __future__ import annotations

from dfdl.runtime.cluster import local_cluster as local
from dfdl.runtime.slurm import SLURM_KEYS, parse_slurm, slurm

__all__ = ["SLURM_KEYS", "local", "parse_slurm", "slurm"]
