"""OpCases for Conv, ConvTranspose and the backward ops dfdl.ConvGradInput /
dfdl.ConvGradWeight (1-D/2-D/3-D, batch 5, channels >= 3).

onnx's ReferenceEvaluator is the oracle except where it is wrong: grouped
ConvTranspose and an output_shape that crops the output (positive total padding).
Those cases use ``_conv_transpose_naive``, the definition written as plain loops.
The backward ops have loop references too: a Conv's dX is the transposed convolution
of dY (``_conv_transpose_naive`` again), its dW is ``_conv_grad_weight_naive``.
"""

from __future__ import annotations

import functools

import numpy as np

from tests.ops.case import OpCase, rand

TOL = {"rtol": 1e-4, "atol": 1e-4}


def _conv_transpose_naive(X, W, B=None, *, strides, pads_begin, out_shape, group=1, dilations=None):
    """Every input position p and kernel offset k adds X[p] @ W[k] at p*s + k*d - pad."""
    nd = X.ndim - 2
    dilations = dilations or [1] * nd
    cg, mg = X.shape[1] // group, W.shape[1]
    y = np.zeros((X.shape[0], mg * group, *out_shape))
    for pos in np.ndindex(*X.shape[2:]):
        for off in np.ndindex(*W.shape[2:]):
            o = [
                p * s + k * d - b
                for p, s, k, d, b in zip(pos, strides, off, dilations, pads_begin, strict=True)
            ]
            if not all(0 <= oi < n for oi, n in zip(o, out_shape, strict=True)):
                continue
            for g in range(group):
                xs = X[(slice(None), slice(g * cg, (g + 1) * cg), *pos)]
                ws = W[(slice(g * cg, (g + 1) * cg), slice(None), *off)]
                y[(slice(None), slice(g * mg, (g + 1) * mg), *o)] += xs.astype(np.float64) @ ws
    if B is not None:
        y += B.reshape((1, -1) + (1,) * nd)
    return [y.astype(X.dtype)]


def _naive(**kw):
    return functools.partial(_conv_transpose_naive, **kw)


def _conv_grad_weight_naive(X, dY, *, strides, pads_begin, kernel, group=1, dilations=None):
    """Every output position p and kernel offset k adds dY[p]^T X[p*s + k*d - pad]."""
    nd = X.ndim - 2
    dilations = dilations or [1] * nd
    cg, mg = X.shape[1] // group, dY.shape[1] // group
    dw = np.zeros((dY.shape[1], cg, *kernel))
    for pos in np.ndindex(*dY.shape[2:]):
        for off in np.ndindex(*kernel):
            i = [
                p * s + k * d - b
                for p, s, k, d, b in zip(pos, strides, off, dilations, pads_begin, strict=True)
            ]
            if not all(0 <= ii < n for ii, n in zip(i, X.shape[2:], strict=True)):
                continue
            for g in range(group):
                dys = dY[(slice(None), slice(g * mg, (g + 1) * mg), *pos)]
                xs = X[(slice(None), slice(g * cg, (g + 1) * cg), *i)]
                dw[(slice(g * mg, (g + 1) * mg), slice(None), *off)] += (
                    dys.T.astype(np.float64) @ xs
                )
    return [dw.astype(X.dtype)]


