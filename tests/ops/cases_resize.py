"""OpCases for Resize: nearest, linear and cubic, 1-D/2-D/3-D spatial, scales and sizes.

onnx's ReferenceEvaluator is the oracle. Scales are picked so that no source
coordinate lands within rounding error of an integer from the "wrong" side (the
evaluator picks its neighbours from ``x + 1``, which can round differently than ``x``).
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from tests.ops.case import OpCase, rand

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _f32(*v):
    return np.array(v, np.float32)


def _i64(*v):
    return np.array(v, np.int64)


def _positive_axes_reference(X, roi, scales, sizes):
    """The evaluator rejects negative axes: ask it with the same axes made positive."""
    case = OpCase(
        "Resize",
        [X, roi, scales, sizes],
        {"axes": [3, 2], "keep_aspect_ratio_policy": "not_smaller"},
        consts=(3,),
    )
    return case.expected()


def _nearest_cases() -> list[OpCase]:
    x2 = rand(5, 3, 9, 7, seed=1)
    x3 = rand(5, 3, 5, 6, 7, seed=2)
    up2 = _f32(1, 1, 2, 2)
    return [
        OpCase("Resize", [x2, None, up2], id="nearest_2d_up2", consts=(2,)),
        OpCase(
            "Resize",
            [x2, None, up2],
            {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
            consts=(2,),
            id="nearest_2d_torch",
        ),
        OpCase(
            "Resize",
            [x2, None, _f32(1, 1, 0.5, 1.5)],
            {"nearest_mode": "round_prefer_ceil"},
            consts=(2,),
            id="nearest_2d_mixed_scales",
        ),
        OpCase(
            "Resize",
            [x2, None, None, _i64(5, 3, 4, 11)],
            {"coordinate_transformation_mode": "align_corners", "nearest_mode": "ceil"},
            consts=(3,),
            id="nearest_2d_sizes_align",
        ),
        OpCase(
            "Resize",
            [x2, None, None, _i64(13, 5)],
            {"axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"},
            consts=(3,),
            id="nearest_2d_axes_not_larger",
        ),
        OpCase(
            "Resize",
            [x2, None, None, _i64(5, 13)],
            {"axes": [-1, -2], "keep_aspect_ratio_policy": "not_smaller"},
            consts=(3,),
            id="nearest_2d_neg_axes_not_smaller",
            reference=_positive_axes_reference,
        ),
        OpCase(
            "Resize",
            [x2, None, _f32(1, 1, 2, 0.5)],
            {"coordinate_transformation_mode": "pytorch_half_pixel"},
            consts=(2,),
            id="nearest_2d_pytorch_half_pixel",
        ),
        OpCase("Resize", [x3, None, _f32(1, 1, 2, 1.5, 0.5)], consts=(2,), id="nearest_3d"),
        OpCase(
            "Resize",
            [x3, None, None, _i64(5, 3, 3, 9, 14)],
            {"coordinate_transformation_mode": "half_pixel_symmetric"},
            consts=(3,),
            id="nearest_3d_sizes_symmetric",
        ),
        OpCase(
            "Resize",
            [rand(5, 4, 11, seed=3), None, _f32(1, 1, 1.5)],
            consts=(2,),
            id="nearest_1d",
        ),
        OpCase(
            "Resize",
            [rand(5, 3, 9, 7, seed=4, low=0, high=250).astype(np.uint8), None, up2],
            consts=(2,),
            id="nearest_2d_uint8",
        ),
        OpCase(
            "Resize",
            [rand(5, 3, 9, 7, seed=5, low=-1e6, high=1e6).astype(np.int64), None, up2],
            consts=(2,),
            id="nearest_2d_int64",
        ),
        OpCase(
            "Resize",
            [x2, _f32(0.1, 0.8, 0.9, 1.3), None, _i64(6, 5)],
            {
                "coordinate_transformation_mode": "tf_crop_and_resize",
                "axes": [2, 3],
                "extrapolation_value": -7.0,
            },
            consts=(1, 3),
            id="nearest_2d_crop",
        ),
    ]


def _linear_cases() -> list[OpCase]:
    x2 = rand(5, 3, 9, 7, seed=11)
    x3 = rand(5, 3, 5, 6, 7, seed=12)
    lin = {"mode": "linear"}
    return [
        OpCase("Resize", [x2, None, _f32(1, 1, 2, 2)], lin, consts=(2,), id="linear_2d_up2", **TOL),
        OpCase(
            "Resize",
            [x2, None, _f32(1, 1, 0.5, 0.75)],
            lin,
            consts=(2,),
            id="linear_2d_down",
            **TOL,
        ),
        OpCase(
            "Resize",
            [x2, None, None, _i64(5, 3, 16, 12)],
            {**lin, "coordinate_transformation_mode": "align_corners"},
            consts=(3,),
            id="linear_2d_sizes_align",
            **TOL,
        ),
        OpCase(
            "Resize",
            [x2, None, None, _i64(5, 3, 4, 1)],
            {**lin, "coordinate_transformation_mode": "pytorch_half_pixel"},
            consts=(3,),
            id="linear_2d_pytorch_half_pixel",
            **TOL,
        ),
        OpCase(
            "Resize",
            [x2, None, _f32(1, 1, 1.5, 2.5)],
            {**lin, "coordinate_transformation_mode": "asymmetric"},
            consts=(2,),
            id="linear_2d_asymmetric",
            **TOL,
        ),
        OpCase(
            "Resize",
            [x2, None, _f32(1, 1, 0.6, 2)],
            {**lin, "coordinate_transformation_mode": "half_pixel_symmetric"},
            consts=(2,),
            id="linear_2d_symmetric",
            **TOL,
        ),
        OpCase(
            "Resize",
            [x2, None, _f32(1, 1, 0.5, 0.6)],
            {**lin, "antialias": 1},
            consts=(2,),
            id="linear_2d_antialias",
            **TOL,
        ),
        OpCase(
            "Resize",
            [x2, None, None, _i64(4, 3)],
            {**lin, "antialias": 1, "axes": [2, 3], "exclude_outside": 1},
            consts=(3,),
            id="linear_2d_antialias_exclude",
            **TOL,
        ),
        OpCase(
            "Resize",
            [x2, _f32(0, 0, 0.2, -0.1, 1, 1, 0.7, 0.9), None, _i64(5, 3, 6, 8)],
            {**lin, "coordinate_transformation_mode": "tf_crop_and_resize"},
            consts=(1, 3),
            id="linear_2d_crop",
            **TOL,
        ),
        OpCase(
            "Resize",
            [x2, _f32(0.1, 0.3, 1.2, 0.8), _f32(1.5, 0.5)],
            {
                **lin,
                "coordinate_transformation_mode": "tf_crop_and_resize",
                "axes": [2, 3],
                "extrapolation_value": 3.0,
            },
            consts=(1, 2),
            id="linear_2d_crop_extrapolate",
            **TOL,
        ),
        OpCase(
            "Resize", [x3, None, _f32(1, 1, 2, 2, 2)], lin, consts=(2,), id="linear_3d_up2", **TOL
        ),
        OpCase(
            "Resize",
            [x3, None, None, _i64(3, 9, 5)],
            {**lin, "axes": [2, 3, 4], "coordinate_transformation_mode": "align_corners"},
            consts=(3,),
            id="linear_3d_sizes_align",
            **TOL,
        ),
        OpCase(
            "Resize",
            [rand(5, 4, 11, seed=13), None, _f32(1, 1, 1.5)],
            lin,
            consts=(2,),
            id="linear_1d",
            **TOL,
        ),
        OpCase(
            "Resize",
            [x2.astype(np.float64), None, _f32(1, 1, 2, 0.5)],
            lin,
            consts=(2,),
            id="linear_2d_f64",
            **TOL,
        ),
        OpCase(
            "Resize",
            [rand(5, 3, 9, 7, seed=14, low=0, high=250).astype(np.uint8), None, _f32(1, 1, 2, 1.5)],
            lin,
            consts=(2,),
            id="linear_2d_uint8",
        ),
    ]


def _cubic_cases() -> list[OpCase]:
    x2 = rand(5, 3, 9, 7, seed=21)
    x3 = rand(3, 2, 5, 6, 7, seed=22)
    cub = {"mode": "cubic"}
    return [
        OpCase("Resize", [x2, None, _f32(1, 1, 2, 2)], cub, consts=(2,), id="cubic_2d_up2", **TOL),
        OpCase(
            "Resize",
            [x2, None, _f32(1, 1, 0.5, 0.75)],
            cub,
            consts=(2,),
            id="cubic_2d_down",
            **TOL,
        ),
        OpCase(
            "Resize",
            [x2, None, None, _i64(5, 3, 16, 12)],
            {**cub, "coordinate_transformation_mode": "align_corners"},
            consts=(3,),
            id="cubic_2d_sizes_align",
            **TOL,
        ),
        OpCase(
            "Resize",
            [x2, None, _f32(1, 1, 1.5, 2.5)],
            {**cub, "coordinate_transformation_mode": "asymmetric"},
            consts=(2,),
            id="cubic_2d_asymmetric",
            **TOL,
        ),
        OpCase(
            "Resize",
            [x2, None, _f32(1, 1, 1.5, 0.6)],
            {**cub, "cubic_coeff_a": -0.5, "exclude_outside": 1},
            consts=(2,),
            id="cubic_2d_a-0.5_exclude",
            **TOL,
        ),
        OpCase(
            "Resize",
            [x2, None, _f32(1, 1, 0.5, 0.6)],
            {**cub, "antialias": 1},
            consts=(2,),
            id="cubic_2d_antialias",
            **TOL,
        ),
        OpCase(
            "Resize",
            [x2, None, None, _i64(4, 3)],
            {**cub, "antialias": 1, "axes": [2, 3], "exclude_outside": 1},
            consts=(3,),
            id="cubic_2d_antialias_exclude",
            **TOL,
        ),
        OpCase(
            "Resize",
            [x2, _f32(0.1, 0.3, 1.2, 0.8), _f32(1.5, 0.5)],
            {
                **cub,
                "coordinate_transformation_mode": "tf_crop_and_resize",
                "axes": [2, 3],
                "extrapolation_value": 3.0,
            },
            consts=(1, 2),
            id="cubic_2d_crop_extrapolate",
            **TOL,
        ),
        OpCase(
            "Resize",
            [x2, None, None, _i64(5, 3, 4, 1)],
            {**cub, "coordinate_transformation_mode": "pytorch_half_pixel"},
            consts=(3,),
            id="cubic_2d_pytorch_half_pixel",
            **TOL,
        ),
        OpCase(
            "Resize",
            [x3, None, None, _i64(3, 9, 5)],
            {**cub, "axes": [2, 3, 4]},
            consts=(3,),
            id="cubic_3d_sizes",
            **TOL,
        ),
        OpCase(
            "Resize",
            [rand(5, 4, 11, seed=23), None, _f32(1, 1, 1.5)],
            cub,
            consts=(2,),
            id="cubic_1d",
            **TOL,
        ),
        OpCase(
            "Resize",
            [x2.astype(np.float64), None, _f32(1, 1, 2, 0.5)],
            cub,
            consts=(2,),
            id="cubic_2d_f64",
            **TOL,
        ),
        OpCase(
            "Resize",
            [x2.astype(np.float16), None, _f32(1, 1, 2, 0.5)],
            cub,
            consts=(2,),
            id="cubic_2d_f16",
            rtol=2e-3,
            atol=2e-3,
        ),
        OpCase(
            "Resize",
            [rand(5, 3, 9, 7, seed=24, low=0, high=250).astype(np.uint8), None, _f32(1, 1, 2, 1.5)],
            cub,
            consts=(2,),
            id="cubic_2d_uint8_saturates",
        ),
    ]


CASES = _nearest_cases() + _linear_cases() + _cubic_cases()


# ---------------------------------------------------------------- dfdl.ResizeGrad
# The reference is the ONNX spec's sampling written as loops: every dY element is sent
# back to the input taps of its output position (product of per-axis taps/weights).


def _grad_geometry(shape, scales, sizes, attrs):
    """Per axis: (scale, output length); axes not resized keep (1.0, L)."""
    r = len(shape)
    axes = [a % r for a in attrs.get("axes") or range(r)]
    scale, out = [1.0] * r, list(shape)
    if scales is not None and np.size(scales):
        for i, a in enumerate(axes):
            scale[a] = float(scales[i])
            out[a] = int(np.floor(shape[a] * scale[a]))
    else:
        for i, a in enumerate(axes):
            scale[a] = int(sizes[i]) / shape[a]
            out[a] = int(sizes[i])
        policy = attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            s = (min if policy == "not_larger" else max)(scale[a] for a in axes)
            for a in axes:
                scale[a] = s
                out[a] = int(np.floor(s * shape[a] + 0.5))
    return axes, scale, out


def _source_x(y, L, scale, n_out, ctm, roi_pair):
    w = scale * L  # the fractional resized length
    if ctm == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if ctm == "pytorch_half_pixel":
        return -0.5 if w == 1 else (y + 0.5) / scale - 0.5
    if ctm == "asymmetric":
        return y / scale
    if ctm == "align_corners":
        return 0.0 if w == 1 else y * (L - 1) / (w - 1)
    if ctm == "half_pixel_symmetric":
        return L / 2 * (1 - n_out / w) + (y + 0.5) / scale - 0.5
    start, end = roi_pair
    if w == 1:
        return (end - start) * (L - 1) / 2 + start * (L - 1)
    return y * (end - start) * (L - 1) / (w - 1) + start * (L - 1)


def _triangle(d):
    return max(0.0, 1 - d)


def _keys(d, a):
    """Keys' cubic convolution kernel."""
    if d <= 1:
        return (a + 2) * d**3 - (a + 3) * d**2 + 1
    if d < 2:
        return a * d**3 - 5 * a * d**2 + 8 * a * d - 4 * a
    return 0.0


