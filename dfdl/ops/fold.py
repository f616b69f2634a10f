"""Constant-path ops: Shape, Size, Constant, ConstantOfShape, Range.

With static shapes these only ever run at plan time, while the loader folds shape
chains into constants; they are never tiled or run as tasks (``fold_only``).

Example:
    >>> from dfdl.ops import REGISTRY
    >>> REGISTRY["Shape"].forward(np.zeros((2, 3))), REGISTRY["Shape"].fold_only
    (array([2, 3]), True)
"""

from __future__ import annotations

import math

import numpy as np

from dfdl.errors import ModelError, ShapeError, UnsupportedOpError
from dfdl.ops.registry import TensorType, register

_FOLD = {"fold_only": True, "differentiable": False, "tile": None}


def _type_of(x: np.ndarray) -> TensorType:
    return TensorType(x.shape, x.dtype)


# ---------------------------------------------------------------- Shape / Size


def _shape_slice(shape: tuple[int, ...], start: int, end: int | None) -> np.ndarray:
    # python slicing clamps out-of-range start/end exactly as the ONNX spec asks
    return np.array(shape[start:end], dtype=np.int64)


def _shape_shape(inputs, consts, *, start=0, end=None, **attrs):
    return [TensorType((len(_shape_slice(inputs[0].shape, start, end)),), np.int64)]


@register("Shape", shape=_shape_shape, **_FOLD)
def Shape(data, *, start=0, end=None):
    """The shape of ``data`` (axes ``start:end``) as a 1-D int64 tensor."""
    return _shape_slice(np.shape(data), start, end)


def _size_shape(inputs, consts, **attrs):
    return [TensorType((), np.int64)]


@register("Size", shape=_size_shape, **_FOLD)
def Size(data):
    """The number of elements of ``data`` as an int64 scalar."""
    return np.asarray(np.size(data), dtype=np.int64)


# ---------------------------------------------------------------- Constant


def tensor_attr(value) -> np.ndarray:
    """A TENSOR attribute as an array (the loader gives arrays; a TensorProto also works)."""
    if hasattr(value, "raw_data") and hasattr(value, "dims"):
        from onnx import numpy_helper  # only when handed a raw protobuf

        return numpy_helper.to_array(value)
    return np.asarray(value)


def _dense(sparse) -> np.ndarray:
    """A SparseTensorProto (or an already dense array) as a dense array."""
    if isinstance(sparse, np.ndarray):
        return sparse
    from onnx import numpy_helper  # only for sparse constants, which are rare

    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dims = tuple(int(d) for d in sparse.dims)
    out = np.zeros(math.prod(dims), dtype=values.dtype)
    # indices are either linear (NNZ,) or coordinates (NNZ, rank)
    flat = indices if indices.ndim == 1 else np.ravel_multi_index(indices.T, dims)
    out[flat] = values
    return out.reshape(dims)


def _constant_value(attrs: dict) -> np.ndarray:
    given = {k: v for k, v in attrs.items() if v is not None}
    if len(given) != 1:
        raise ModelError(f"Constant needs exactly one value attribute, got {sorted(given)}")
    ((name, v),) = given.items()
    if name == "value":
        return tensor_attr(v).copy()
    if name == "sparse_value":
        return _dense(v)
    if name == "value_float":
        return np.array(v, dtype=np.float32)
    if name == "value_floats":
        return np.array(v, dtype=np.float32).reshape(-1)
    if name == "value_int":
        return np.array(v, dtype=np.int64)
    if name == "value_ints":
        return np.array(v, dtype=np.int64).reshape(-1)
    if name == "value_string":
        return np.array(v, dtype=object)
    if name == "value_strings":
        return np.array(list(v), dtype=object).reshape(-1)
    raise UnsupportedOpError(f"Constant: unknown attribute {name}", op_type="Constant")


