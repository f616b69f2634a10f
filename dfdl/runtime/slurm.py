"""SLURM jobs as a Dask cluster (dask-jobqueue), with dfdl's worker settings.

:func:`slurm` (``dfdl.cluster.slurm``) starts ``jobs`` SLURM jobs of Dask workers, each
running ``processes`` worker processes that share the job's ``cores`` and ``memory``;
the scheduler runs in this process. Every worker gets dfdl's settings (the worker
preload :mod:`dfdl.runtime.worker_setup`, the malloc settings and the pause at the spill
line of :mod:`dfdl.runtime.cluster`) and a memory limit of ``memory / processes``, for
which dfdl plans tiles. :func:`parse_slurm` reads ``dfdl train --slurm`` settings.
Arguments are checked before any job is submitted (a :class:`~dfdl.errors.ConfigError`).

Example:
    >>> import dfdl
    >>> from distributed import Client
    >>> cluster = dfdl.cluster.slurm(jobs=4, cores=16, memory="64GiB",  # doctest: +SKIP
    ...                              walltime="02:00:00", queue="gpu", gpus=1)
    >>> result = dfdl.train("unet3d.onnx", data=(X, y), client=Client(cluster))  # doctest: +SKIP
"""

from __future__ import annotations

import re
import shlex
import signal
import sys
import threading
from collections.abc import Mapping, Sequence

from dfdl.errors import ConfigError
from dfdl.runtime.cluster import (
    WORKER_PRELOAD,
    parse_memory,
    worker_dask_config,
)

_WALLTIME = re.compile(r"^(\d+-)?\d+(:\d{2}){0,2}$")

#: keys of ``dfdl train --slurm``: name -> (slurm() argument, parser)
SLURM_KEYS = {
    "jobs": ("jobs", int),
    "cores": ("cores", int),
    "memory": ("memory", str),
    "processes": ("processes", int),
    "walltime": ("walltime", str),
    "queue": ("queue", str),
    "partition": ("queue", str),
    "account": ("account", str),
    "gpus": ("gpus", int),
    "local_directory": ("local_directory", str),
    "interface": ("interface", str),
}


def _worker_env(memory_limit: int, env: Mapping[str, str] | None) -> list[str]:
    """``export`` lines that give the job's workers dfdl's dask settings (the nanny's
    malloc thresholds scaled to the worker's limit) and the caller's ``env``."""
    import dask.config

    settings = {
        k: v
        for k, v in worker_dask_config(memory_limit).items()
        if not k.startswith("distributed.scheduler.")  # the scheduler runs here
    }
    # dask's own channel for a config that keeps the case of its keys (DASK_* variables
    # are lower-cased, which would break the MALLOC_* names)
    out = {"DASK_INTERNAL_INHERIT_CONFIG": dask.config.serialize(settings), **(env or {})}
    return [f"export {k}={shlex.quote(str(v))}" for k, v in out.items()]


def _slurm_cluster_class():
    """``dask_jobqueue.SLURMCluster``, imported without the SIGINT handler that importing
    dask-jobqueue installs (``sys.exit()``: a Ctrl-C would exit with status 0, not raise
    KeyboardInterrupt)."""
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if on_main else None
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        raise ConfigError(
            "dfdl.cluster.slurm needs dask-jobqueue: pip install 'dfdl[slurm]'"
        ) from None
    finally:
        if on_main and previous is not None and signal.getsignal(signal.SIGINT) is not previous:
            signal.signal(signal.SIGINT, previous)
    return SLURMCluster


