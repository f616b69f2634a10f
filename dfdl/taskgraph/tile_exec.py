"""Functions that Dask tasks call: run one op on one tile, combine partial tiles.

Task arguments are flat (``meta`` plus the input tiles), and ``meta`` says how to
turn them into the op's inputs: take a tile as is, pick one output of a multi-output
tile, slice a region out of a tile, or assemble a region from several tiles
(:func:`run_tile`, :func:`assemble_task`). :func:`combine` merges partial tiles of a
contraction (sum, max, min, BatchNorm moments) left to right in the order given.

Guarantees: a tile's outputs have the shapes the plan expects, or the task raises
:class:`TileError` naming the node, op and tile; combining the same partials in the same
order gives the same bits. The plumbing is written against the tiles' array namespace
(:func:`namespace`): numpy for numpy tiles, the array's own (``__array_namespace__``)
otherwise, so a device array (a GPU worker's) flows through assembling, running and
combining without ever becoming a numpy array. Numpy tiles take the numpy paths, with
their layout rules (:func:`_aligned`, :func:`_settled`).

Example:
    >>> combine("sum", np.ones(2), np.full(2, 2.0), np.full(2, 3.0))
    array([6., 6.])
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
        return assemble(shape, dtype, pieces, args)
    raise ValueError(f"unknown tile input kind {kind!r}")


def namespace(x: Any):
    """The array namespace of ``x``: numpy for numpy arrays and scalars, else the
    array's own (``x.__array_namespace__()``: cupy's, array-api-strict's...).

    Example:
        >>> namespace(np.ones(2)) is np
        True
    """
    if type(x) is np.ndarray:
        return np
    if type(x).__module__.split(".", 1)[0] == "cupy":  # cupy's own module, whatever
        import cupy  # its ``__array_namespace__`` gives in this cupy release

        return cupy
    if not hasattr(x, "__array_namespace__"):
        return np
    return x.__array_namespace__()


def empty(shape: tuple[int, ...], like: Any, dtype=None) -> Any:
    """An uninitialised array of ``shape`` in ``like``'s namespace and on its device,
    of ``dtype`` (default: ``like``'s).

    Example:
        >>> empty((2, 3), np.zeros(1, np.float32)).dtype
        dtype('float32')
    """
    xp = namespace(like)
    if xp is np:
        return np.empty(shape, dtype=like.dtype if dtype is None else dtype)
    try:
        return xp.empty(shape, dtype=like.dtype, device=like.device)
    except TypeError:  # a namespace without ``device=`` allocates on the current device
        return xp.empty(shape, dtype=like.dtype)


def assemble(shape: tuple[int, ...], dtype, pieces, args) -> Any:
    """A region of ``shape`` put together from tiles: each piece ``(k, pos, src, dst)``
    copies ``args[k]`` (output ``pos`` of it, unless None) at ``src`` into ``dst``.

    Example:
        >>> assemble((3,), None, [(0, None, slice(0, 2), slice(0, 2)),
        ...                       (1, None, slice(0, 1), slice(2, 3))],
        ...          (np.array([1, 2]), np.array([3])))
        array([1, 2, 3])
    """
    parts = [args[k] if pos is None else args[k][pos] for k, pos, _, _ in pieces]
    devices = [p for p in parts if type(p) is not np.ndarray]
    # on a device if any piece is (a host piece, from an op's CPU function, is copied there)
    out = empty(shape, devices[0] if devices else parts[0], dtype)
    for part, (_, _, src, dst) in zip(parts, pieces):
        if devices and type(part) is np.ndarray:
            part = namespace(out).asarray(part)
        out[dst] = part[src]
    return out


def assemble_task(shape: tuple[int, ...], pieces, *args) -> Any:
    """:func:`assemble` as a task of its own (the trainer's re-tiling of carried
    tensors), in the dtype of the tiles."""
    return assemble(shape, None, pieces, args)


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


def _settled(x: Any) -> Any:
    """A task's output as it will rest on the worker: C-contiguous and owning its memory.

    A kernel may return a view (Transpose, Slice) or an F-ordered result. Passed on
    as is, a consumer in the same worker would see that layout while one in another
    worker sees the transferred copy, and results would depend on task placement
    (measured: model-split MLP weights differing in the last bit between runs). A view
    would also keep its whole base array alive unseen by Dask's memory accounting.
    Device arrays are left as they are.
    """
    if type(x) is not np.ndarray:
        return x
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
    out = tuple(None if o is None else _settled(_as_array(o)) for o in out[:n_out])
    out += (None,) * (n_out - len(out))
    for i, (o, shape) in enumerate(zip(out, shapes)):
        if shape is not None and (o is None or o.shape != shape):
            got = None if o is None else o.shape
            raise TileError(f"{label}: output {i} has shape {got}, the plan expects {shape}")
    return out[0] if n_out == 1 else Outputs(out)


def _as_array(x: Any) -> Any:
    """A kernel's output as an array: numpy's for numpy results and Python scalars,
    device arrays as they are."""
    return np.asarray(x) if namespace(x) is np else x


def merge_moments(a: Any, b: Any) -> Any:
    """Chan's parallel combination of per-row (count, mean, sum of squared deviations):
    no sum of raw squares, so no cancellation however large the mean."""
    xp = namespace(a)
    na, nb = a[:, 0], b[:, 0]
    n = na + nb
    delta = b[:, 1] - a[:, 1]
    if xp is np:
        with np.errstate(invalid="ignore", divide="ignore"):
            w = np.where(n > 0, nb / n, 0.0)
    else:
        some = n > 0
        w = xp.where(some, nb / xp.where(some, n, xp.ones_like(n)), xp.zeros_like(n))
    out = empty(a.shape, a)
    out[:, 0] = n
    out[:, 1] = a[:, 1] + delta * w
    out[:, 2] = a[:, 2] + b[:, 2] + delta * delta * na * w
    return out


#: elementwise combines: ufunc applied left to right over the partials
_COMBINE_UFUNCS = {"sum": np.add, "max": np.maximum, "min": np.minimum}


#: the same combines by name in an array namespace
_COMBINE_NAMES = {"sum": "add", "max": "maximum", "min": "minimum"}


def combine(how: str, *parts: Any) -> Any:
    """Combine partial tiles of a contraction in the given (fixed) order."""
    ufunc = _COMBINE_UFUNCS.get(how)
    xp = namespace(parts[0])
    if ufunc is not None and xp is not np:
        fn = getattr(xp, _COMBINE_NAMES[how])
        acc = xp.asarray(parts[0], copy=True)
        for p in parts[1:]:
            # a partial computed on the host (an op a GPU kernel did not take) joins the rest
            acc = fn(acc, xp.asarray(p) if type(p) is np.ndarray else p)
        return acc
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
        acc = xp.asarray(parts[0], copy=True) if xp is not np else parts[0].copy()
        for p in parts[1:]:
            acc = merge_moments(acc, p)
        return acc
    raise ValueError(f"unknown combine {how!r}")
