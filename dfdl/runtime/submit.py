"""Submitting a task graph to the cluster without hashing every task first.

``Client.get(dict, keys)`` names the graph by a deterministic hash of every task in it
(each ``Task`` is pickled to be tokenized), in the process that also hosts the embedded
cluster's scheduler. dfdl's graphs have fresh keys every step and are never
deduplicated by that name, so :func:`get` names the expression with a random token
instead and goes through the same public ``Client.get``. It also keeps Dask's "Sending
large graph" warning quiet: the batch tiles of up to
:data:`dfdl.runtime.trainer.EMBED_BYTES` embedded in step graphs are there on purpose.

Guarantees: the same keys, futures and results as ``client.get(dsk, keys)``; on a dask
without that expression type the client hashes the graph as before.

Example:
    >>> futures = get(client, dsk, ["y"])  # doctest: +SKIP

Measurements: ``docs/design/submit.md``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Hashable, Mapping, Sequence

import dask

_QUIET = threading.Lock()


def _expression(dsk: Mapping, workers: Mapping | None = None):
    """``dsk`` as dask's low-level graph expression, named by a random token, with the
    per-key worker restrictions ``workers``; the dict itself where this dask has no such
    expression (``Client.get`` wraps it then, and the restrictions are left out)."""
    try:
        from dask._expr import LLGExpr
    except ImportError:  # an older or newer dask: let the client hash it
        return dsk
    token = f"dfdl-{uuid.uuid4().hex}"
    if workers:
        return _Placed(dsk, dict(workers), _determ_token=token)
    return LLGExpr(dsk, _determ_token=token)


try:
    from dask._expr import LLGExpr as _LLGExpr
except ImportError:  # pragma: no cover - the fallback above never builds one
    _LLGExpr = object


class _Placed(_LLGExpr):
    """A low-level graph whose listed keys run on the given workers while they are there
    (loose restrictions: a task whose worker was lost runs elsewhere rather than never;
    a worker's share of a step then raises at once and the trainer replays)."""

    _parameters = ["dsk", "workers"]

    def __dask_annotations__(self):
        workers = self.operand("workers")
        return {"workers": workers, "allow_other_workers": dict.fromkeys(workers, True)}


def get(
    client,
    dsk: Mapping,
    keys: Sequence[Hashable],
    sync: bool = False,
    resources: Mapping | None = None,
    workers: Mapping[Hashable, Sequence[str]] | None = None,
):
    """``client.get(dsk, keys, sync=sync, resources=resources)`` without hashing the
    graph's tasks.

    Args:
        client: a ``distributed.Client``.
        dsk: a task graph of ``dask.task_spec`` nodes.
        keys: the keys to compute.
        sync: wait for and return the results (else futures).
        resources: worker resources every task needs (``{"GPU": 1}``), or None.
        workers: the workers each listed key should run on while they are there (loose
            restrictions), or None.

    Returns:
        What ``Client.get`` returns: futures (``sync=False``) or results, in the order
        of ``keys``.

    Example:
        >>> from dask.task_spec import Task  # doctest: +SKIP
        >>> get(client, {"y": Task("y", abs, -2)}, ["y"], sync=True)  # doctest: +SKIP
        [2]
    """
    graph = _expression(dsk, workers)
    # dask.config.set is process-wide: blocks that overlap in two threads (trials of
    # dfdl.tune) restore out of order and leave the value set, so they take turns and
    # hold it only while the graph is sent, not while it runs
    with _QUIET, dask.config.set({"distributed.admin.large-graph-warning-threshold": "1 TiB"}):
        futures = client.get(graph, list(keys), sync=False, resources=resources)
    if not sync:
        return futures
    try:
        return client.gather(futures)
    finally:
        for f in futures:
            f.release()
