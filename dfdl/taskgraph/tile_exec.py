"""Functions that Dask tasks call: run one op on one tile, combine partial tiles.

Task arguments are flat (``meta`` plus the input tiles), and ``meta`` says how to
turn them into the op's inputs: take a tile as is, pick one output of a multi-output
tile, slice a region out of a tile, or assemble a region from several tiles.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import numpy as np
from dask.sizeof import sizeof

from dfdl.errors import DfdlError


class TileError(DfdlError, RuntimeError):
    """A tile task failed on a worker; the message names the node, op and tile."""


class Outputs(tuple):
    """The values of a task with several outputs (a multi-output node's tile, a grouped
    optimizer update), sized exactly for Dask.

    Dask sizes a plain tuple of more than 10 items from a random sample of 10, so the
    scheduler's size of a grouped update's outputs (many tiles of different sizes)
    changed from run to run. A reader's inputs are summed against the worker's memory
    limit before it starts: on 4 MiB workers, a sampled 4.25 MiB failed a training run
    one time in several.
    """

    __slots__ = ()


@sizeof.register(Outputs)
def _sizeof_outputs(values: Outputs) -> int:
    return sys.getsizeof(values) + sum(sizeof(v) for v in values)


def _resolve(spec: tuple, args: tuple) -> Any:
    kind = spec[0]
    if kind == "none":
        return None
    if kind == "const":
        return spec[1]
    if kind == "value":
        return args[spec[1]]
    if kind == "pick":
        return args[spec[1]][spec[2]]
    if kind == "slice":
        part = args[spec[1]]
        if spec[2] is not None:
            part = part[spec[2]]
        return part[spec[3]]
    if kind == "assemble":
        _, shape, dtype, pieces = spec
        out = np.empty(shape, dtype=dtype)
        for k, pos, src, dst in pieces:
            part = args[k] if pos is None else args[k][pos]
            out[dst] = part[src]
        return out
    raise ValueError(f"unknown tile input kind {kind!r}")


def ready(*_: Any) -> None:
    """A task that only marks that its inputs exist (an ordering edge, nothing else)."""
    return None


def _aligned(x: Any) -> Any:
    """``x``, or an aligned C-contiguous copy when it is not one.

    Tiles and constants pickled inside the task graph arrive as views into the pickle's
    bytes, at any byte offset. numpy's matmul skips BLAS for unaligned or strided
    operands, and BLAS itself sums in another order for a transposed layout, so the
    same tile in another memory layout would round differently.
    """
    if isinstance(x, np.ndarray) and not (x.flags.aligned and x.flags.c_contiguous):
        return np.array(x, order="C")
    return x


def _settled(x: np.ndarray) -> np.ndarray:
    """A task's output as it will rest on the worker: C-contiguous and owning its memory.

    A kernel may return a view (Transpose, Slice) or an F-ordered result. Passed on
    as is, a consumer in the same worker would see that layout while one in another
    worker sees the transferred copy, and results would depend on task placement
    (measured: model-split MLP weights differing in the last bit between runs). A view
    would also keep its whole base array alive unseen by Dask's memory accounting.
    """
    base = x.base
    whole = base is None or (isinstance(base, np.ndarray) and base.nbytes == x.nbytes)
    if x.flags.c_contiguous and (whole or x.ndim == 0):
        return x
    return np.array(x, order="C")


#: how much nicer than its process a thread that runs tile tasks is, set by dfdl's
#: worker preload (:data:`dfdl.runtime.worker_setup.TASK_NICE`); 0 leaves threads be
TASK_NICE = 0
_thread = threading.local()


def _renice() -> None:
    """Makes the calling thread :data:`TASK_NICE` nicer than its process (Linux, where
    nice values are per thread)."""
    applied = getattr(_thread, "nice", 0)
    if applied == TASK_NICE:
        return
    _thread.nice = TASK_NICE
    if sys.platform.startswith("linux"):  # elsewhere a thread id is no process id
        tid = threading.get_native_id()
        try:
            now = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, now + TASK_NICE - applied))
        except OSError:  # a lower value needs privileges: the thread stays as it is
            pass


def run_tile(meta: tuple, *args: Any) -> Any:
    """Run one op on one tile.

    Args:
        meta: ``(op, attrs, input_specs, out_shapes, label)`` where ``op`` is the
            OpDef's kernel function, ``out_shapes`` the expected shape of each node
            output slot (None for absent ones) and ``label`` names node and tile.
        *args: the input tiles referenced by ``input_specs``.
    """
    _renice()
    fn, attrs, specs, shapes, label = meta
    n_out = len(shapes)
    inputs = [_aligned(_resolve(s, args)) for s in specs]
    while inputs and inputs[-1] is None:
        inputs.pop()
    try:
        out = fn(*inputs, **attrs)
    except DfdlError:
        raise
    except Exception as e:
        raise TileError(f"{label} failed: {type(e).__name__}: {e}") from None
    if not isinstance(out, tuple):
        out = (out,)
    out = tuple(None if o is None else _settled(np.asarray(o)) for o in out[:n_out])
    out += (None,) * (n_out - len(out))
    for i, (o, shape) in enumerate(zip(out, shapes)):
        if shape is not None and (o is None or o.shape != shape):
            got = None if o is None else o.shape
            raise TileError(f"{label}: output {i} has shape {got}, the plan expects {shape}")
    return out[0] if n_out == 1 else Outputs(out)


def merge_moments(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Chan's parallel combination of per-row (count, mean, sum of squared deviations):
    no sum of raw squares, so no cancellation however large the mean."""
    na, nb = a[:, 0], b[:, 0]
    n = na + nb
    delta = b[:, 1] - a[:, 1]
    with np.errstate(invalid="ignore", divide="ignore"):
        w = np.where(n > 0, nb / n, 0.0)
    out = np.empty_like(a)
    out[:, 0] = n
    out[:, 1] = a[:, 1] + delta * w
    out[:, 2] = a[:, 2] + b[:, 2] + delta * delta * na * w
    return out


#: elementwise combines: ufunc applied left to right over the partials
_COMBINE_UFUNCS = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def combine(how: str, *parts: np.ndarray) -> np.ndarray:
    """Combine partial tiles of a contraction in the given (fixed) order."""
    ufunc = _COMBINE_UFUNCS.get(how)
    if ufunc is not None:
        first = np.asarray(parts[0])
        if len(parts) == 1:
            return first.copy()
        # the first step writes a new array, later ones add into it: no copy of
        # parts[0] first (a dense layer's weight-gradient partials are 64 MiB each)
        acc = ufunc(first, parts[1], out=np.empty(first.shape, first.dtype))
        for p in parts[2:]:
            ufunc(acc, p, out=acc)
        return acc
    if how == "moments":
        acc = parts[0].copy()
        for p in parts[1:]:
            acc = merge_moments(acc, p)
        return acc
    raise ValueError(f"unknown combine {how!r}")
