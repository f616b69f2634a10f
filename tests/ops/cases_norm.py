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
    OpCase(
        "BatchNormalization",
        _bn_inputs(5, 7, 6, dtype=F64),
        attrs={"training_mode": 1},
        id="train_f64_y_only",
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

# The default stash_type=1 computes the statistics in float32 even for float64 X, so
# float64 finite differences of those cases measure float32 rounding, not the
# derivative: their gradients are checked on stash_type=11 copies instead.
for _c in _LN:
    if _c.attrs.get("stash_type", 1) == 1:
        _c.no_grad = True


def _ln_stash64(X, Scale, B=None, axis=-1, epsilon=1e-5, n_outputs=3, tag=""):
    """A stash_type=11 case; with 3 outputs X is float64 (one dtype for the VJP's loss)."""
    ref = _ln_reference(axis=axis, epsilon=epsilon, stash=np.float64)
    return OpCase(
        "LayerNormalization",
        [X, Scale, B],
        attrs={"axis": axis, "epsilon": epsilon, "stash_type": 11},
        n_outputs=n_outputs,
        reference=lambda *a: ref(*a)[:n_outputs],
        id=f"{tag}_stash64",
    )


def _f64(*shape, seed=0):
    return rand(*shape, dtype=F64, seed=seed)


_LN += [
    _ln_stash64(rand(5, 7), rand(7, seed=1), rand(7, seed=2), n_outputs=1, tag="f32_2d"),
    _ln_stash64(
        rand(5, 7, 3, 4), rand(3, 4, seed=1), rand(4, seed=2), axis=-2, n_outputs=1, tag="f32_4d"
    ),
    _ln_stash64(_f64(5, 7, 6), _f64(7, 6, seed=1), _f64(7, 6, seed=2), axis=1, tag="f64_3d_axis1"),
    _ln_stash64(_f64(5, 7, 6), _f64(6, seed=1), epsilon=1e-2, tag="f64_3d_noB_eps"),
    _ln_stash64(
        _f64(5, 7, 3, 4), _f64(3, 4, seed=1), _f64(4, seed=2), axis=-2, tag="f64_4d_axis-2_bcast"
    ),
    _ln_stash64(
        _f64(5, 7, 6), _f64(7, 6, seed=1), n_outputs=1, tag="f64_scale_covers_leading_axis"
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

CASES = _BN + _IN + _LN + _softmax("Softmax") + _softmax("LogSoftmax") + _DROPOUT


# ---------------------------------------------------- backward ops (dfdl domain)
# References differentiate small independent numpy forwards by the complex step
# (exact to rounding): J^T dy, one complex evaluation per input element.


def cs_vjp(f, args, wrt: int, dys) -> np.ndarray:
    """``sum_k J_k^T dys[k]`` of ``f(*args)`` for ``args[wrt]``, by complex step."""
    args = [None if a is None else np.asarray(a, dtype=np.complex128) for a in args]
    x = args[wrt]
    out = np.zeros(x.shape)
    h = 1e-30
    for idx in np.ndindex(x.shape):
        xp = x.copy()
        xp[idx] += 1j * h
        outs = f(*args[:wrt], xp, *args[wrt + 1 :])
        out[idx] = sum(
            np.sum(np.imag(o) / h * np.asarray(d, np.float64))
            for o, d in zip(outs, dys)
            if d is not None
        )
    return out


def _cs_softmax(x, axis):
    # the shift is a constant (real max): softmax does not depend on it
    e = np.exp(x - x.real.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _softmax_grad_ref(axis, log):
    def ref(dY, Y):
        # the logits of Y: log(Y) for softmax (sums to 1), Y itself for log-softmax
        x = Y.astype(np.float64) if log else np.log(Y.astype(np.float64))
        f = (
            (lambda z: [np.log(_cs_softmax(z, axis))])
            if log
            else (lambda z: [_cs_softmax(z, axis)])
        )
        return [cs_vjp(f, [x], 0, [dY]).astype(Y.dtype)]

    return ref


def _softmax_out(shape, axis, dtype, log=False, seed=0):
    x = rand(*shape, dtype=np.float64, seed=seed)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    y = e / e.sum(axis=axis, keepdims=True)
    return (np.log(y) if log else y).astype(dtype)


def _softmax_grad_cases(op: str) -> list[OpCase]:
    log = op == "LogSoftmaxGrad"
    out = []
    for shape, axis, dt, tag in [
        ((5, 7), -1, F32, "f32_2d"),
        ((5, 7, 6), 1, F64, "f64_3d_axis1"),
        ((5, 7, 3), 0, F32, "f32_3d_axis0"),
        ((11,), 0, F64, "f64_1d"),
    ]:
        out.append(
            OpCase(
                op,
                [rand(*shape, dtype=dt, seed=3), _softmax_out(shape, axis, dt, log)],
                attrs={"axis": axis},
                domain="dfdl",
                reference=_softmax_grad_ref(axis, log),
                rtol=1e-4 if dt == F32 else 1e-7,
                atol=1e-5 if dt == F32 else 1e-9,
                id=tag,
            )
        )
    return out


def _cs_layer_norm(x, scale, bias, ax, eps):
    axes = tuple(range(ax, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    d = x - mean
    inv = 1 / np.sqrt((d * d).mean(axis=axes, keepdims=True) + eps)
    return [d * inv * scale + bias, mean, inv]


def _ln_grad_ref(axis=-1, epsilon=1e-5):
    def ref(dY, X, Scale, dMean=None, dInv=None):
        ax = axis % X.ndim
        f = lambda x: _cs_layer_norm(x, Scale, 0.0, ax, epsilon)  # noqa: E731
        return [cs_vjp(f, [X], 0, [dY, dMean, dInv]).astype(X.dtype)]

    return ref


def _ln_param_ref(axis=-1, epsilon=1e-5, param_axis=None):
    def ref(dY, X):
        ax = axis % X.ndim
        pa = ax if param_axis is None else param_axis % X.ndim
        p = X.shape[pa:]
        s, b = np.ones(p), np.zeros(p)
        f = lambda s_, b_: _cs_layer_norm(X, s_, b_, ax, epsilon)[:1]  # noqa: E731
        ds = cs_vjp(f, [s, b], 0, [dY])
        db = cs_vjp(f, [s, b], 1, [dY])
        return [np.stack([ds, db]).astype(X.dtype)]

    return ref


def _tol(dt):
    return {"rtol": 1e-4, "atol": 1e-5} if dt == F32 else {"rtol": 1e-7, "atol": 1e-9}


def _stat(shape, ax, dt, seed):
    return rand(*shape[:ax], *(1,) * (len(shape) - ax), dtype=dt, seed=seed)


_LN_GRAD = [
    OpCase(
        "LayerNormalizationGrad",
        [rand(5, 7, 6, seed=3), rand(5, 7, 6), rand(6, seed=1)],
        domain="dfdl",
        reference=_ln_grad_ref(),
        id="f32_3d",
        **_tol(F32),
    ),
    OpCase(
        "LayerNormalizationGrad",
        [
            rand(5, 7, 6, dtype=F64, seed=3),
            rand(5, 7, 6, dtype=F64),
            rand(7, 6, dtype=F64, seed=1),
            _stat((5, 7, 6), 1, F64, 4),
            _stat((5, 7, 6), 1, F64, 5),
        ],
        attrs={"axis": 1, "epsilon": 1e-2, "stash_type": 11},
        domain="dfdl",
        reference=_ln_grad_ref(axis=1, epsilon=1e-2),
        id="f64_3d_axis1_stats",
        **_tol(F64),
    ),
    OpCase(
        "LayerNormalizationGrad",
        [rand(5, 7, 3, 4, seed=3), rand(5, 7, 3, 4), rand(4, seed=1)],
        attrs={"axis": -2},
        domain="dfdl",
        reference=_ln_grad_ref(axis=-2),
        id="f32_4d_axis-2_bcast",
        **_tol(F32),
    ),
    OpCase(
        "LayerNormalizationGrad",
        [rand(5, 7, 6, dtype=F64, seed=3), rand(5, 7, 6, dtype=F64), rand(7, 6, dtype=F64)],
        domain="dfdl",
        reference=_ln_grad_ref(),
        id="f64_scale_covers_leading_axis",
        **_tol(F64),
    ),
    OpCase(
        "LayerNormalizationGrad",
        [None, rand(5, 7, 6), rand(6, seed=1), _stat((5, 7, 6), 2, F32, 4), None],
        domain="dfdl",
        reference=lambda dY, X, S, dM, dI=None: [
            cs_vjp(lambda x: _cs_layer_norm(x, S, 0.0, 2, 1e-5), [X], 0, [None, dM]).astype(X.dtype)
        ],
        id="f32_mean_grad_only",
        **_tol(F32),
    ),
]

_LN_PARAM = [
    OpCase(
        "LayerNormalizationParamGrad",
        [rand(5, 7, 6, seed=3), rand(5, 7, 6)],
        domain="dfdl",
        reference=_ln_param_ref(),
        id="f32_3d",
        **_tol(F32),
    ),
    OpCase(
        "LayerNormalizationParamGrad",
        [rand(5, 7, 6, dtype=F64, seed=3), rand(5, 7, 6, dtype=F64)],
        attrs={"axis": 1, "epsilon": 1e-2},
        domain="dfdl",
        reference=_ln_param_ref(axis=1, epsilon=1e-2),
        id="f64_3d_axis1",
        **_tol(F64),
    ),
    OpCase(
        "LayerNormalizationParamGrad",
        [rand(5, 7, 3, 4, seed=3), rand(5, 7, 3, 4)],
        attrs={"axis": -1, "param_axis": 1},
        domain="dfdl",
        reference=_ln_param_ref(axis=-1, param_axis=1),
        id="f32_4d_param_axis1",
        **_tol(F32),
    ),
]


def _cs_batch_norm(x, scale, bias, eps, axes):
    """Normalization over ``axes`` with per-channel (or per (n, c)) scale and bias."""
    shp = (1,) * (2 - scale.ndim) + scale.shape + (1,) * (x.ndim - 2)
    mean = x.mean(axis=axes, keepdims=True)
    d = x - mean
    var = (d * d).mean(axis=axes, keepdims=True)
    y = d / np.sqrt(var + eps) * scale.reshape(shp) + bias.reshape(shp)
    return [y, mean.reshape(-1), var.reshape(-1)]


def _bn_grad_ref(epsilon=1e-5):
    def ref(dY, X, scale, dMean=None, dVar=None):
        axes = (0, *range(2, X.ndim))
        b = np.zeros_like(scale)
        f = lambda x, s, b_: _cs_batch_norm(x, s, b_, epsilon, axes)  # noqa: E731
        dys = [dY, dMean, dVar]
        return [
            cs_vjp(f, [X, scale, b], 0, dys).astype(X.dtype),
            cs_vjp(f, [X, scale, b], 1, dys).astype(scale.dtype),
            cs_vjp(f, [X, scale, b], 2, dys).astype(scale.dtype),
        ]

    return ref


def _in_grad_ref(epsilon=1e-5):
    def ref(dY, X, scale):
        axes = tuple(range(2, X.ndim))
        s = np.broadcast_to(scale, X.shape[:2]).copy()
        b = np.zeros(X.shape[:2])
        f = lambda x, s_, b_: _cs_batch_norm(x, s_, b_, epsilon, axes)[:1]  # noqa: E731
        return [
            cs_vjp(f, [X, s, b], 0, [dY]).astype(X.dtype),
            cs_vjp(f, [X, s, b], 1, [dY]).astype(scale.dtype),
            cs_vjp(f, [X, s, b], 2, [dY]).astype(scale.dtype),
        ]

    return ref


_BN_GRAD = [
    OpCase(
        "BatchNormalizationGrad",
        [rand(5, 7, 3, 4, seed=3), rand(5, 7, 3, 4), _chan(7, seed=1)],
        n_outputs=3,
        domain="dfdl",
        reference=_bn_grad_ref(),
        id="f32_4d",
        **_tol(F32),
    ),
    OpCase(
        "BatchNormalizationGrad",
        [
            rand(5, 7, 6, dtype=F64, seed=3),
            rand(5, 7, 6, dtype=F64),
            _chan(7, F64, 1),
            _chan(7, F64, 2),
            _chan(7, F64, 3),
        ],
        attrs={"epsilon": 1e-3},
        n_outputs=3,
        domain="dfdl",
        reference=_bn_grad_ref(1e-3),
        id="f64_3d_stats_grads",
        **_tol(F64),
    ),
    OpCase(
        "BatchNormalizationGrad",
        [rand(5, 7, seed=3), rand(5, 7), _chan(7, seed=1), None, _chan(7, seed=3)],
        n_outputs=3,
        domain="dfdl",
        reference=_bn_grad_ref(),
        id="f32_2d_var_grad",
        **_tol(F32),
    ),
]

_IN_GRAD = [
    OpCase(
        "InstanceNormalizationGrad",
        [rand(5, 7, 3, 4, seed=3), rand(5, 7, 3, 4), _chan(7, seed=1)],
        n_outputs=3,
        domain="dfdl",
        reference=_in_grad_ref(),
        id="f32_4d",
        **_tol(F32),
    ),
    OpCase(
        "InstanceNormalizationGrad",
        [rand(5, 7, 6, dtype=F64, seed=3), rand(5, 7, 6, dtype=F64), _chan(7, F64, 1)],
        attrs={"epsilon": 1e-2},
        n_outputs=3,
        domain="dfdl",
        reference=_in_grad_ref(1e-2),
        id="f64_3d_eps",
        **_tol(F64),
    ),
]


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

CASES += (
    _softmax_grad_cases("SoftmaxGrad")
    + _softmax_grad_cases("LogSoftmaxGrad")
    + _LN_GRAD
    + _LN_PARAM
    + _BN_GRAD
    + _IN_GRAD
    + _DROPOUT_GRAD
)


def _bn_relu_ref(epsilon=1e-5, momentum=0.9):
    """Independent of dfdl: the normalization written out, then max(., 0)."""

    def ref(X, scale, B, input_mean, input_var):
        axes = (0, *range(2, X.ndim))
        y, mean, var = _cs_batch_norm(X.astype(F64), scale, B, epsilon, axes)
        running = [input_mean * momentum + mean * (1 - momentum), input_var * momentum]
        running[1] = running[1] + var * (1 - momentum)
        return [np.maximum(y, 0).astype(X.dtype), *(r.astype(scale.dtype) for r in running)]

    return ref


def _bn_relu_grad_ref(epsilon=1e-5):
    grad = _bn_grad_ref(epsilon)

    def ref(dZ, Z, X, scale, dMean=None, dVar=None):
        return grad(np.where(Z > 0, dZ, 0), X, scale, dMean, dVar)

    return ref


def _relu_of_bn(*shape, dtype=F32):
    """A (dZ, Z) pair where Z has zeros (Relu's cut) and positive values."""
    z = np.maximum(rand(*shape, dtype=dtype, seed=8), 0).astype(dtype)
    return [rand(*shape, dtype=dtype, seed=9), z]


_BN_RELU = [
    OpCase(
        "BatchNormalizationRelu",
        _bn_inputs(5, 7, 3, 4),
        n_outputs=3,
        domain="dfdl",
        reference=_bn_relu_ref(),
        id="f32_4d",
        **_tol(F32),
    ),
    OpCase(
        "BatchNormalizationRelu",
        _bn_inputs(5, 7, 6, dtype=F64),
        attrs={"momentum": 0.7, "epsilon": 1e-3},
        n_outputs=3,
        domain="dfdl",
        reference=_bn_relu_ref(1e-3, 0.7),
        id="f64_3d_momentum",
        **_tol(F64),
    ),
] + [
    # the BatchNormalizationGrad cases, with dY replaced by a Relu's (dZ, Z)
    OpCase(
        "BatchNormalizationReluGrad",
        [*_relu_of_bn(*c.inputs[0].shape, dtype=c.inputs[0].dtype), *c.inputs[1:]],
        attrs=c.attrs,
        n_outputs=3,
        domain="dfdl",
        reference=_bn_relu_grad_ref(c.attrs.get("epsilon", 1e-5)),
        id=c.id,
        **_tol(c.inputs[0].dtype.type),
    )
    for c in _BN_GRAD
]

CASES += _BN_RELU
