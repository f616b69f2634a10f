"""Tensors kept in files that the workers read and write, so that the client never holds
them (``dfdl.train(..., weights_dir=...)``).

A :class:`Stored` tensor is a description of bytes in a file on a filesystem the workers
and the client share (an ONNX model's external data, a ``.npy`` file written by the
workers); :class:`Zeros` is a tensor of zeros (fresh optimizer state). Both are sent to
the workers as a few bytes: a worker reads its tile itself (:func:`read_tile`), and writes
its tiles into a new ``.npy`` file (:func:`create`, then :func:`write_tile` per tile) with
positioned writes of the tile's contiguous runs, never a read-modify-write of a page that
another worker also writes (safe on NFS and Lustre, where workers on several nodes write
one file).

Example:
    >>> import tempfile, numpy as np
    >>> s = create(tempfile.mkdtemp() + "/w.npy", (2, 3), "float32")
    >>> write_tile(np.ones((2, 2), "float32"), s, (slice(0, 2), slice(1, 3)))
    16
    >>> np.asarray(s.mapped())
    array([[0., 1., 1.],
           [0., 1., 1.]], dtype=float32)
"""

from __future__ import annotations

import math
import mmap
import os
import re
import socket
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Stored:
    """A C-ordered, little-endian tensor at ``offset`` in the file ``path``.

    Example:
        >>> Stored("/shared/run/w.npy", 128, (4, 4), "float32").nbytes
        64
    """

    path: str
    offset: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    def mapped(self) -> np.ndarray:
        """The tensor as a read-only memory map: nothing is read until it is indexed."""
        if self.nbytes == 0:
            return np.zeros(self.shape, self.dtype)
        return np.memmap(self.path, self.dtype, "r", self.offset, self.shape)

    def read(self, region: tuple[slice, ...]) -> np.ndarray:
        """A copy of ``region`` of the tensor."""
        return np.array(self.mapped()[region])


@dataclass(frozen=True)
class Zeros:
    """A tensor of zeros (an optimizer's initial state), made where it is needed.

    Example:
        >>> Zeros((2, 2), "float32").read((slice(0, 1), slice(0, 2)))
        array([[0., 0.]], dtype=float32)
    """

    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    def read(self, region: tuple[slice, ...]) -> np.ndarray:
        return np.zeros(_extent(region, self.shape), self.dtype)


#: what a carried value can be on the client: an array, or a description of one
Source = Stored | Zeros


def is_source(value: Any) -> bool:
    """Whether ``value`` is a description the workers read (not an array)."""
    return isinstance(value, Stored | Zeros)


def source_of(value: Any) -> Source | None:
    """``value`` if it is a description the workers read, the :class:`Stored` of a
    whole-file memory map (:func:`of_memmap`), else None (an array to send)."""
    return value if is_source(value) else of_memmap(value)


def safe_name(name: str) -> str:
    """``name`` (an ONNX name: any character) as a file name's part."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def of_memmap(value: Any) -> Stored | None:
    """The :class:`Stored` for a read-only memory map of a whole file region (what
    :func:`dfdl.ir.onnx_io.to_ir` makes of unloaded external data), else None."""
    if not isinstance(value, np.memmap) or value.filename is None:
        return None
    if not value.flags.c_contiguous or value.dtype.byteorder == ">":
        return None
    if not isinstance(value.base, mmap.mmap):  # a view of one: its offset is stale
        return None
    return Stored(str(value.filename), int(value.offset), tuple(value.shape), value.dtype.str)


def read_tile(source: Source, region: tuple[slice, ...]) -> np.ndarray:
    """The task a worker runs to load its tile of ``source``.

    Raises:
        TrainingError: the worker cannot read the file (its message names the file, the
            worker's host and what to do).
    """
    try:
        return source.read(region)
    except OSError as e:
        raise _unshared(e, "read", getattr(source, "path", "")) from None


def _unshared(e: OSError, what: str, path: str) -> Exception:
    from dfdl.errors import TrainingError

    return TrainingError(
        f"a worker on {socket.gethostname()} cannot {what} {path} ({e.strerror or e}): "
        "the model's folder and weights_dir must be on a filesystem every worker and the "
        "client share, with the same path, readable and writable by the workers"
    )


def create(path: str | os.PathLike, shape: tuple[int, ...], dtype: Any) -> Stored:
    """A new ``.npy`` file at ``path`` for a tensor of ``shape`` and ``dtype`` (its data
    not written: the file is sparse until the workers write their tiles)."""
    dtype = np.dtype(dtype)
    header = {
        "descr": np.lib.format.dtype_to_descr(dtype),
        "fortran_order": False,
        "shape": tuple(int(n) for n in shape),
    }
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        offset = f.tell()
        f.truncate(offset + math.prod(shape) * dtype.itemsize)
    return Stored(os.fspath(path), offset, tuple(int(n) for n in shape), dtype.str)


def write_tile(tile: Any, target: Stored, region: tuple[slice, ...], pos: int | None = None) -> int:
    """The task a worker runs to write its tile (``tile[pos]`` for a tuple of tiles) into
    ``region`` of ``target``; the bytes written.

    Each contiguous run of the region is one positioned write (``os.pwrite``), and the
    file is synced before the task ends, so that the tile is on disk when the client
    hears of it.
    """
    if pos is not None:
        tile = tile[pos]
    if not isinstance(tile, np.ndarray) and hasattr(tile, "get"):  # a cupy array
        tile = tile.get()
    tile = np.ascontiguousarray(tile, dtype=np.dtype(target.dtype))
    extent = _extent(region, target.shape)
    if tile.shape != extent:
        raise ValueError(f"a tile of shape {tile.shape} for a region of shape {extent}")
    if tile.size == 0:
        return 0
    shape = target.shape
    itemsize = tile.itemsize
    # the trailing axes the region covers whole are one run with the first one it does not
    k = len(shape)
    while k > 0 and region[k - 1].start == 0 and region[k - 1].stop == shape[k - 1]:
        k -= 1
    strides = [math.prod(shape[i + 1 :]) * itemsize for i in range(len(shape))]
    flat = tile.reshape(-1)
    run = math.prod(extent[max(k - 1, 0) :])
    lead = extent[: max(k - 1, 0)]
    try:
        fd = os.open(target.path, os.O_WRONLY)
    except OSError as e:
        raise _unshared(e, "write", target.path) from None
    try:
        for n, index in enumerate(np.ndindex(*lead)):
            at = target.offset + sum(
                (region[i].start + index[i]) * strides[i] for i in range(len(lead))
            )
            if k > 0:
                at += region[k - 1].start * strides[k - 1]
            _pwrite_all(fd, flat[n * run : (n + 1) * run], at)
        os.fsync(fd)
    finally:
        os.close(fd)
    return tile.nbytes


def _pwrite_all(fd: int, values: np.ndarray, at: int) -> None:
    view = memoryview(values).cast("B")
    while len(view):  # one call writes at most about 2 GiB
        done = os.pwrite(fd, view, at)
        view, at = view[done:], at + done


def _extent(region: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(len(range(*s.indices(n))) for s, n in zip(region, shape, strict=True))
