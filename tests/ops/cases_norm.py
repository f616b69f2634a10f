"""OpCases for normalization, softmax and dropout (dfdl/ops/norm.py)."""

from __future__ import annotations

import numpy as np

from tests.ops.case import OpCase, rand

F32, F64 = np.float32, np.float64


def _chan(c: int, dtype=F32, seed=0, positive=False) -> np.ndarray:
    """A per-channel parameter; variances are positive."""
    if positive:
        return rand(c, dtype=dtype, seed=seed, low=0.5, high=2.0)
    return rand(c, dtype=dtype, seed=seed)


def _bn_inputs(*shape, dtype=F32):
    c = shape[1]
    return [
        rand(*shape, dtype=dtype),
        _chan(c, dtype, 1),
        _chan(c, dtype, 2),
        _chan(c, dtype, 3),
        _chan(c, dtype, 4, positive=True),
    ]


_BN = [
    OpCase("BatchNormalization", _bn_inputs(5, 7, 3, 4), id="f32_4d"),
    OpCase("BatchNormalization", _bn_inputs(5, 7, dtype=F64), id="f64_2d"),
    OpCase(
        "BatchNormalization",
        _bn_inputs(5, 7, 6, dtype=F64),
        attrs={"epsilon": 1e-2},
        id="f64_3d_eps",
    ),
    OpCase(
        "BatchNormalization",
        _bn_inputs(5, 7, 3, 4),
        attrs={"training_mode": 1},
        n_outputs=3,
        id="train_f32_4d",
    ),
    OpCase(
        "BatchNormalization",
        _bn_inputs(5, 7, 6, dtype=F64),
        attrs={"training_mode": 1, "momentum": 0.7, "epsilon": 1e-3},
        n_outputs=3,
        id="train_f64_3d_momentum",
    ),
    OpCase(
        "BatchNormalization",
        _bn_inputs(5, 7),
        attrs={"training_mode": 1},
        n_outputs=3,
        id="train_f32_2d",
    ),
]

_IN = [
    OpCase(
        "InstanceNormalization",
        [rand(5, 7, 3, 4), _chan(7, seed=1), _chan(7, seed=2)],
        id="f32_4d",
    ),
    OpCase(
        "InstanceNormalization",
        [rand(5, 7, 6, dtype=F64), _chan(7, F64, 1), _chan(7, F64, 2)],
        attrs={"epsilon": 1e-2},
        id="f64_3d_eps",
    ),
    OpCase(
        "InstanceNormalization",
        [rand(2, 7, 3, 4, 2), _chan(7, seed=1), _chan(7, seed=2)],
        id="f32_5d",
    ),
]


def _ln_reference(axis=-1, epsilon=1e-5, stash=np.float32):
    """LayerNormalization per its ONNX function body (statistics in ``stash``)."""

    def ref(X, Scale, B=None):
        ax = axis % X.ndim
        axes = tuple(range(ax, X.ndim))
        xs = X.astype(stash)
        mean = xs.mean(axis=axes, keepdims=True)
        d = xs - mean
        inv = 1 / np.sqrt((d * d).mean(axis=axes, keepdims=True) + epsilon)
        y = (d * inv).astype(X.dtype) * Scale
        y = y if B is None else y + B
        return [y.astype(X.dtype), mean.astype(stash), inv.astype(stash)]

    return ref


