"""Submitting a task graph to the cluster without hashing every task first.

``Client.get(dict, keys)`` wraps the graph in an expression whose name is a
deterministic hash of every task in it: each ``Task`` is tokenized, which pickles its
function and arguments. dfdl's graphs are new every step (fresh keys) and never
deduplicated by that name, so the hash buys nothing, and it runs in the process that
also hosts the embedded cluster's scheduler, holding the GIL the scheduler needs:
measured with ``py-spy`` on the ResNet benchmark, 45% of the training loop's CPU time
(about 76 ms per step) went to it. :func:`get` names the expression with a random
token instead and goes through the same public ``Client.get``.

It also keeps Dask's "Sending large graph" warning quiet: dfdl embeds batch tiles of up
to :data:`dfdl.runtime.trainer.EMBED_BYTES` in the graphs of several steps on purpose
(larger ones are scattered), so the warning's advice to load the data with Dask does
not apply to what a user wrote.

Example:
    >>> futures = get(client, dsk, ["y"])  # doctest: +SKIP
"""

from __future__ import annotations

import uuid
from collections.abc import Hashable, Mapping, Sequence

import dask

#: whether graphs are submitted under a random name (False: ``Client.get``'s own hash)
PRETOKENIZED = True


def _expression(dsk: Mapping):
    """``dsk`` as dask's low-level graph expression, named by a random token; the dict
    itself where this dask has no such expression (``Client.get`` wraps it then)."""
    try:
        from dask._expr import LLGExpr
    except ImportError:  # an older or newer dask: let the client hash it
        return dsk
    return LLGExpr(dsk, _determ_token=f"dfdl-{uuid.uuid4().hex}")


def get(client, dsk: Mapping, keys: Sequence[Hashable], sync: bool = False):
    """``client.get(dsk, keys, sync=sync)`` without hashing the graph's tasks.

    Args:
        client: a ``distributed.Client``.
        dsk: a task graph of ``dask.task_spec`` nodes.
        keys: the keys to compute.
        sync: wait for and return the results (else futures).

    Returns:
        What ``Client.get`` returns: futures (``sync=False``) or results, in the order
        of ``keys``.

    Example:
        >>> from dask.task_spec import Task  # doctest: +SKIP
        >>> get(client, {"y": Task("y", abs, -2)}, ["y"], sync=True)  # doctest: +SKIP
        [2]
    """
    graph = _expression(dsk) if PRETOKENIZED else dsk
    with dask.config.set({"distributed.admin.large-graph-warning-threshold": "1 TiB"}):
        return client.get(graph, list(keys), sync=sync)