#: Conv geometries for the backward ops: (id, X shape, W shape, attrs, group, explicit
#: begin pads for the loop references, dY spatial shape)
_GRAD_GEOMETRIES = [
    ("2d_pad", (5, 3, 7, 6), (7, 3, 3, 3), {"pads": [1, 1, 1, 1]}, [1, 1], (7, 6)),
    (
        "2d_stride_dil_asym",
        (5, 3, 7, 6),
        (7, 3, 3, 3),
        {"strides": [2, 1], "dilations": [1, 2], "pads": [0, 1, 2, 1]},
        [0, 1],
        (4, 4),
    ),
    (
        "2d_same_upper",
        (5, 3, 7, 6),
        (7, 3, 3, 2),
        {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
        [1, 0],
        (4, 3),
    ),
    ("2d_group3", (5, 6, 6, 5), (9, 2, 3, 3), {"group": 3, "pads": [1, 0, 1, 2]}, [1, 0], (6, 5)),
    (
        "2d_depthwise",
        (5, 4, 6, 6),
        (8, 1, 3, 3),
        {"group": 4, "pads": [1, 1, 1, 1], "strides": [2, 2]},
        [1, 1],
        (3, 3),
    ),
    ("2d_pointwise", (5, 3, 7, 6), (7, 3, 1, 1), {}, [0, 0], (7, 6)),
    (
        "1d",
        (5, 3, 11),
        (7, 3, 3),
        {"strides": [2], "pads": [1, 2], "dilations": [2]},
        [1],
        (5,),
    ),
    (
        "3d",
        (5, 3, 5, 6, 4),
        (7, 3, 3, 2, 3),
        {"pads": [1, 0, 1, 1, 1, 1], "strides": [1, 2, 1]},
        [1, 0, 1],
        (5, 3, 4),
    ),
    (
        "3d_group2_dilated",
        (5, 4, 4, 5, 5),
        (6, 2, 2, 3, 3),
        {"group": 2, "dilations": [1, 2, 1], "pads": [0, 2, 1, 1, 2, 1]},
        [0, 2, 1],
        (4, 5, 5),
    ),
    # 1x1 at a stride (conv_pointwise): rows and columns the kernel never reads
    ("2d_pointwise_strided", (5, 3, 7, 6), (7, 3, 1, 1), {"strides": [2, 4]}, [0, 0], (4, 2)),
    (
        "3d_pointwise_strided",
        (2, 3, 5, 4, 3),
        (4, 3, 1, 1, 1),
        {"strides": [2, 1, 2]},
        [0, 0, 0],
        (3, 4, 2),
    ),
]


def _conv_grad_cases() -> list[OpCase]:
    cases = []
    for seed, (id, xs, ws, attrs, pb, out) in enumerate(_GRAD_GEOMETRIES):
        group = attrs.get("group", 1)
        geo = {"strides": attrs.get("strides", [1] * len(pb)), "pads_begin": pb, "group": group}
        geo["dilations"] = attrs.get("dilations")
        x = rand(*xs, seed=50 + seed)
        w = rand(*ws, seed=70 + seed, low=-0.5, high=0.5)
        dy = rand(xs[0], ws[0], *out, seed=90 + seed)
        cases += [
            OpCase(
                "ConvGradInput",
                [dy, w],
                {**attrs, "input_shape": list(xs)},
                reference=_naive(out_shape=list(xs[2:]), **geo),
                domain="dfdl",
                id=id,
                **TOL,
            ),
            OpCase(
                "ConvGradWeight",
                [x, dy],
                {**attrs, "weight_shape": list(ws)},
                reference=functools.partial(_conv_grad_weight_naive, kernel=ws[2:], **geo),
                domain="dfdl",
                id=id,
                **TOL,
            ),
        ]
    f64 = {"pads": [2, 1, 0, 1], "strides": [3, 2]}
    geo = {"strides": [3, 2], "pads_begin": [2, 1]}
    x = rand(5, 3, 7, 6, dtype=np.float64, seed=20)
    w = rand(7, 3, 3, 3, dtype=np.float64, seed=21)
    dy = rand(5, 7, 3, 3, dtype=np.float64, seed=22)
    exact = {"rtol": 1e-10, "atol": 1e-10}
    cases += [
        OpCase(
            "ConvGradInput",
            [dy, w],
            {**f64, "input_shape": [5, 3, 7, 6]},
            reference=_naive(out_shape=[7, 6], **geo),
            domain="dfdl",
            id="2d_f64",
            **exact,
        ),
        OpCase(
            "ConvGradWeight",
            [x, dy],
            {**f64, "weight_shape": [7, 3, 3, 3]},
            reference=functools.partial(_conv_grad_weight_naive, kernel=(3, 3), **geo),
            domain="dfdl",
            id="2d_f64",
            **exact,
        ),
    ]
    return cases


def _conv_cases() -> list[OpCase]:
    x2 = rand(5, 3, 7, 6, seed=1)
    w2 = rand(7, 3, 3, 3, seed=2, low=-0.5, high=0.5)
    b7 = rand(7, seed=3)
    return [
        OpCase("Conv", [x2, w2, b7], {"pads": [1, 1, 1, 1]}, id="2d_pad", **TOL),
        OpCase("Conv", [x2, w2], {"kernel_shape": [3, 3]}, id="2d_nopad_nobias", **TOL),
        OpCase(
            "Conv",
            [x2, w2, b7],
            {"strides": [2, 1], "dilations": [1, 2], "pads": [0, 1, 2, 1]},
            id="2d_stride_dil_asym",
            **TOL,
        ),
        OpCase(
            "Conv",
            [x2, rand(7, 3, 3, 2, seed=4), b7],
            {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
            id="2d_same_upper",
            **TOL,
        ),
        OpCase(
            "Conv",
            [x2, rand(7, 3, 2, 3, seed=5), b7],
            {"auto_pad": "SAME_LOWER", "strides": [1, 2]},
            id="2d_same_lower",
            **TOL,
        ),
        OpCase(
            "Conv",
            [x2, w2, b7],
            {"auto_pad": "SAME_UPPER", "dilations": [2, 1]},
            id="2d_same_dilated",
            **TOL,
        ),
        OpCase(
            "Conv", [x2, w2, b7], {"auto_pad": "VALID", "strides": [2, 2]}, id="2d_valid", **TOL
        ),
        OpCase(
            "Conv",
            [rand(5, 6, 6, 5, seed=6), rand(9, 2, 3, 3, seed=7), rand(9, seed=8)],
            {"group": 3, "pads": [1, 0, 1, 2]},
            id="2d_group3",
            **TOL,
        ),
        OpCase(
            "Conv",
            [rand(5, 4, 6, 6, seed=9), rand(8, 1, 3, 3, seed=10), rand(8, seed=11)],
            {"group": 4, "pads": [1, 1, 1, 1], "strides": [2, 2]},
            id="2d_depthwise",
            **TOL,
        ),
        OpCase(
            "Conv",
            [x2, rand(7, 3, 1, 1, seed=12), b7],
            id="2d_pointwise",
            **TOL,
        ),
        OpCase(
            "Conv",
            [x2, rand(7, 3, 1, 1, seed=12), b7],
            {"strides": [2, 4]},
            id="2d_pointwise_strided",
            **TOL,
        ),
        OpCase(
            "Conv",
            [rand(5, 3, 11, seed=13), rand(7, 3, 3, seed=14), b7],
            {"strides": [2], "pads": [1, 2], "dilations": [2]},
            id="1d",
            **TOL,
        ),
        OpCase(
            "Conv",
            [rand(5, 3, 9, seed=15), rand(7, 3, 4, seed=16)],
            {"auto_pad": "SAME_LOWER"},
            id="1d_same_lower_even_kernel",
            **TOL,
        ),
        OpCase(
            "Conv",
            [rand(5, 3, 5, 6, 4, seed=17), rand(7, 3, 3, 2, 3, seed=18), b7],
            {"pads": [1, 0, 1, 1, 1, 1], "strides": [1, 2, 1]},
            id="3d",
            **TOL,
        ),
        OpCase(
            "Conv",
            [rand(5, 4, 4, 5, 5, seed=19), rand(6, 2, 2, 3, 3, seed=20), rand(6, seed=21)],
            {"group": 2, "dilations": [1, 2, 1], "auto_pad": "SAME_UPPER"},
            id="3d_group2_same",
            **TOL,
        ),
        OpCase(
            "Conv",
            [rand(5, 3, 7, 6, dtype=np.float64), rand(7, 3, 3, 3, dtype=np.float64)],
            {"pads": [2, 1, 0, 1], "strides": [3, 2]},
            id="2d_f64",
            rtol=1e-10,
            atol=1e-10,
        ),
        OpCase(
            "Conv",
            [rand(5, 3, 6, 6, dtype=np.float16), rand(7, 3, 3, 3, dtype=np.float16)],
            {"pads": [1, 1, 1, 1]},
            id="2d_f16",
            rtol=1e-2,
            atol=5e-2,
        ),
        OpCase(
            "Conv", [x2, w2, b7], {"pads": [1, 1, 1, 1]}, consts=(1, 2), id="const_weights", **TOL
        ),
    ]


def _conv_transpose_cases() -> list[OpCase]:
    x2 = rand(5, 3, 4, 5, seed=31)
    w2 = rand(3, 7, 3, 3, seed=32)
    b7 = rand(7, seed=33)
    return [
        OpCase("ConvTranspose", [x2, w2, b7], id="2d", **TOL),
        OpCase("ConvTranspose", [x2, w2], {"kernel_shape": [3, 3]}, id="2d_nobias", **TOL),
        OpCase(
            "ConvTranspose",
            [x2, w2, b7],
            {"strides": [2, 3], "pads": [1, 0, 0, 2], "output_padding": [1, 2]},
            id="2d_stride_pad_outpad",
            **TOL,
        ),
        OpCase(
            "ConvTranspose",
            [x2, w2, b7],
            {"strides": [2, 2], "output_shape": [10, 12]},
            id="2d_output_shape_grow",
            **TOL,
        ),
        OpCase(
            "ConvTranspose",
            [x2, w2, b7],
            {"strides": [2, 2], "output_shape": [8, 9]},
            # full size (9, 11): total pads (1, 2), NOTSET puts the larger half first
            reference=_naive(strides=[2, 2], pads_begin=[1, 1], out_shape=[8, 9]),
            id="2d_output_shape_crop",
            **TOL,
        ),
        OpCase(
            "ConvTranspose",
            [x2, w2, b7],
            {"strides": [2, 2], "output_shape": [9, 11], "output_padding": [1, 1]},
            # total pads (1, 1) go first under NOTSET (spec, onnxruntime); the evaluator
            # crops at the end instead
            reference=_naive(strides=[2, 2], pads_begin=[1, 1], out_shape=[9, 11]),
            id="2d_output_shape_outpad",
            **TOL,
        ),
        OpCase(
            "ConvTranspose",
            [x2, w2, b7],
            {"strides": [2, 2], "output_shape": [13, 13]},
            # full size (9, 11) grows by (4, 2): pads (-2, -1) at the start and the end
            # (the evaluator rejects this; the VJP crops dY on both sides)
            reference=_naive(strides=[2, 2], pads_begin=[-2, -1], out_shape=[13, 13]),
            id="2d_output_shape_grow_both_ends",
            **TOL,
        ),
        OpCase(
            "ConvTranspose",
            [x2, w2, b7],
            {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
            id="2d_same_upper",
            **TOL,
        ),
        OpCase(
            "ConvTranspose",
            [x2, w2, b7],
            {"strides": [2, 3], "auto_pad": "SAME_LOWER"},
            id="2d_same_lower",
            **TOL,
        ),
        OpCase(
            "ConvTranspose",
            [x2, w2, b7],
            {"dilations": [2, 1], "pads": [1, 1, 2, 0]},
            id="2d_dilated",
            **TOL,
        ),
        OpCase(
            "ConvTranspose",
            [rand(5, 6, 4, 3, seed=34), rand(6, 2, 3, 3, seed=35), rand(6, seed=36)],
            {"group": 3, "strides": [2, 1], "pads": [1, 0, 0, 1]},
            reference=_naive(strides=[2, 1], pads_begin=[1, 0], out_shape=[8, 4], group=3),
            id="2d_group3",
            **TOL,
        ),
        OpCase(
            "ConvTranspose",
            [rand(5, 3, 7, seed=37), rand(3, 7, 3, seed=38), b7],
            {"strides": [2], "pads": [1, 1], "output_padding": [1]},
            id="1d",
            **TOL,
        ),
        OpCase(
            "ConvTranspose",
            [rand(5, 3, 3, 4, 3, seed=39), rand(3, 4, 2, 3, 2, seed=40), rand(4, seed=41)],
            {"strides": [2, 1, 2]},
            id="3d",
            **TOL,
        ),
        OpCase(
            "ConvTranspose",
            [rand(5, 4, 2, 3, 3, seed=42), rand(4, 3, 2, 2, 2, seed=43)],
            {"strides": [2, 2, 2], "group": 2, "output_shape": [5, 6, 6]},
            # full size (4, 6, 6) grows by one zero plane at the end of axis 0
            reference=_naive(strides=[2, 2, 2], pads_begin=[0, 0, 0], out_shape=[5, 6, 6], group=2),
            id="3d_group2_output_shape",
            **TOL,
        ),
        OpCase(
            "ConvTranspose",
            [rand(5, 3, 4, 5, dtype=np.float64), rand(3, 7, 2, 3, dtype=np.float64)],
            {"strides": [3, 2], "auto_pad": "SAME_UPPER"},
            id="2d_f64",
            rtol=1e-10,
            atol=1e-10,
        ),
        OpCase(
            "ConvTranspose",
            [x2, w2, b7],
            {"strides": [2, 2]},
            consts=(1, 2),
            id="const_weights",
            **TOL,
        ),
    ]


CASES = _conv_cases() + _conv_transpose_cases() + _conv_grad_cases()
