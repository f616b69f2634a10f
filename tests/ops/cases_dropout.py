"""OpCases for Dropout and dfdl.DropoutGrad (dfdl/ops/dropout.py)."""

from __future__ import annotations

import numpy as np

from tests.ops.case import OpCase, rand

F32, F64 = np.float32, np.float64


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
    # no mask output: the VJP adds it to the node
    OpCase(
        "Dropout",
        [rand(5, 7, 6), np.array(0.4, F32), _b(True)],
        attrs={"seed": 5},
        consts=(1, 2),
        id="training_y_only",
        reference=lambda *a: _dropout_reference(5)(*a)[:1],
    ),
    # training_mode known only at run time
    OpCase(
        "Dropout",
        [rand(5, 7, 3, dtype=F64), np.array(0.25, F64), _b(True)],
        attrs={"seed": 11},
        n_outputs=2,
        consts=(1,),
        id="training_mode_input",
        reference=_dropout_reference(11),
    ),
]

# ratio = 0 sits on the edge of its domain [0, 1]: the central difference would
# evaluate Dropout at a negative ratio (an error)
for _c in _DROPOUT:
    if _c.id == "training_ratio0":
        _c.no_grad = True


def _dropout_grad_ref(dY, mask, ratio=None, training_mode=None):
    r = 0.5 if ratio is None else float(ratio)
    if training_mode is None or not bool(training_mode):
        return [dY]
    return [(dY * mask / (1 - r)).astype(dY.dtype)]


def _mask(*shape, seed=0):
    return np.random.default_rng(seed).uniform(size=shape) >= 0.3


_DROPOUT_GRAD = [
    OpCase(
        "DropoutGrad",
        [rand(5, 7, 3), _mask(5, 7, 3), np.array(0.3, F32), _b(True)],
        consts=(2, 3),
        domain="dfdl",
        reference=_dropout_grad_ref,
        id="training_f32",
    ),
    OpCase(
        "DropoutGrad",
        [rand(5, 7, dtype=F64), _mask(5, 7), None, _b(True)],
        consts=(3,),
        domain="dfdl",
        reference=_dropout_grad_ref,
        id="training_f64_default_ratio",
    ),
    OpCase(
        "DropoutGrad",
        [rand(5, 7), np.ones((5, 7), bool), np.array(0.3, F32), _b(False)],
        consts=(2, 3),
        domain="dfdl",
        reference=_dropout_grad_ref,
        id="inference",
    ),
]

CASES = _DROPOUT + _DROPOUT_GRAD