def slurm(
    jobs: int = 1,
    *,
    cores: int,
    memory: str | int,
    processes: int = 1,
    walltime: str = "01:00:00",
    queue: str | None = None,
    account: str | None = None,
    gpus: int = 0,
    local_directory: str | None = None,
    interface: str | None = None,
    security=None,
    env: Mapping[str, str] | None = None,
    job_directives: Sequence[str] = (),
    **kwargs,
):
    """Start ``jobs`` SLURM jobs of Dask workers (a ``dask_jobqueue.SLURMCluster``).

    The scheduler runs in this process; each job runs ``processes`` worker processes
    that share its ``cores`` and ``memory``. Each worker's memory limit is
    ``memory / processes``, and dfdl plans tiles for that limit. Workers spill to
    ``local_directory``: give a node-local disk, such as ``"$TMPDIR"`` or ``/scratch``
    (expanded on the node).

    Args:
        jobs: SLURM jobs to submit now (0: none yet; ``cluster.scale(jobs=n)`` changes
            it later).
        cores: CPU cores per job (``--cpus-per-task``); the job's worker threads.
        memory: memory per job, e.g. ``"64GiB"`` (``--mem``).
        processes: worker processes per job (default 1: threads share tiles without
            transfers).
        walltime: ``--time``, as ``[D-]HH:MM:SS``.
        queue: partition (``--partition``).
        account: ``--account``.
        gpus: GPUs per job: ``--gres=gpu:N`` and a ``GPU`` worker resource.
        local_directory: where workers spill tiles.
        interface: network interface the workers (and scheduler) listen on, e.g. ``ib0``.
        security: a ``distributed.security.Security``, or True for temporary TLS
            credentials (files written where the jobs can read them).
        env: environment variables exported in the job script before the workers start.
        job_directives: extra ``#SBATCH`` options, e.g. ``["--qos=long"]``.
        **kwargs: passed to ``dask_jobqueue.SLURMCluster``.

    Returns:
        the ``SLURMCluster``. Use it as a context manager, or ``close()`` it: that
        cancels the jobs.

    Raises:
        ConfigError: a bad argument, or dask-jobqueue not installed.

    Example:
        >>> cluster = slurm(jobs=2, cores=8, memory="32GiB", queue="cpu")  # doctest: +SKIP
    """
    SLURMCluster = _slurm_cluster_class()
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 0:
        raise ConfigError(f"slurm: jobs must be a non-negative integer, not {jobs!r}")
    for name, value in (("cores", cores), ("processes", processes)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"slurm: {name} must be a positive integer, not {value!r}")
    if not isinstance(gpus, int) or gpus < 0:
        raise ConfigError(f"slurm: gpus must be a non-negative integer, not {gpus!r}")
    if processes > cores:
        raise ConfigError(f"slurm: processes ({processes}) cannot exceed cores ({cores})")
    job_bytes = parse_memory(memory, "memory")
    if job_bytes is None:
        raise ConfigError(f"slurm: memory must be a size such as '64GiB', not {memory!r}")
    if not _WALLTIME.match(str(walltime)):
        raise ConfigError(f"slurm: walltime must look like [D-]HH:MM:SS, not {walltime!r}")
    directives = list(job_directives)
    worker_args = list(kwargs.pop("worker_extra_args", []))
    if WORKER_PRELOAD not in worker_args:  # as in local_cluster
        worker_args += ["--preload", WORKER_PRELOAD]
    if gpus:
        directives.append(f"--gres=gpu:{gpus}")
        worker_args += ["--resources", f"GPU={gpus / processes:g}"]
    prologue = list(kwargs.pop("job_script_prologue", []))
    prologue += _worker_env(job_bytes // processes, env)
    if local_directory is not None:
        prologue.append(f"mkdir -p {local_directory}")
    kwargs.setdefault("python", sys.executable)
    import dfdl.runtime.dashboard  # noqa: F401 - the dfdl page, before the scheduler starts here

    cluster = SLURMCluster(
        cores=cores,
        memory=f"{job_bytes}B",
        processes=processes,
        walltime=str(walltime),
        queue=queue,
        account=account,
        local_directory=local_directory,
        interface=interface,
        security=security,
        job_extra_directives=directives,
        worker_extra_args=worker_args,
        job_script_prologue=prologue,
        **kwargs,
    )
    cluster.scale(jobs=jobs)
    return cluster


def parse_slurm(spec: str) -> dict:
    """``"jobs=4,cores=16,memory=64GiB,walltime=02:00:00"`` as :func:`slurm` arguments.

    Example:
        >>> parse_slurm("jobs=2,cores=8,memory=16GiB,partition=gpu")
        {'jobs': 2, 'cores': 8, 'memory': '16GiB', 'queue': 'gpu'}
    """
    out: dict = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in SLURM_KEYS:
            raise ConfigError(
                f"--slurm: {part!r} is not KEY=VALUE with KEY one of "
                f"{', '.join(k for k in SLURM_KEYS if k != 'partition')} (or partition)"
            )
        name, kind = SLURM_KEYS[key]
        try:
            out[name] = kind(value.strip())
        except ValueError:
            raise ConfigError(f"--slurm: {key} must be an integer, not {value!r}") from None
    for needed in ("cores", "memory"):
        if needed not in out:
            raise ConfigError(f"--slurm needs {needed}=..., e.g. jobs=2,cores=16,memory=64GiB")
    return out
