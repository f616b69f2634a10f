"""A GPU worker's device memory limit: tiles past it spill device -> host -> disk.

A GPU worker started with a device memory limit (``dfdl.LocalCluster(gpus=N,
device_memory_limit="2GiB")``) keeps its results (Dask's ``worker.data``) in a
:class:`DeviceSpillBuffer`: values that hold device arrays stay on the device up to the
limit (their arrays' bytes); past it the least recently used go to the host as numpy, into
Dask's own ``SpillBuffer``, which writes them to disk past its target as on any worker. A
value read back is copied to the device again, with exactly the leaves that were device
arrays. dfdl plans a GPU worker's tiles against the smaller of its host and device limits
(:func:`device_memory_limit`), so a working set larger than the device trains, tile by
tile, with the numbers of an unlimited run.

Example:
    >>> import tempfile
    >>> import numpy as np
    >>> buf = DeviceSpillBuffer(device_limit=10, host_target=2**20,
    ...                         worker_local_directory=tempfile.mkdtemp())
    >>> buf["x"] = np.ones(4)  # a host value: the host tier, as on a CPU worker
    >>> buf.device_bytes, len(buf)
    (0, 1)
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator, MutableMapping
from typing import Any

from dask.sizeof import sizeof
from distributed.spill import SpillBuffer

from dfdl.ops.gpu.device import is_device_array, to_device


def device_nbytes(value: Any) -> int:
    """Bytes of the device arrays in ``value`` (an array or a tuple of them).

    Example:
        >>> import numpy as np
        >>> device_nbytes((np.ones(3), None))
        0
    """
    if is_device_array(value):
        return int(value.nbytes)
    if isinstance(value, tuple):
        return sum(device_nbytes(v) for v in value)
    return 0


class OnHost:
    """A device value moved to the host: ``value`` with its device arrays as numpy, and
    ``device``, which of its leaves were device arrays (True/False, or a tuple of those
    for a tuple), so that it comes back exactly as it was.

    Example:
        >>> import numpy as np
        >>> OnHost.of(np.ones(2)).device
        False
    """

    __slots__ = ("device", "value")

    def __init__(self, value: Any, device: Any):
        self.value = value
        self.device = device

    @classmethod
    def of(cls, value: Any) -> OnHost:
        """``value`` moved to the host (tuples and their subclasses keep their type)."""
        host, device = _to_host(value)
        return cls(host, device)

    def back(self) -> Any:
        """The value on the device again, as it was before :meth:`of`."""
        return _to_device(self.value, self.device)

    def __reduce__(self):
        return OnHost, (self.value, self.device)


def _to_host(x: Any) -> tuple[Any, Any]:
    if is_device_array(x):
        return x.get(), True
    if isinstance(x, tuple):
        pairs = [_to_host(v) for v in x]
        values = [v for v, _ in pairs]
        out = type(x)(values) if type(x) is not tuple else tuple(values)
        return out, tuple(d for _, d in pairs)
    return x, False


def _to_device(x: Any, device: Any) -> Any:
    if device is True:
        return to_device(x)
    if isinstance(device, tuple):
        values = [_to_device(v, d) for v, d in zip(x, device, strict=True)]
        return type(x)(values) if type(x) is not tuple else tuple(values)
    return x


@sizeof.register(OnHost)
def _sizeof_on_host(o: OnHost) -> int:
    return sizeof(o.value)


class DeviceSpillBuffer(MutableMapping):
    """A GPU worker's ``data``: device values up to ``device_limit`` bytes, the least
    recently used beyond it moved to a host ``SpillBuffer`` (target ``host_target``,
    spilling to ``worker_local_directory``), read back onto the device on access. A
    single value larger than the limit stays on the device while it is the newest.

    For Dask's memory manager it is its host tier: ``fast``, ``evict`` and
    ``spilled_total`` are the host ``SpillBuffer``'s, so the worker's host thresholds
    spill host values to disk as on any worker. ``device_spilled`` and
    ``device_unspilled`` count values and bytes moved off and back onto the device.

    Example:
        >>> import tempfile
        >>> buf = DeviceSpillBuffer(10, 2**20, tempfile.mkdtemp())
        >>> buf.device_limit
        10
    """

    def __init__(
        self,
        device_limit: int,
        host_target: int,
        worker_local_directory: str,
        max_spill: int | bool = False,
    ):
        self.device_limit = int(device_limit)
        self.device: OrderedDict = OrderedDict()
        self.weights: dict = {}
        self.device_bytes = 0
        storage = os.path.join(worker_local_directory, "storage")
        self.host = SpillBuffer(storage, target=int(host_target), max_spill=max_spill)
        self.device_spilled = [0, 0]
        self.device_unspilled = [0, 0]

    # ManualEvictProto and the spill metrics, for Dask's memory manager: the host tier
    @property
    def fast(self):
        return self.host.fast

    def evict(self) -> int:
        return self.host.evict()

    @property
    def spilled_total(self):
        return self.host.spilled_total

    @property
    def cumulative_metrics(self):
        """The host tier's disk metrics (bytes written and read), as Dask's."""
        return self.host.cumulative_metrics

    def _hold(self, key, value, weight: int) -> None:
        self.device[key] = value
        self.weights[key] = weight
        self.device_bytes += weight
        while self.device_bytes > self.device_limit:
            victim = next(iter(self.device))  # the least recently used
            if victim == key:
                break  # the newest value alone is past the limit: it stays
            moved = self.device.pop(victim)
            w = self.weights.pop(victim)
            self.device_bytes -= w
            self.host[victim] = OnHost.of(moved)
            self.device_spilled[0] += 1
            self.device_spilled[1] += w

    def __setitem__(self, key, value) -> None:
        if key in self:
            del self[key]
        weight = device_nbytes(value)
        if weight:
            self._hold(key, value, weight)
        else:
            self.host[key] = value

    def __getitem__(self, key):
        if key in self.device:
            self.device.move_to_end(key)
            return self.device[key]
        value = self.host[key]
        if not isinstance(value, OnHost):
            return value
        back = value.back()
        del self.host[key]
        weight = device_nbytes(back)
        self.device_unspilled[0] += 1
        self.device_unspilled[1] += weight
        self._hold(key, back, weight)
        return back

    def __delitem__(self, key) -> None:
        if key in self.device:
            del self.device[key]
            self.device_bytes -= self.weights.pop(key)
        else:
            del self.host[key]

    def __contains__(self, key) -> bool:
        return key in self.device or key in self.host

    def __iter__(self) -> Iterator:
        yield from list(self.device)
        yield from list(self.host)

    def __len__(self) -> int:
        return len(self.device) + len(self.host)


def device_limit_of(dask_worker=None) -> int | None:
    """On a worker: its device memory limit (None without one)."""
    data = getattr(dask_worker, "data", None)
    return data.device_limit if isinstance(data, DeviceSpillBuffer) else None


def device_memory_limit(client) -> int | None:
    """The smallest device memory limit among the client's workers (None: none has one).

    Example:
        >>> device_memory_limit(Client(dfdl.LocalCluster(gpus=1,  # doctest: +SKIP
        ...     device_memory_limit="2GiB")))
        2147483648
    """
    limits = [v for v in client.run(device_limit_of).values() if v]
    return min(limits) if limits else None


def device_spill_counts(dask_worker=None) -> dict | None:
    """On a worker: values and bytes moved off the device and back (None without a
    device limit)."""
    data = getattr(dask_worker, "data", None)
    if not isinstance(data, DeviceSpillBuffer):
        return None
    return {
        "spilled": list(data.device_spilled),
        "unspilled": list(data.device_unspilled),
        "device_bytes": data.device_bytes,
    }
