"""Dask config entries that hold for the calling thread (and context) only.

The planner reads the workers' memory thresholds (``distributed.worker.memory.*``) as
dask config. ``dask.config.set`` changes the process's global config and restores it on
exit, which is not safe across threads: two trials of :func:`dfdl.tune` planning at once
restore each other's values out of order and leave the workers' thresholds in the
process's config, where every cluster started later inherits them. :func:`scoped_config`
keeps them in a :class:`contextvars.ContextVar` instead, and :func:`config_get` reads
them before the global config.

Example:
    >>> with scoped_config({"distributed.worker.memory.pause": 0.7}):
    ...     config_get("distributed.worker.memory.pause")
    0.7
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import dask

_SCOPED: ContextVar[Mapping[str, Any] | None] = ContextVar("dfdl_scoped_config", default=None)


@contextmanager
def scoped_config(entries: Mapping[str, Any]) -> Iterator[None]:
    """Dask config ``entries`` (flat dotted keys) seen by :func:`config_get` in this
    thread and context until the block ends; nested blocks override outer ones.

    Example:
        >>> with scoped_config({"distributed.worker.memory.spill": 0.5}):
        ...     config_get("distributed.worker.memory.spill")
        0.5
    """
    token = _SCOPED.set({**(_SCOPED.get() or {}), **entries})
    try:
        yield
    finally:
        _SCOPED.reset(token)


def config_get(key: str, default: Any = None) -> Any:
    """``key``'s value from the innermost :func:`scoped_config`, else the process's dask
    config, else ``default``.

    Example:
        >>> with dask.config.set({"dfdl.memory.worker-footprint": "300MiB"}):
        ...     config_get("dfdl.memory.worker-footprint")
        '300MiB'
    """
    scoped = _SCOPED.get()
    if scoped and key in scoped:
        return scoped[key]
    return dask.config.get(key, default)
