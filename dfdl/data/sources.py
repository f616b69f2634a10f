"""Array sources for training data: numpy arrays, dask arrays and ``.npy`` files.

A ``.npy`` path is opened memory-mapped: a batch reads only its rows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from dfdl.errors import DataError


@dataclass
class ArraySource:
    """Samples along axis 0 of an array-like, read a batch at a time.

    Attributes:
        name: what the array is ("X", "y", "validation X").
        array: numpy array, numpy memmap or dask array.
    """

    name: str
    array: Any

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.array.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.array.dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def take(self, indices: np.ndarray) -> np.ndarray:
        """The rows ``indices`` (in that order) as a numpy array."""
        if hasattr(self.array, "dask"):
            order = np.argsort(indices, kind="stable")
            rows = np.asarray(self.array[np.sort(indices)].compute())
            out = np.empty_like(rows)
            out[order] = rows
            return out
        return np.asarray(self.array[indices])

    def chunks(self, rows: int = 65536):
        """Iterate over the array in row blocks (for validation of labels)."""
        for i in range(0, len(self), rows):
            yield np.asarray(self.array[i : i + rows])


def as_source(x: Any, name: str) -> ArraySource:
    """Wrap numpy/dask arrays or a ``.npy`` path as an :class:`ArraySource`.

    Raises:
        DataError: unreadable path or unsupported type.
    """
    if isinstance(x, str | os.PathLike):
        path = os.fspath(x)
        if not path.endswith(".npy"):
            raise DataError(f"{name}: {path!r} is not a .npy file (give a numpy/dask array)")
        try:
            x = np.load(path, mmap_mode="r")
        except (OSError, ValueError) as e:
            raise DataError(f"{name}: cannot read {path}: {e}") from e
    elif not (isinstance(x, np.ndarray) or hasattr(x, "dask")):
        try:
            x = np.asarray(x)
        except Exception as e:
            raise DataError(f"{name}: cannot use a {type(x).__name__} as an array") from e
    if x.ndim == 0:
        raise DataError(f"{name}: must have a sample axis (got a scalar)")
    return ArraySource(name, x)
