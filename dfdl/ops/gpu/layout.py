"""cupy kernels of the layout ops a step runs on its activations: Transpose, Slice and
Gather with their gradients, Flatten, Concat and Split. Their results are new C-ordered arrays (not
views), so a tile's layout, and with it every later kernel's rounding, is the same in
every run.

Example:
    >>> from dfdl.ops import REGISTRY
    >>> REGISTRY["Transpose"].kernel("gpu").kernel.__name__
    'transpose'
"""

from __future__ import annotations

import numpy as np

from dfdl.ops.gpu.device import cupy, to_device
from dfdl.ops.gpu.kernels import floats
from dfdl.ops.registry import DFDL_DOMAIN, kernel

#: GatherGrad's one-hot matrix (rows x table rows) is built up to this many bytes; a
#: larger one runs on the host (a scatter-add with atomics would not repeat bit for bit)
ONE_HOT_BYTES = 256 * 2**20


def _any(*xs, **attrs) -> bool:
    return getattr(xs[0], "dtype", None) is not None


@kernel("Transpose", "gpu", accepts=_any)
def transpose(data, *, perm):
    """The axes permuted by ``perm``, as a new C-ordered array."""
    return cupy().ascontiguousarray(to_device(data).transpose(perm))


@kernel("Slice", "gpu", accepts=_any)
def slice_(data, starts, ends, axes=None, steps=None, *, index):
    """``data[index]``, as a new array."""
    return cupy().ascontiguousarray(to_device(data)[index])


@kernel("SliceGrad", "gpu", accepts=_any, domain=DFDL_DOMAIN)
def slice_grad(dY, starts, ends, axes=None, steps=None, *, full, index):
    """``dY`` written at ``index`` of zeros of the shape ``full``."""
    dy = to_device(dY)
    out = cupy().zeros(full, dtype=dy.dtype)
    out[index] = dy
    return out


def _host_indices(data, indices, **attrs) -> bool:
    return isinstance(indices, np.ndarray) and indices.dtype.kind in "iu"


def _checked(indices: np.ndarray, n: int, op: str) -> np.ndarray:
    """Host indices range-checked (as the CPU's) and made non-negative."""
    idx = indices.astype(np.int64, copy=False)
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"{op}: index out of range [-{n}, {n}) on the gathered axis")
    return np.where(idx < 0, idx + n, idx)


@kernel("Gather", "gpu", accepts=_host_indices)
def gather(data, indices, *, axis):
    """Entries of ``data`` along ``axis`` at ``indices`` (host indices, checked there)."""
    x = to_device(data)
    idx = to_device(_checked(indices, x.shape[axis], "Gather"))
    return cupy().take(x, idx, axis=axis)


def _gather_grad_accepts(dY, indices, *, axis=0, data_shape, **attrs) -> bool:
    shape = tuple(int(d) for d in np.asarray(data_shape).reshape(-1))
    return (
        floats(dY)
        and _host_indices(None, indices)
        and len(shape) > 0
        and axis in (0, -len(shape))
        and indices.size * shape[0] * dY.dtype.itemsize <= ONE_HOT_BYTES
    )


@kernel("GatherGrad", "gpu", accepts=_gather_grad_accepts, domain=DFDL_DOMAIN)
def gather_grad(dY, indices, *, axis, data_shape):
    """``dY`` summed into zeros of ``data_shape`` at ``indices`` along axis 0 (the only
    one its ``accepts`` takes), as a one-hot GEMM (cuBLAS sums in a fixed order: repeated
    indices add up the same way in every run)."""
    cp = cupy()
    shape = data_shape
    dy = to_device(dY)
    idx = to_device(_checked(indices, shape[0], "GatherGrad").reshape(-1))
    one_hot = (idx[:, None] == cp.arange(shape[0])[None, :]).astype(dy.dtype)
    rows = dy.reshape(idx.size, -1)
    return cp.matmul(one_hot.T, rows).reshape(shape)


@kernel("Flatten", "gpu", accepts=_any)
def flatten(input, *, target):
    """``input`` as the 2-D shape ``target``."""
    return cupy().ascontiguousarray(to_device(input)).reshape(target)


def _all_arrays(*inputs, **attrs) -> bool:
    return all(getattr(x, "dtype", None) == inputs[0].dtype for x in inputs)


@kernel("Concat", "gpu", accepts=_all_arrays)
def concat(*inputs, axis):
    """``inputs`` joined along ``axis``."""
    return cupy().concatenate([to_device(x) for x in inputs], axis=axis)


@kernel("Split", "gpu", accepts=_any)
def split(input, split=None, *, axis, cuts):
    """``input`` cut along ``axis`` at ``cuts``, each part a new C-ordered array."""
    cp = cupy()
    return tuple(cp.ascontiguousarray(p) for p in cp.split(to_device(input), list(cuts), axis=axis))
