"""OpCases for Resize: nearest and linear, 1-D/2-D/3-D spatial, scales and sizes.

onnx's ReferenceEvaluator is the oracle. Scales are picked so that no source
coordinate lands within rounding error of an integer from the "wrong" side (the
evaluator picks its neighbours from ``x + 1``, which can round differently than ``x``).
"""

from __future__ import annotations

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


CASES = _nearest_cases() + _linear_cases()
