"""Task bodies pickled once, when the graph is built, instead of at every hop.

Dask pickles a task's body on the scheduler's event loop when it sends the task and
unpickles it on the worker's event loop before the task can start; a fused task or a
chain of gangs carries dozens of inner tasks, on every link of a step's longest chain.
:func:`pack_bodies` pickles each body of at least :data:`MIN_BYTES` once, in the
trainer, while earlier steps run. The task Dask sees is
``run_packed(blob, buffers, names, *inputs)``: its body is one ``bytes`` object, which
the scheduler and the worker copy instead of walking, and the worker's task thread
unpickles it just before it runs (:func:`run_packed`).

Guarantees: keys, dependencies and values stay the same; arrays travel beside the
pickle as protocol-5 buffers, not copied into it; a body the standard pickle cannot
take (a lambda inside) stays as it is.

Example:
    >>> from dask.task_spec import Task, TaskRef
    >>> g = {"x": Task("x", abs, -3), "y": Task("y", max, TaskRef("x"), 2)}
    >>> packed = pack_bodies(g, min_bytes=0)
    >>> packed["y"].func.__name__, sorted(packed["y"].dependencies)
    ('run_packed', ['x'])
    >>> packed["y"]({"x": 3})
    3

Measurements: ``docs/design/packed-bodies.md``.
"""

from __future__ import annotations

import pickle
import threading
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np
from dask.task_spec import Task, TaskRef

#: smallest pickled body (bytes) worth packing: below it the extra ``loads`` costs
#: about what the scheduler and the worker save
MIN_BYTES = 2048
#: bodies :func:`run_cached` keeps unpickled per process (the programs of one training's
#: group shapes: a handful)
CACHED_BODIES = 16
_LOADED: OrderedDict = OrderedDict()
_LOADED_LOCK = threading.Lock()


def pack_bodies(dsk: Mapping, min_bytes: int = MIN_BYTES) -> dict:
    """The graph with each task whose pickled body is at least ``min_bytes`` replaced
    by ``run_packed`` over that pickle (see the module docstring).

    Arrays inside a body (embedded batch tiles) stay out of its pickle, as protocol 5
    buffers that travel beside it the way Dask sends arrays: not copied into it. A body
    that the standard pickle cannot take (a lambda inside) stays as it is.

    Args:
        dsk: a Dask graph of ``dask.task_spec`` nodes.
        min_bytes: smaller bodies stay as they are.

    Returns:
        A new graph with the same keys, dependencies and values.

    Example:
        >>> pack_bodies({}) == {}
        True
    """
    out = {}
    for key, node in dsk.items():
        if type(node) is Task:
            buffers: list = []
            try:
                blob = pickle.dumps(node, protocol=5, buffer_callback=buffers.append)
            except (pickle.PicklingError, AttributeError, TypeError):
                blob = b""  # a lambda or local function inside: Dask's cloudpickle sends it
            if blob and len(blob) >= min_bytes:
                names = tuple(sorted(node.dependencies, key=str))
                node = Task(
                    key,
                    run_packed,
                    blob,
                    tuple(np.frombuffer(b.raw(), dtype=np.uint8) for b in buffers),
                    names,
                    *(TaskRef(d) for d in names),
                    _data_producer=node.data_producer,
                )
        out[key] = node
    return out


def run_packed(blob: bytes, buffers: tuple, names: tuple, *values):
    """Unpickles a task body packed by :func:`pack_bodies` (with its out-of-band
    ``buffers``) and runs it on ``values``, the values of its dependencies ``names``.

    Example:
        >>> run_packed(pickle.dumps(Task("y", abs, TaskRef("x"))), (), ("x",), -4)
        4
    """
    return pickle.loads(blob, buffers=buffers)(dict(zip(names, values, strict=True)))


def run_cached(token: str, blob: bytes, buffers: tuple, names: tuple, *values):
    """:func:`run_packed` for a body that runs again and again (a step program's, see
    :mod:`dfdl.taskgraph.program`): unpickled once per process under ``token``, which
    names that body and no other, and kept for the next run (the last
    :data:`CACHED_BODIES` bodies). The body is not changed by running it.

    Example:
        >>> blob = pickle.dumps(Task("y", abs, TaskRef("x")))
        >>> run_cached("abs-1", blob, (), ("x",), -4), run_cached("abs-1", b"", (), ("x",), 5)
        (4, 5)
    """
    with _LOADED_LOCK:
        body = _LOADED.get(token)
        if body is not None:
            _LOADED.move_to_end(token)
    if body is None:
        body = pickle.loads(blob, buffers=buffers)
        with _LOADED_LOCK:
            _LOADED[token] = body
            while len(_LOADED) > CACHED_BODIES:
                _LOADED.popitem(last=False)
    return body(dict(zip(names, values, strict=True)))