def _constant_shape(inputs, consts, **attrs):
    sparse = attrs.get("sparse_value")
    if (
        sparse is not None
        and not isinstance(sparse, np.ndarray)
        and len([v for v in attrs.values() if v is not None]) == 1
    ):
        # the dense shape and dtype, without densifying (the cap is checked first)
        return [TensorType(tuple(int(d) for d in sparse.dims), tensor_attr(sparse.values).dtype)]
    return [_type_of(_constant_value(attrs))]


@register("Constant", shape=_constant_shape, **_FOLD)
def Constant(
    *,
    value=None,
    sparse_value=None,
    value_float=None,
    value_floats=None,
    value_int=None,
    value_ints=None,
    value_string=None,
    value_strings=None,
):
    """The tensor given by whichever one ``value*`` attribute is set."""
    return _constant_value(
        {
            "value": value,
            "sparse_value": sparse_value,
            "value_float": value_float,
            "value_floats": value_floats,
            "value_int": value_int,
            "value_ints": value_ints,
            "value_string": value_string,
            "value_strings": value_strings,
        }
    )


# ---------------------------------------------------------------- ConstantOfShape


def _fill_value(value) -> np.ndarray:
    if value is None:
        return np.zeros((), dtype=np.float32)
    value = tensor_attr(value)
    if value.size != 1:
        raise ModelError(f"ConstantOfShape: value must have one element, got {value.size}")
    return value.reshape(())


def _dims(shape) -> tuple[int, ...]:
    dims = tuple(int(d) for d in np.asarray(shape).reshape(-1))
    if any(d < 0 for d in dims):
        raise ShapeError(f"ConstantOfShape: negative dimension in {dims}")
    return dims


def _constant_of_shape_shape(inputs, consts, *, value=None, **attrs):
    return [TensorType(_dims(consts[0]), _fill_value(value).dtype)]


@register("ConstantOfShape", shape=_constant_of_shape_shape, const_inputs=(0,), **_FOLD)
def ConstantOfShape(input, *, value=None):
    """A tensor of shape ``input`` filled with ``value`` (float32 0 by default)."""
    v = _fill_value(value)
    return np.full(_dims(input), v, dtype=v.dtype)


# ---------------------------------------------------------------- Range

_STASH = {1: np.float32, 11: np.float64}


def _range_length(start, limit, delta) -> int:
    """How many values ``Range`` yields, without making them."""
    s, lim, d = (np.asarray(x).item() for x in (start, limit, delta))
    if d == 0:
        raise ModelError("Range: delta is 0")
    if np.issubdtype(np.asarray(start).dtype, np.integer):
        return max(-(-(lim - s) // d), 0)  # exact integer ceil
    return max(math.ceil((lim - s) / d), 0)


def _range(start, limit, delta, stash_type: int = 1) -> np.ndarray:
    dtype = np.asarray(start).dtype
    n = _range_length(start, limit, delta)
    s, d = np.asarray(start).item(), np.asarray(delta).item()
    if np.issubdtype(dtype, np.integer):
        return (s + np.arange(n, dtype=np.int64) * d).astype(dtype)
    work = np.float64
    if dtype.itemsize < 4:
        if stash_type not in _STASH:
            raise UnsupportedOpError(f"Range: stash_type {stash_type}", op_type="Range")
        work = _STASH[stash_type]
    return (work(s) + np.arange(n, dtype=work) * work(d)).astype(dtype)


def _range_shape(inputs, consts, *, stash_type=1, **attrs):
    dtype = np.asarray(consts[0]).dtype
    if not np.issubdtype(dtype, np.integer) and dtype.itemsize < 4 and stash_type not in _STASH:
        raise UnsupportedOpError(f"Range: stash_type {stash_type}", op_type="Range")
    return [TensorType((_range_length(*consts[:3]),), dtype)]


@register("Range", shape=_range_shape, const_inputs=(0, 1, 2), **_FOLD)
def Range(start, limit, delta, *, stash_type=1):
    """``start, start + delta, ...`` up to ``limit`` (exclusive)."""
    return _range(start, limit, delta, stash_type)
