"""Array sources for training data: numpy arrays, dask arrays, ``.npy`` files, zarr stores.

Files are read by the workers, batch tile by batch tile: the client opens a ``.npy``
file (memory-mapped) or a zarr array only to read its shape and dtype, and each batch
tile task reads its own rows on the worker. :func:`as_source` wraps any of them in an
:class:`ArraySource` (length, shape, dtype, ``take`` of sample indices); a batch read
from a file holds exactly the values of the same rows of the array in memory.

Example:
    >>> src = as_source(np.zeros((6, 3), np.float32), "X")
    >>> len(src), src.take(np.array([0, 2])).shape
    (6, (2, 3))
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from dfdl.errors import DataError


@dataclass(frozen=True)
class FileRows:
    """Rows ``indices`` of a file-backed array, to be read on a worker.

    Attributes:
        path: the ``.npy`` file or zarr store.
        kind: "npy" or "zarr".
        indices: sample indices, in batch order.
        shape: the batch's shape (``len(indices)`` rows).
        dtype: the array's dtype.
    """

    path: str
    kind: str
    indices: np.ndarray
    shape: tuple[int, ...]
    dtype: np.dtype

    def __len__(self) -> int:
        return len(self.indices)


def _open(path: str, kind: str):
    if kind == "npy":
        return np.load(path, mmap_mode="r")
    import zarr

    return zarr.open_array(path, mode="r")


def read_rows(path: str, kind: str, indices: np.ndarray, rest: tuple) -> np.ndarray:
    """Read rows ``indices`` (any order) and the region ``rest`` of the other axes.

    Runs on a worker. Rows are read in increasing order (one pass over the file) and
    put back in batch order.
    """
    arr = _open(path, kind)
    order = np.argsort(indices, kind="stable")
    wanted = np.asarray(indices)[order]
    if kind == "zarr":
        rows = np.asarray(arr.oindex[(wanted, *rest)])
    else:
        rows = np.asarray(arr[wanted][(slice(None), *rest)])
    out = np.empty_like(rows)
    out[order] = rows
    return out


@dataclass
class ArraySource:
    """Samples along axis 0 of an array-like, read a batch at a time.

    Attributes:
        name: what the array is ("X", "y", "validation X").
        array: numpy array, dask array, or the opened file (memmap / zarr array).
        path: the file when the data come from a ``.npy`` file or zarr store.
        kind: "memory", "dask", "npy" or "zarr".
    """

    name: str
    array: Any
    path: str | None = None
    kind: str = "memory"

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.array.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.array.dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def take(self, indices: np.ndarray) -> np.ndarray:
        """The rows ``indices`` (in that order) as a numpy array, read here."""
        if self.kind == "dask":
            order = np.argsort(indices, kind="stable")
            rows = np.asarray(self.array[np.asarray(indices)[order]].compute())
            out = np.empty_like(rows)
            out[order] = rows
            return out
        if self.kind in ("npy", "zarr"):
            return read_rows(self.path, self.kind, np.asarray(indices), ())
        return np.asarray(self.array[indices])

    def batch(self, indices: np.ndarray):
        """A batch for the trainer: numpy rows, or :class:`FileRows` read on workers."""
        if self.kind in ("npy", "zarr"):
            return FileRows(
                self.path,
                self.kind,
                np.asarray(indices),
                (len(indices), *self.shape[1:]),
                self.dtype,
            )
        return self.take(indices)

    def chunks(self, rows: int = 65536):
        """Iterate over the array in row blocks (for checking labels)."""
        for i in range(0, len(self), rows):
            yield np.asarray(self.array[i : i + rows])


def as_source(x: Any, name: str) -> ArraySource:
    """Wrap numpy/dask arrays, a ``.npy`` path or a zarr store path as an ArraySource.

    Raises:
        DataError: unreadable path or unsupported type.

    Example:
        >>> as_source(np.zeros((10, 3)), "X").shape
        (10, 3)
    """
    if isinstance(x, str | os.PathLike):
        path = os.path.abspath(os.fspath(x))
        kind = "npy" if path.endswith(".npy") else "zarr"
        if kind == "zarr":
            try:
                import zarr  # noqa: F401
            except ImportError as e:
                raise DataError(
                    f"{name}: {path!r} is not a .npy file; reading zarr stores needs the "
                    "zarr package (pip install zarr)"
                ) from e
        try:
            arr = _open(path, kind)
        except Exception as e:
            raise DataError(f"{name}: cannot read {path} as {kind}: {e}") from e
        return ArraySource(name, arr, path, kind)
    if hasattr(x, "dask"):
        if x.ndim == 0:
            raise DataError(f"{name}: must have a sample axis (got a scalar)")
        return ArraySource(name, x, kind="dask")
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except Exception as e:
            raise DataError(f"{name}: cannot use a {type(x).__name__} as an array") from e
    if x.ndim == 0:
        raise DataError(f"{name}: must have a sample axis (got a scalar)")
    return ArraySource(name, x)
