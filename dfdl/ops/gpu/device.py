"""Device arrays on a GPU worker: moving values between host and device, and the GPU
tile function of an op (its cupy kernel, or its CPU tile function on host copies).

Example:
    >>> import numpy as np
    >>> to_host((np.ones(2), None))  # host values pass through
    (array([1., 1.]), None)
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import numpy as np

#: runs of an op's CPU tile function on a GPU worker (op key -> runs), in this process
FALLBACKS: Counter = Counter()
_LOCK = threading.Lock()


def cupy():
    """The ``cupy`` module (imported on first use: only GPU workers need it)."""
    import cupy as cp

    return cp


def is_device_array(x: Any) -> bool:
    """Whether ``x`` is a device (cupy) array, without importing cupy."""
    return type(x).__module__.split(".", 1)[0] == "cupy"


def namespace(x: Any):
    """The array module of ``x``: cupy for a device array, else numpy (helpers written
    once for both, as the kernels' shape plumbing is)."""
    return cupy() if is_device_array(x) else np


def to_device(x: Any) -> Any:
    """``x`` as a device array (a device array as it is; None stays None)."""
    if x is None or is_device_array(x):
        return x
    return cupy().asarray(x)


def to_host(x: Any) -> Any:
    """``x`` with every device array in it copied to the host as numpy (tuples and
    their subclasses, such as a task's several outputs, keep their type)."""
    if is_device_array(x):
        return x.get()
    if isinstance(x, tuple):
        values = [to_host(v) for v in x]
        return type(x)(values) if type(x) is not tuple else tuple(values)
    return x


def scalar(x: Any) -> float:
    """A 0-d input (learning rate, flag) as a Python float (from the host if there)."""
    if is_device_array(x):
        return float(x.get())
    return float(np.asarray(x))


class GpuDispatch:
    """The tile function of an op on a GPU worker: its GPU kernel where one is registered
    and accepts the arrays (the kernel gets what the op's ``params`` rule resolves, as a
    CPU kernel does), else the op's CPU tile function on host copies of the inputs
    (counted in :data:`FALLBACKS`), whose outputs stay on the host until a GPU kernel reads
    them; also where the rule needs the values of an input on the device. Pickled by
    reference to its functions.

    Example:
        >>> d = GpuDispatch("Neg", np.negative, None, None)
        >>> d(np.array([1.0]))  # no GPU kernel: the CPU function, on the host
        array([-1.])
    """

    __slots__ = ("accepts", "host", "kernel", "name", "params")

    def __init__(self, name: str, host, kernel, accepts, params=None):
        self.name = name
        self.host = host
        self.kernel = kernel
        self.accepts = accepts
        self.params = params

    def __call__(self, *inputs, **attrs):
        if self.kernel is not None and (self.accepts is None or self.accepts(*inputs, **attrs)):
            if self.params is None:
                return self.kernel(*inputs, **attrs)
            try:
                params = self.params(*inputs, **attrs)
            except TypeError:
                if not any(is_device_array(x) for x in inputs):
                    raise
                params = None  # the rule reads the values of an input on the device
            if params is not None:
                return self.kernel(*inputs, **params)
        with _LOCK:
            FALLBACKS[self.name] += 1
        return self.host(*(to_host(x) for x in inputs), **attrs)

    def __reduce__(self):
        return GpuDispatch, (self.name, self.host, self.kernel, self.accepts, self.params)

    def __repr__(self) -> str:
        k = getattr(self.kernel, "__name__", None) or "CPU on host"
        return f"GpuDispatch({self.name}: {k})"


def dispatch(op) -> GpuDispatch:
    """The GPU tile function of ``op`` (a :class:`dfdl.ops.registry.OpDef`)."""
    from dfdl.ops.registry import lookup

    op = lookup(op.name, op.domain)  # registered anew since (the GPU kernels imported)
    k = op.kernels.get("gpu")
    name = op.name if not op.domain else f"{op.domain}.{op.name}"
    host = op.kernel("cpu")
    if k is None:
        return GpuDispatch(name, host, None, None)
    return GpuDispatch(name, host, k.fn, k.accepts, op.params)
