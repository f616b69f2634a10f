"""A stand-in for cupy on a machine without a GPU: device arrays are numpy arrays of their
own type, and numpy refuses what cupy refuses, a host array mixed into a device
operation. It runs the Python of dfdl's GPU kernels and plumbing (dispatch, device/host
copies, step programs on a GPU worker) in CI; not their CUDA: each element-wise kernel's
body is restated here in numpy under the kernel's name (:data:`ELEMENTWISE`), so a wrong
CUDA body is found only on a GPU (tests/gpu).

The tests put this folder on ``sys.path`` (or this module in ``sys.modules``) only while
they run (tests/ops/gpu/test_standin.py).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erfc as _erfc

float32, float64, int64, uint64, bool_ = np.float32, np.float64, np.int64, np.uint64, np.bool_


class ndarray(np.ndarray):  # noqa: N801 - cupy's name
    """A device array: ``get()`` copies it to the host."""

    def get(self) -> np.ndarray:
        return np.array(self.view(np.ndarray))

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        ins = [_plain(x) for x in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(_plain(o) for o in kwargs["out"])
        return _device(getattr(ufunc, method)(*ins, **kwargs))


def _plain(x):
    """A device array as plain numpy; a host array (of rank > 0) is an error, as in cupy."""
    if type(x) is np.ndarray and x.ndim > 0:
        raise TypeError(f"Unsupported type {type(x)}: a host array given to a device operation")
    return x.view(np.ndarray) if isinstance(x, ndarray) else x


def _device(r):
    if isinstance(r, tuple):
        return tuple(_device(v) for v in r)
    if isinstance(r, list):
        return [_device(v) for v in r]
    if isinstance(r, np.ndarray):
        return r.view(ndarray)
    if isinstance(r, np.generic):
        return np.asarray(r).view(ndarray)
    return r


def _on_device(fn):
    """``fn`` of numpy taking and giving device arrays."""

    def wrapped(*args, **kwargs):
        args = [[_plain(a) for a in x] if isinstance(x, list | tuple) else _plain(x) for x in args]
        return _device(fn(*args, **kwargs))

    wrapped.__name__ = fn.__name__
    return wrapped


def asarray(x, dtype=None, order=None, *, copy=None):
    """cupy.asarray: ``x`` on the device (as it is where it is there and no copy is asked)."""
    if isinstance(x, ndarray) and dtype is None and not copy:
        return x
    return np.array(_plain(x) if isinstance(x, ndarray) else x, dtype=dtype).view(ndarray)


def array(x, dtype=None, copy=True):
    """A new device array (from a device or a host array, as cupy.array)."""
    return np.array(
        x.view(np.ndarray) if isinstance(x, ndarray) else x, dtype=dtype, copy=copy
    ).view(ndarray)


def asnumpy(x):
    return x.get() if isinstance(x, ndarray) else np.asarray(x)


def _creator(fn):
    return lambda *a, **k: fn(*a, **k).view(ndarray)


empty, zeros, ones, full, arange = map(_creator, (np.empty, np.zeros, np.ones, np.full, np.arange))
for _name in (
    "matmul add subtract multiply divide maximum minimum where exp log sqrt reciprocal "
    "take take_along_axis stack concatenate split clip broadcast_to ascontiguousarray "
    "swapaxes zeros_like ones_like sum mean"
).split():
    globals()[_name] = _on_device(getattr(np, _name))


class _StrideTricks:
    @staticmethod
    def as_strided(x, shape, strides):
        return np.lib.stride_tricks.as_strided(_plain(x), shape, strides).view(ndarray)


class lib:  # noqa: N801 - cupy's name
    stride_tricks = _StrideTricks


class _Runtime:
    @staticmethod
    def getDeviceCount() -> int:  # noqa: N802 - cupy's name
        return 1


class cuda:  # noqa: N801 - cupy's name
    runtime = _Runtime


# ------------------------------------------------- element-wise kernels, by their name


def _relu(x):
    return np.where((x > 0) | (x != x), x, x.dtype.type(0))


def _relu_grad(dy, x, alpha):
    return np.where(x > 0, dy, dy * alpha)


def _sgd(p, g0, b0, neg_lr, wd, mom, damp_c, flags):
    g = g0 + wd * p if flags & 1 else g0
    b = b0
    if flags & 2:
        b = g.copy() if flags & 8 else b0 * mom + damp_c * g
        g = g + mom * b if flags & 4 else b
    return p + neg_lr * g, np.array(b)


def _adam(p, g, m0, v0, decay, use_decay, wd, use_wd, w1, small_w1, omw1, b2, c2, bc2, eps, step):
    q = p * decay if use_decay else p
    gg = g + wd * q if use_wd else g
    d = gg - m0
    m = m0 + w1 * d if small_w1 else gg - d * omw1
    v = v0 * b2 + c2 * gg * gg
    return q + step * m / (np.sqrt(v) / bc2 + eps), m, v


_TWO_C = 2 * math.sqrt(2 / math.pi)


def _sigmoid_u(x):
    u = _TWO_C * (x + 0.044715 * x * x * x)
    return 1 / (1 + np.exp(-u))


def _gelu(tanh):
    def f(x):
        return x * _sigmoid_u(x) if tanh else 0.5 * x * _erfc(-x / math.sqrt(2))

    return f


def _gelu_grad(tanh):
    def f(dy, x):
        if tanh:
            s = _sigmoid_u(x)
            return dy * (s + x * s * (1 - s) * _TWO_C * (1 + 3 * 0.044715 * x * x))
        d = 0.5 * _erfc(-x / math.sqrt(2)) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        return dy * d

    return f


def _dropout(x, base, key, rate, scale, ncol):
    with np.errstate(over="ignore"):
        idx = base + np.arange(ncol, dtype=np.uint64)
        z = np.uint64(key) + (idx + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    keep = (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53)) >= rate
    return np.where(keep, x * scale, x.dtype.type(0)), keep


def _bn_affine(x, a, b, relu):
    v = x * a + b
    return np.where(relu & (v < 0), x.dtype.type(0), v).astype(x.dtype)


def _bn_relu_mask(dy, z):
    return np.where(z > 0, dy, dy * dy.dtype.type(0))


def _bn_grad_apply(g, x, a, b, e, m):
    return (a * g + b * (x - m) + e).astype(x.dtype)


#: each dfdl element-wise kernel's body in numpy, by the kernel's name
ELEMENTWISE = {
    "dfdl_relu": _relu,
    "dfdl_relu_grad": _relu_grad,
    "dfdl_sgd": _sgd,
    "dfdl_adam": _adam,
    "dfdl_gelu_False": _gelu(False),
    "dfdl_gelu_True": _gelu(True),
    "dfdl_gelu_grad_False": _gelu_grad(False),
    "dfdl_gelu_grad_True": _gelu_grad(True),
    "dfdl_dropout": _dropout,
    "dfdl_bn_affine": _bn_affine,
    "dfdl_bn_relu_mask": _bn_relu_mask,
    "dfdl_bn_grad_apply": _bn_grad_apply,
}


class ElementwiseKernel:
    """The kernel named ``name``, run by its numpy body (:data:`ELEMENTWISE`)."""

    def __init__(self, in_params, out_params, operation, name, preamble="", options=()):
        if name not in ELEMENTWISE:
            raise KeyError(f"the cupy stand-in has no body for the kernel {name!r}")
        self.fn = _on_device(ELEMENTWISE[name])

    def __call__(self, *args):
        return self.fn(*args)


class _MemoryPool:
    """cupy's memory pool as far as dfdl reads it (the stand-in allocates no device
    memory: none is in use)."""

    def used_bytes(self) -> int:
        return 0


_POOL = _MemoryPool()


def get_default_memory_pool() -> _MemoryPool:
    return _POOL