def _axis_taps(y, L, scale, n_out, attrs, roi_pair):
    """[(input index, weight)] feeding output position y along one axis."""
    ctm = attrs.get("coordinate_transformation_mode", "half_pixel")
    x = _source_x(y, L, scale, n_out, ctm, roi_pair)
    if ctm == "tf_crop_and_resize" and not 0 <= x <= L - 1:
        return []  # extrapolation_value: no gradient
    if attrs.get("mode", "nearest") == "nearest":
        f = np.floor(x)
        frac = x - f
        up = {
            "round_prefer_floor": frac > 0.5,
            "round_prefer_ceil": frac >= 0.5,
            "floor": False,
            "ceil": frac > 0,
        }[attrs.get("nearest_mode", "round_prefer_floor")]
        return [(min(max(int(f) + int(up), 0), L - 1), 1.0)]
    # linear: triangle filter, cubic: Keys' kernel, widened by 1/scale when antialiasing a
    # downscale
    s = min(scale, 1.0) if attrs.get("antialias", 0) else 1.0
    half = 2 if attrs.get("mode") == "cubic" else 1
    lo, hi = int(np.floor(x - half / s)), int(np.ceil(x + half / s))
    kernel = _triangle
    if half == 2:
        kernel = functools.partial(_keys, a=attrs.get("cubic_coeff_a", -0.75))
    taps = [(p, kernel(abs(p - x) * s)) for p in range(lo, hi + 1) if kernel(abs(p - x) * s)]
    total = sum(w for _, w in taps)
    taps = [(p, w / total) for p, w in taps]
    if attrs.get("exclude_outside", 0):
        taps = [(p, w) for p, w in taps if 0 <= p < L]
        total = sum(w for _, w in taps)
        return [(p, w / total) for p, w in taps]
    return [(min(max(p, 0), L - 1), w) for p, w in taps]  # edge replicate


