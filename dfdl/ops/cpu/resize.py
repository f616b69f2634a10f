"""numba kernels for Resize mode "linear" and its adjoint (float32/float64), per axis.

Each pass views the tensor as ``(outer, L, inner)`` and computes
``out[o, j, i] = sum_k w[j, k] * x[o, idx[j, k], i]`` with a float64 accumulator;
intermediate passes keep the input dtype. Other modes and dtypes use the numpy forward.
``ResizeGrad`` runs the adjoint passes (last axis first) as float64 scatter-adds.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from dfdl.ops import resize as ref

_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@numba.njit(cache=True, nogil=True)
def _resize_axis(x, out, idx, w, outside, fill):
    O, _, I = x.shape
    J, n = idx.shape
    for o in range(O):
        for j in range(J):
            if outside[j]:
                out[o, j, :] = fill
                continue
            for i in range(I):
                acc = 0.0
                for k in range(n):
                    acc += w[j, k] * x[o, idx[j, k], i]
                out[o, j, i] = acc


@numba.njit(cache=True, nogil=True)
def _resize_last_axis(x, out, idx, w, outside, fill):
    """``_resize_axis`` for the innermost axis (inner == 1), on 2-D views."""
    O, _ = x.shape
    J, n = idx.shape
    for o in range(O):
        xr = x[o]
        orow = out[o]
        for j in range(J):
            if outside[j]:
                orow[j] = fill
                continue
            acc = 0.0
            for k in range(n):
                acc += w[j, k] * xr[idx[j, k]]
            orow[j] = acc


def Resize(
    X,
    roi=None,
    scales=None,
    sizes=None,
    *,
    antialias=0,
    axes=None,
    coordinate_transformation_mode="half_pixel",
    cubic_coeff_a=-0.75,
    exclude_outside=0,
    extrapolation_value=0.0,
    keep_aspect_ratio_policy="stretch",
    mode="nearest",
    nearest_mode="round_prefer_floor",
    dfdl_tile=None,
):
    """numba linear Resize; the numpy forward for nearest and other dtypes."""
    if mode != "linear" or X.dtype not in _KERNEL_DTYPES:
        return ref.Resize(
            X,
            roi,
            scales,
            sizes,
            antialias=antialias,
            axes=axes,
            coordinate_transformation_mode=coordinate_transformation_mode,
            cubic_coeff_a=cubic_coeff_a,
            exclude_outside=exclude_outside,
            extrapolation_value=extrapolation_value,
            keep_aspect_ratio_policy=keep_aspect_ratio_policy,
            mode=mode,
            nearest_mode=nearest_mode,
            dfdl_tile=dfdl_tile,
        )
    ref.check_attrs(mode, coordinate_transformation_mode, nearest_mode, keep_aspect_ratio_policy)
    attrs = dict(
        axes=axes,
        keep_aspect_ratio_policy=keep_aspect_ratio_policy,
        coordinate_transformation_mode=coordinate_transformation_mode,
        mode=mode,
        nearest_mode=nearest_mode,
        antialias=antialias,
        exclude_outside=exclude_outside,
    )
    y = np.ascontiguousarray(X)
    passes = ref.forward_passes(X.shape, roi, scales, sizes, attrs, dfdl_tile)
    for a, idx, w, outside, n_out in passes:
        L = y.shape[a]
        if outside is None:
            outside = np.zeros(len(idx), bool)
        outer, inner = math.prod(y.shape[:a]), math.prod(y.shape[a + 1 :])
        new_shape = y.shape[:a] + (n_out,) + y.shape[a + 1 :]
        out = np.empty(new_shape, X.dtype)
        args = (idx.astype(np.int64), np.ascontiguousarray(w), outside, float(extrapolation_value))
        if inner == 1:
            _resize_last_axis(y.reshape(outer, L), out.reshape(outer, n_out), *args)
        else:
            _resize_axis(y.reshape(outer, L, inner), out.reshape(outer, n_out, inner), *args)
        y = out
    return X.copy() if y is X else y


@numba.njit(cache=True, nogil=True)
def _scatter_axis(g, out, idx, w):
    """Adjoint of one pass: ``out[o, idx[j, k], i] += w[j, k] * g[o, j, i]`` (out zeroed)."""
    O, J, I = g.shape
    n = idx.shape[1]
    for o in range(O):
        for j in range(J):
            for k in range(n):
                wk = w[j, k]
                if wk == 0.0:
                    continue
                src = idx[j, k]
                for i in range(I):
                    out[o, src, i] += wk * g[o, j, i]


def ResizeGrad(
    dY,
    roi=None,
    scales=None,
    sizes=None,
    *,
    input_shape=None,
    antialias=0,
    axes=None,
    coordinate_transformation_mode="half_pixel",
    cubic_coeff_a=-0.75,
    exclude_outside=0,
    extrapolation_value=0.0,
    keep_aspect_ratio_policy="stretch",
    mode="nearest",
    nearest_mode="round_prefer_floor",
):
    """numba dfdl.ResizeGrad (float64 accumulation); the numpy forward for other dtypes."""
    if dY.dtype not in _KERNEL_DTYPES:
        return ref.ResizeGrad(
            dY,
            roi,
            scales,
            sizes,
            input_shape=input_shape,
            antialias=antialias,
            axes=axes,
            coordinate_transformation_mode=coordinate_transformation_mode,
            cubic_coeff_a=cubic_coeff_a,
            exclude_outside=exclude_outside,
            extrapolation_value=extrapolation_value,
            keep_aspect_ratio_policy=keep_aspect_ratio_policy,
            mode=mode,
            nearest_mode=nearest_mode,
        )
    ref.check_attrs(mode, coordinate_transformation_mode, nearest_mode, keep_aspect_ratio_policy)
    shape = tuple(int(v) for v in input_shape)
    plan = ref.resize_plan(
        shape, roi, scales, sizes, axes, keep_aspect_ratio_policy, coordinate_transformation_mode
    )
    attrs = dict(
        mode=mode,
        coordinate_transformation_mode=coordinate_transformation_mode,
        nearest_mode=nearest_mode,
        antialias=antialias,
        exclude_outside=exclude_outside,
    )
    g = np.ascontiguousarray(dY, dtype=np.float64)
    for a, L, idx, w in ref.adjoint_passes(plan, shape, attrs):
        outer, inner = math.prod(g.shape[:a]), math.prod(g.shape[a + 1 :])
        out = np.zeros(g.shape[:a] + (L,) + g.shape[a + 1 :])
        _scatter_axis(
            g.reshape(outer, g.shape[a], inner),
            out.reshape(outer, L, inner),
            idx.astype(np.int64),
            np.ascontiguousarray(w, dtype=np.float64),
        )
        g = out
    return g.astype(dY.dtype)
