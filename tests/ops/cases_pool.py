"""OpCases for MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool (batch 5, channels 3+).

onnx's ReferenceEvaluator is the oracle except where it is wrong: MaxPool Indices when
strides and dilations are all 1 (per-channel offsets), ``ceil_mode`` windows whose
overhang is 2 or more (it shifts the windows), and ``auto_pad`` with dilations (it
ignores them). Those cases use ``_pool_naive``, the spec written as plain loops.
The backward ops (dfdl.MaxPoolGrad, dfdl.AveragePoolGrad) are checked against loops too.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from tests.ops.case import OpCase, rand

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _naive_windows(
    shape,
    *,
    kernel_shape,
    strides=None,
    pads=None,
    dilations=None,
    ceil_mode=0,
    auto_pad="NOTSET",
):
    """Output shape, and per output index ``(n, c, *o)`` its taps inside the input (in
    scan order) and its count of taps before ``L + pad_end``. Window o starts at
    o*stride - pad_begin."""
    nd = len(shape) - 2
    sp = shape[2:]
    s = strides or [1] * nd
    d = dilations or [1] * nd
    ek = [(k - 1) * dd + 1 for k, dd in zip(kernel_shape, d, strict=True)]
    if auto_pad.startswith("SAME"):
        out = [-(-L // ss) for L, ss in zip(sp, s, strict=True)]
        tot = [max(0, (o - 1) * ss + e - L) for o, ss, e, L in zip(out, s, ek, sp, strict=True)]
        pb = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in tot]
        pe = [t - b for t, b in zip(tot, pb, strict=True)]
    else:
        p = pads or [0] * (2 * nd)
        pb, pe = p[:nd], p[nd:]
        out = []
        for L, b, e, w, ss in zip(sp, pb, pe, ek, s, strict=True):
            o = (L + b + e - w) // ss + 1
            if ceil_mode and (L + b + e - w) % ss:
                o += 1
                if (o - 1) * ss >= L + b:
                    o -= 1
            out.append(o)
    out_shape = tuple(shape[:2]) + tuple(out)
    windows = []
    for n, c, *o in itertools.product(*(range(v) for v in out_shape)):
        where, cnt = [], 0
        for t in itertools.product(*(range(k) for k in kernel_shape)):
            pos = [oi * ss - b + ti * dd for oi, ss, b, ti, dd in zip(o, s, pb, t, d, strict=True)]
            if all(p < L + e for p, L, e in zip(pos, sp, pe, strict=True)):
                cnt += 1
            if all(0 <= p < L for p, L in zip(pos, sp, strict=True)):
                where.append((n, c, *pos))
        windows.append(((n, c, *o), where, cnt))
    return out_shape, windows


def _pool_naive(X, *, op, count_include_pad=0, storage_order=0, **geom):
    """Pooling as plain loops: taps outside [0, L) are skipped (max) or not counted
    (average; count_include_pad counts taps before L + pad_end)."""
    out_shape, windows = _naive_windows(X.shape, **geom)
    sp = X.shape[2:]
    Y = np.zeros(out_shape, X.dtype)
    idx = np.zeros(out_shape, np.int64)
    for o, where, cnt in windows:
        vals = [X[w] for w in where]
        if op == "MaxPool":
            i = int(np.argmax(vals))
            Y[o] = vals[i]
            order = "C" if storage_order == 0 else "F"
            n, c = o[:2]
            idx[o] = (n * X.shape[1] + c) * int(np.prod(sp)) + np.ravel_multi_index(
                where[i][2:], sp, order=order
            )
        else:
            Y[o] = np.sum(vals, dtype=np.float64) / (cnt if count_include_pad else len(vals))
    return [Y, idx] if op == "MaxPool" else [Y]


def _max_pool_grad_naive(dY, X, **geom):
    """Each dY element added to the first maximum of its window."""
    _, windows = _naive_windows(X.shape, **geom)
    dx = np.zeros(X.shape, np.float64)
    for o, where, _ in windows:
        if where:
            dx[where[int(np.argmax([X[w] for w in where]))]] += dY[o]
    return [dx.astype(X.dtype)]


def _avg_pool_grad_naive(dY, *, input_shape, count_include_pad=0, **geom):
    """Each dY element divided by its window's count and added to the window's taps."""
    _, windows = _naive_windows(tuple(input_shape), **geom)
    dx = np.zeros(input_shape, np.float64)
    for o, where, cnt in windows:
        for w in where:
            dx[w] += dY[o] / (cnt if count_include_pad else len(where))
    return [dx.astype(dY.dtype)]


def _naive(op, **attrs):
    return functools.partial(_pool_naive, op=op, **attrs)


def _global_naive(fn, X):
    return [fn(X, axis=tuple(range(2, X.ndim)), keepdims=True).astype(X.dtype)]


def _max_cases() -> list[OpCase]:
    x2 = rand(5, 3, 9, 7, seed=1)
    x1 = rand(5, 4, 11, seed=2)
    x3 = rand(5, 3, 5, 6, 7, seed=3)
    a_resnet = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    a_ceil = {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}
    a_dil = {"kernel_shape": [2, 3], "strides": [1, 2], "dilations": [2, 1], "pads": [1, 0, 0, 2]}
    a_idx = {"kernel_shape": [3, 2], "strides": [1, 1], "pads": [1, 0, 1, 1]}
    return [
        OpCase("MaxPool", [x2], a_resnet, id="2d_resnet"),
        OpCase("MaxPool", [x2], a_ceil, id="2d_ceil"),
        OpCase("MaxPool", [x2], a_dil, id="2d_dil_asym_pads"),
        OpCase(
            "MaxPool",
            [x2],
            {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [0, 1, 0, 1], "ceil_mode": 1},
            id="2d_ceil_last_window_dropped",
        ),
        OpCase(
            "MaxPool",
            [x2],
            {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
            id="2d_same_upper",
        ),
        OpCase(
            "MaxPool", [x2], {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER"}, id="2d_same_lower"
        ),
        OpCase(
            "MaxPool",
            [x2],
            {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [2, 1]},
            id="2d_valid",
        ),
        OpCase("MaxPool", [x1], {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, id="1d"),
        OpCase("MaxPool", [x3], {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}, id="3d"),
        OpCase(
            "MaxPool",
            [x3],
            {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "pads": [1] * 6, "ceil_mode": 1},
            id="3d_pad_ceil",
        ),
        OpCase("MaxPool", [x2.astype(np.float64)], a_resnet, id="2d_f64"),
        OpCase(
            "MaxPool",
            [rand(5, 3, 9, 7, seed=4, low=0, high=250).astype(np.uint8)],
            a_resnet,
            id="2d_uint8",
        ),
        OpCase(
            "MaxPool",
            [rand(5, 3, 9, 7, seed=5, low=-120, high=120).astype(np.int8)],
            a_ceil,
            id="2d_int8",
        ),
        OpCase("MaxPool", [x2.astype(np.float16)], a_resnet, id="2d_f16"),
        # Indices: flat offsets into the whole tensor, row- or column-major spatial order
        OpCase("MaxPool", [x2], a_resnet, n_outputs=2, id="2d_indices"),
        OpCase(
            "MaxPool", [x2], {**a_dil, "storage_order": 1}, n_outputs=2, id="2d_indices_colmajor"
        ),
        OpCase(
            "MaxPool",
            [x3],
            {"kernel_shape": [2, 3, 2], "strides": [2, 2, 2], "storage_order": 1},
            n_outputs=2,
            id="3d_indices_colmajor",
        ),
        OpCase(
            "MaxPool",
            [x2],
            a_idx,
            n_outputs=2,
            id="2d_indices_stride1",
            reference=_naive("MaxPool", **a_idx),
        ),
        OpCase(
            "MaxPool",
            [x1],
            {"kernel_shape": [2], "strides": [3], "ceil_mode": 1},
            n_outputs=2,
            id="1d_indices_ceil",
        ),
    ]


def _avg_cases() -> list[OpCase]:
    x2 = rand(5, 3, 9, 7, seed=11)
    x1 = rand(5, 4, 11, seed=12)
    x3 = rand(5, 3, 5, 6, 7, seed=13)
    a_pad = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    a_ceil = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 0], "ceil_mode": 1}
    a_ceil3 = {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 0, 0, 0], "ceil_mode": 1}
    a_same_dil = {"kernel_shape": [2, 2], "dilations": [2, 1], "auto_pad": "SAME_UPPER"}
    return [
        OpCase("AveragePool", [x2], a_pad, id="2d_pad", **TOL),
        OpCase("AveragePool", [x2], {**a_pad, "count_include_pad": 1}, id="2d_pad_incl", **TOL),
        OpCase("AveragePool", [x2], a_ceil, id="2d_ceil", **TOL),
        OpCase("AveragePool", [x2], {**a_ceil, "count_include_pad": 1}, id="2d_ceil_incl", **TOL),
        # a ceil_mode overhang of 2: onnx's evaluator shifts its windows, so use the loops
        OpCase(
            "AveragePool",
            [x2],
            {**a_ceil3, "count_include_pad": 1},
            id="2d_ceil_overhang2",
            reference=_naive("AveragePool", **a_ceil3, count_include_pad=1),
            **TOL,
        ),
        OpCase(
            "AveragePool",
            [x2],
            {"kernel_shape": [2, 3], "dilations": [2, 2], "pads": [1, 2, 0, 1]},
            id="2d_dil",
            **TOL,
        ),
        OpCase(
            "AveragePool",
            [x2],
            {
                "kernel_shape": [2, 3],
                "dilations": [2, 2],
                "pads": [1, 2, 0, 1],
                "count_include_pad": 1,
            },
            id="2d_dil_incl",
            **TOL,
        ),
        OpCase(
            "AveragePool",
            [x2],
            {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
            id="2d_same_upper",
            **TOL,
        ),
        OpCase(
            "AveragePool",
            [x2],
            {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER", "count_include_pad": 1},
            id="2d_same_lower_incl",
            **TOL,
        ),
        OpCase(
            "AveragePool",
            [x2],
            a_same_dil,
            id="2d_same_dilated",
            reference=_naive("AveragePool", **a_same_dil),
            **TOL,
        ),
        OpCase(
            "AveragePool",
            [x2],
            {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [1, 2]},
            id="2d_valid",
            **TOL,
        ),
        OpCase(
            "AveragePool",
            [x1],
            {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "count_include_pad": 1},
            id="1d_incl",
            **TOL,
        ),
        OpCase(
            "AveragePool", [x3], {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}, id="3d", **TOL
        ),
        OpCase(
            "AveragePool",
            [x3],
            {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "pads": [1] * 6, "ceil_mode": 1},
            id="3d_pad_ceil",
            **TOL,
        ),
        OpCase(
            "AveragePool",
            [x2.astype(np.float64)],
            {**a_pad, "count_include_pad": 1},
            id="2d_f64",
            **TOL,
        ),
        OpCase("AveragePool", [x2.astype(np.float16)], a_pad, id="2d_f16", rtol=2e-3, atol=2e-3),
    ]


def _global_cases() -> list[OpCase]:
    cases = []
    for op in ("GlobalAveragePool", "GlobalMaxPool"):
        # onnx's GlobalMaxPool reduces the wrong axes unless there are 2 spatial axes
        fn = np.mean if op == "GlobalAveragePool" else np.max
        ref = None if op == "GlobalAveragePool" else functools.partial(_global_naive, fn)
        cases += [
            OpCase(op, [rand(5, 4, 11, seed=21)], id="1d", reference=ref, **TOL),
            OpCase(op, [rand(5, 7, 9, 7, seed=22)], id="2d", **TOL),
            OpCase(op, [rand(5, 3, 5, 6, 7, seed=23)], id="3d", reference=ref, **TOL),
            OpCase(op, [rand(5, 7, 9, 7, seed=24, dtype=np.float64)], id="2d_f64", **TOL),
        ]
    return cases


def _dy(x_shape, seed, dtype=np.float32, **geom):
    """A random output gradient of the pooled shape."""
    out_shape, _ = _naive_windows(x_shape, **geom)
    return rand(*out_shape, seed=seed, dtype=dtype)


def _max_grad_case(x, geom, id, seed=0, **kw) -> OpCase:
    dy = _dy(x.shape, seed, x.dtype, **geom)
    ref = functools.partial(_max_pool_grad_naive, **geom)
    return OpCase("MaxPoolGrad", [dy, x], geom, id=id, domain="dfdl", reference=ref, **kw)


def _avg_grad_case(shape, geom, id, seed=0, dtype=np.float32, incl=0, **kw) -> OpCase:
    dy = _dy(shape, seed, dtype, **geom)
    attrs = {**geom, "count_include_pad": incl, "input_shape": list(shape)}
    ref = functools.partial(_avg_pool_grad_naive, **attrs)
    return OpCase("AveragePoolGrad", [dy], attrs, id=id, domain="dfdl", reference=ref, **kw)


def _grad_cases() -> list[OpCase]:
    x2 = rand(5, 3, 9, 7, seed=31)
    x1 = rand(5, 4, 11, seed=32)
    x3 = rand(5, 3, 5, 6, 7, seed=33)
    # few distinct values: many ties, which must go to the first max like the forward
    ties = np.round(rand(5, 3, 9, 7, seed=34)).astype(np.float32)
    a_resnet = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    a_ceil = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 0], "ceil_mode": 1}
    a_ceil3 = {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 0, 0, 0], "ceil_mode": 1}
    a_dil = {"kernel_shape": [2, 3], "strides": [1, 2], "dilations": [2, 1], "pads": [1, 0, 0, 2]}
    a_same = {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER", "strides": [2, 2]}
    a_same_low = {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER"}
    a_1d = {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}
    a_3d = {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "pads": [1] * 6, "ceil_mode": 1}
    tol = {"rtol": 1e-5, "atol": 1e-5}
    return [
        _max_grad_case(x2, a_resnet, "2d_resnet", **tol),
        _max_grad_case(x2, {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, "2d_ceil"),
        _max_grad_case(x2, a_dil, "2d_dil_asym_pads", **tol),
        _max_grad_case(x2, a_same, "2d_same_upper", **tol),
        _max_grad_case(x2, {"kernel_shape": [3, 3]}, "2d_overlapping", **tol),
        _max_grad_case(ties, a_resnet, "2d_ties", **tol),
        _max_grad_case(x1, a_1d, "1d", **tol),
        _max_grad_case(x3, a_3d, "3d_pad_ceil", **tol),
        _max_grad_case(x2.astype(np.float64), a_resnet, "2d_f64", **tol),
        _max_grad_case(x2.astype(np.float16), a_resnet, "2d_f16", rtol=2e-3, atol=2e-3),
        _max_grad_case(x2, {"kernel_shape": [9, 7]}, "2d_global", **tol),
        _avg_grad_case(x2.shape, a_resnet, "2d_pad", **tol),
        _avg_grad_case(x2.shape, a_resnet, "2d_pad_incl", incl=1, **tol),
        _avg_grad_case(x2.shape, a_ceil, "2d_ceil_incl", incl=1, **tol),
        _avg_grad_case(x2.shape, a_ceil3, "2d_ceil_overhang2_incl", incl=1, **tol),
        _avg_grad_case(x2.shape, a_dil, "2d_dil", **tol),
        _avg_grad_case(x2.shape, a_dil, "2d_dil_incl", incl=1, **tol),
        _avg_grad_case(x2.shape, a_same_low, "2d_same_lower_incl", incl=1, **tol),
        _avg_grad_case(x1.shape, a_1d, "1d_incl", incl=1, **tol),
        _avg_grad_case(x3.shape, a_3d, "3d_pad_ceil", **tol),
        _avg_grad_case(x2.shape, a_resnet, "2d_f64", dtype=np.float64, **tol),
        _avg_grad_case(x2.shape, a_resnet, "2d_f16", dtype=np.float16, rtol=2e-3, atol=2e-3),
        _avg_grad_case((5, 7, 9, 7), {"kernel_shape": [9, 7]}, "2d_global", **tol),
    ]


CASES = _max_cases() + _avg_cases() + _global_cases() + _grad_cases()