_LN = [
    OpCase("LayerNormalization", [rand(5, 7), rand(7, seed=1), rand(7, seed=2)], id="f32_2d"),
    OpCase(
        "LayerNormalization",
        [rand(5, 7, 6), rand(7, 6, seed=1), rand(7, 6, seed=2)],
        attrs={"axis": 1},
        n_outputs=3,
        id="f32_3d_axis1",
    ),
    OpCase(
        "LayerNormalization",
        [rand(5, 7, 6), rand(6, seed=1)],
        attrs={"axis": -1, "epsilon": 1e-2},
        n_outputs=3,
        id="f32_3d_noB_eps",
    ),
    OpCase(
        "LayerNormalization",
        [rand(5, 7, 3, 4), rand(3, 4, seed=1), rand(4, seed=2)],
        attrs={"axis": -2},
        n_outputs=3,
        id="f32_4d_axis-2_bcast",
    ),
    OpCase(
        "LayerNormalization",
        [rand(5, 7, 6, dtype=F64), rand(6, dtype=F64, seed=1), rand(6, dtype=F64, seed=2)],
        id="f64_y_only",
    ),
    OpCase(
        "LayerNormalization",
        [rand(5, 7, 6, dtype=F64), rand(7, 6, dtype=F64, seed=1)],
        attrs={"axis": 1, "stash_type": 1},
        n_outputs=3,
        id="f64_stash_f32",
        reference=_ln_reference(axis=1),
    ),
    OpCase(
        "LayerNormalization",
        [rand(5, 7, 6, dtype=F64), rand(6, dtype=F64, seed=1), rand(6, dtype=F64, seed=2)],
        attrs={"stash_type": 11},
        n_outputs=3,
        rtol=1e-10,
        atol=1e-12,
        id="f64_stash_f64",
        reference=_ln_reference(stash=np.float64),
    ),
]


def _softmax(op: str) -> list[OpCase]:
    return [
        OpCase(op, [rand(5, 7)], id="f32_2d"),
        OpCase(op, [rand(5, 7, 6, high=40.0)], attrs={"axis": 1}, id="f32_3d_axis1_large"),
        OpCase(op, [rand(5, 7, 6, dtype=F64)], attrs={"axis": 0}, id="f64_3d_axis0"),
        OpCase(op, [rand(5, 7, 3, 4)], attrs={"axis": -2}, id="f32_4d_axis-2"),
        OpCase(op, [rand(11, dtype=F64)], id="f64_1d"),
    ]


# ------------------------------------------------------------------------------ Dropout

_M64 = (1 << 64) - 1


def _splitmix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _dropout_reference(seed: int):
    """Independent scalar model of dfdl's counter-based dropout mask."""

    def ref(data, ratio=None, training_mode=None):
        r = 0.5 if ratio is None else float(ratio)
        key = _splitmix(seed & _M64)
        u = np.array(
            [
                (_splitmix((key + (i + 1) * 0x9E3779B97F4A7C15) & _M64) >> 11) / 2.0**53
                for i in range(data.size)
            ]
        ).reshape(data.shape)
        mask = u >= r
        out = np.where(mask, data * data.dtype.type(1 / (1 - r)), 0).astype(data.dtype)
        return [out, mask]

    return ref


def _b(v: bool) -> np.ndarray:
    return np.array(v, dtype=np.bool_)


_DROPOUT = [
    OpCase("Dropout", [rand(5, 7)], id="default_inference"),
    OpCase("Dropout", [rand(5, 7, 3, dtype=F64)], n_outputs=2, id="inference_mask"),
    OpCase(
        "Dropout",
        [rand(5, 7), np.array(0.3, F32), _b(False)],
        n_outputs=2,
        consts=(1, 2),
        id="training_off",
    ),
    OpCase(
        "Dropout",
        [rand(5, 7), np.array(0.0, F32), _b(True)],
        n_outputs=2,
        consts=(1, 2),
        id="training_ratio0",
    ),
    OpCase(
        "Dropout",
        [rand(5, 7, 3, 4), np.array(0.3, F32), _b(True)],
        attrs={"seed": 7},
        n_outputs=2,
        consts=(1, 2),
        id="training_f32_4d",
        reference=_dropout_reference(7),
    ),
    OpCase(
        "Dropout",
        [rand(5, 7, 6, dtype=F64), None, _b(True)],
        attrs={"seed": 123},
        n_outputs=2,
        consts=(2,),
        id="training_f64_default_ratio",
        reference=_dropout_reference(123),
    ),
]

CASES = _BN + _IN + _LN + _softmax("Softmax") + _softmax("LogSoftmax") + _DROPOUT