def _resize_grad_naive(dY, roi, scales, sizes, *, input_shape, **attrs):
    """dX[src] += dY[out] * (product over axes of tap weights), as loops."""
    axes, scale, out = _grad_geometry(tuple(input_shape), scales, sizes, attrs)
    r = len(input_shape)
    per_axis = []
    for a in range(r):
        roi_pair = None
        if roi is not None and np.size(roi):
            k = len(roi) // 2
            i = axes.index(a) if a in axes else None
            roi_pair = (0.0, 1.0) if i is None else (float(roi[i]), float(roi[k + i]))
        if a in axes:
            taps = [
                _axis_taps(y, input_shape[a], scale[a], out[a], attrs, roi_pair)
                for y in range(out[a])
            ]
        else:
            taps = [[(y, 1.0)] for y in range(out[a])]
        per_axis.append(taps)
    dx = np.zeros(input_shape, np.float64)
    for o in np.ndindex(*dY.shape):
        for combo in itertools.product(*(per_axis[a][o[a]] for a in range(r))):
            dx[tuple(p for p, _ in combo)] += dY[o] * np.prod([w for _, w in combo])
    return [dx.astype(dY.dtype)]


def _grad_case(x_shape, roi, scales, sizes, attrs, id, dtype=np.float32, seed=0) -> OpCase:
    _, _, out = _grad_geometry(x_shape, scales, sizes, attrs)
    dy = rand(*out, seed=seed, dtype=dtype)
    attrs = {**attrs, "input_shape": list(x_shape)}
    consts = tuple(i for i, v in ((1, roi), (2, scales), (3, sizes)) if v is not None)
    return OpCase(
        "ResizeGrad",
        [dy, roi, scales, sizes],
        attrs,
        consts=consts,
        id=id,
        domain="dfdl",
        reference=functools.partial(_resize_grad_naive, **attrs),
        **TOL,
    )


