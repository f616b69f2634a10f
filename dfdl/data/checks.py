"""Checks of training and validation data against the model, before any task runs.

:func:`split_data` turns ``data`` (a pair of arrays or paths, or inputs alone) into
array sources and checks that X and y have the same length; :func:`check_labels`
checks that a classification loss's labels are integers in ``0..classes-1`` (or the
ignore index). Both raise :class:`~dfdl.errors.DataError` naming what is wrong.

Example:
    >>> import numpy as np
    >>> X, y = split_data((np.zeros((4, 2)), np.zeros(4, int)), "data")
    >>> len(X), len(y)
    (4, 4)
"""

from __future__ import annotations

from dfdl.data.sources import ArraySource, as_source
from dfdl.errors import DataError

#: losses whose labels are integer class indices
CLASS_LOSSES = ("cross_entropy", "dice")


def split_data(data, name: str) -> tuple[ArraySource, ArraySource | None]:
    """``(X, y)`` sources of ``data`` (a pair of arrays or paths), or ``(X, None)``.

    Raises:
        DataError: unreadable data, or X and y of different lengths.

    Example:
        >>> X, y = split_data((np.zeros((4, 2)), np.zeros(4, np.int64)), "data")
        >>> len(X), y.dtype
        (4, dtype('int64'))
    """
    if isinstance(data, tuple | list) and len(data) == 2:
        X, y = as_source(data[0], f"{name} X"), as_source(data[1], f"{name} y")
        if len(X) != len(y):
            raise DataError(f"{name}: X has {len(X)} samples but y has {len(y)}")
        return X, y
    return as_source(data, f"{name} X"), None


def check_labels(
    y: ArraySource, loss: str, classes: int, ignore_index=None, name: str = ""
) -> None:
    """Class labels of a classification loss are integers in ``0..classes-1`` (or
    ``ignore_index``); other losses' labels are not checked here. ``name`` (such as
    ``"validation y"``) starts the message when given.

    Raises:
        DataError: naming the first bad label and the valid range.

    Example:
        >>> check_labels(as_source(np.array([0, 3]), "y"), "cross_entropy", classes=3)
        Traceback (most recent call last):
        dfdl.errors.DataError: label 3 is out of range: the model has 3 classes (valid labels 0..2)
    """
    if loss not in CLASS_LOSSES:
        return
    where = f"{name}: " if name else ""
    if y.dtype.kind not in "iu":
        raise DataError(
            f"{where}loss {loss!r} needs integer class labels; {name or 'y'} has dtype {y.dtype}"
        )
    for block in y.chunks():
        bad = (block < 0) | (block >= classes)
        if ignore_index is not None:
            bad &= block != ignore_index
        if bad.any():
            v = block[bad].flat[0]
            raise DataError(
                f"{where}label {int(v)} is out of range: the model has {classes} classes "
                f"(valid labels 0..{classes - 1})"
            )