def _grad_cases() -> list[OpCase]:
    s2, s3, s1 = (5, 3, 9, 7), (5, 3, 5, 6, 7), (5, 4, 11)
    lin = {"mode": "linear"}
    up2 = _f32(1, 1, 2, 2)
    return [
        _grad_case(s2, None, up2, None, {}, "nearest_2d_up2"),
        _grad_case(
            s2,
            None,
            up2,
            None,
            {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
            "nearest_2d_torch",
        ),
        _grad_case(
            s2,
            None,
            _f32(1, 1, 0.5, 1.5),
            None,
            {"nearest_mode": "round_prefer_ceil"},
            "nearest_2d_mixed",
        ),
        _grad_case(
            s2,
            None,
            None,
            _i64(5, 3, 4, 11),
            {"coordinate_transformation_mode": "align_corners", "nearest_mode": "ceil"},
            "nearest_2d_sizes_align",
        ),
        _grad_case(
            s2,
            None,
            None,
            _i64(13, 5),
            {"axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"},
            "nearest_2d_axes_not_larger",
        ),
        _grad_case(s3, None, _f32(1, 1, 2, 1.5, 0.5), None, {}, "nearest_3d"),
        _grad_case(
            s2,
            _f32(0.1, 0.8, 0.9, 1.3),
            None,
            _i64(6, 5),
            {"coordinate_transformation_mode": "tf_crop_and_resize", "axes": [2, 3]},
            "nearest_2d_crop",
        ),
        _grad_case(s2, None, up2, None, lin, "linear_2d_up2"),
        _grad_case(s2, None, _f32(1, 1, 0.5, 0.75), None, lin, "linear_2d_down"),
        _grad_case(
            s2,
            None,
            None,
            _i64(5, 3, 16, 12),
            {**lin, "coordinate_transformation_mode": "align_corners"},
            "linear_2d_sizes_align",
        ),
        _grad_case(
            s2,
            None,
            None,
            _i64(5, 3, 4, 1),
            {**lin, "coordinate_transformation_mode": "pytorch_half_pixel"},
            "linear_2d_pytorch_half_pixel",
        ),
        _grad_case(
            s2,
            None,
            _f32(1, 1, 0.6, 2),
            None,
            {**lin, "coordinate_transformation_mode": "half_pixel_symmetric"},
            "linear_2d_symmetric",
        ),
        _grad_case(
            s2, None, _f32(1, 1, 0.5, 0.6), None, {**lin, "antialias": 1}, "linear_2d_antialias"
        ),
        _grad_case(
            s2,
            None,
            None,
            _i64(4, 3),
            {**lin, "antialias": 1, "axes": [2, 3], "exclude_outside": 1},
            "linear_2d_antialias_exclude",
        ),
        _grad_case(
            s2,
            _f32(0, 0, 0.2, -0.1, 1, 1, 0.7, 0.9),
            None,
            _i64(5, 3, 6, 8),
            {**lin, "coordinate_transformation_mode": "tf_crop_and_resize"},
            "linear_2d_crop",
        ),
        _grad_case(
            s2,
            None,
            None,
            _i64(12, 5),
            {**lin, "axes": [-1, -2]},
            "linear_2d_neg_axes",
        ),
        _grad_case(s2, None, _f32(1, 1.5, 1, 2), None, lin, "linear_2d_channels_resized"),
        _grad_case(
            s3,
            None,
            None,
            _i64(3, 9, 5),
            {**lin, "axes": [2, 3, 4], "coordinate_transformation_mode": "align_corners"},
            "linear_3d_sizes_align",
        ),
        _grad_case(s1, None, _f32(1, 1, 1.5), None, lin, "linear_1d"),
        _grad_case(s2, None, _f32(1, 1, 2, 0.5), None, lin, "linear_2d_f64", dtype=np.float64),
        *_cubic_grad_cases(),
    ]


def _cubic_grad_cases() -> list[OpCase]:
    s2, s1 = (5, 3, 9, 7), (5, 4, 11)
    cub = {"mode": "cubic"}
    return [
        _grad_case(s2, None, _f32(1, 1, 2, 2), None, cub, "cubic_2d_up2"),
        _grad_case(s2, None, _f32(1, 1, 0.5, 0.75), None, cub, "cubic_2d_down"),
        _grad_case(
            s2,
            None,
            _f32(1, 1, 1.5, 0.6),
            None,
            {**cub, "cubic_coeff_a": -0.5, "exclude_outside": 1},
            "cubic_2d_a-0.5_exclude",
        ),
        _grad_case(
            s2, None, _f32(1, 1, 0.5, 0.6), None, {**cub, "antialias": 1}, "cubic_2d_antialias"
        ),
        _grad_case(
            s2,
            None,
            None,
            _i64(5, 3, 16, 12),
            {**cub, "coordinate_transformation_mode": "align_corners"},
            "cubic_2d_sizes_align",
        ),
        _grad_case(
            s2,
            _f32(0, 0, 0.2, -0.1, 1, 1, 0.7, 0.9),
            None,
            _i64(5, 3, 6, 8),
            {**cub, "coordinate_transformation_mode": "tf_crop_and_resize"},
            "cubic_2d_crop",
        ),
        _grad_case(s1, None, _f32(1, 1, 1.5), None, cub, "cubic_1d", dtype=np.float64),
    ]


CASES += _grad_cases()
