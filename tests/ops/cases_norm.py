"""OpCases for Instance- and LayerNormalization and their gradients (dfdl/ops/norm.py).

Also the complex-step helpers that the other case files of normalizations and losses
share (:func:`cs_vjp`, ``_cs_batch_norm``, ``_chan``, ``_tol``).
"""

from __future__ import annotations

import numpy as np

from tests.ops.case import OpCase, rand

F32, F64 = np.float32, np.float64


def _chan(c: int, dtype=F32, seed=0, positive=False) -> np.ndarray:
    """A per-channel parameter; variances are positive."""
    if positive:
        return rand(c, dtype=dtype, seed=seed, low=0.5, high=2.0)
    return rand(c, dtype=dtype, seed=seed)


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


CASES = _IN + _LN


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


CASES += _LN_GRAD + _LN_PARAM + _IN_GRAD


# ------------------------------------------------- Group-, RMS- and LpNormalization

F16 = np.float16
_F16_TOL = {"rtol": 1e-2, "atol": 1e-2}


def _gn(X, G, tag, *, epsilon=None, stash=None, dtype=None, seed=1, no_grad=False, **tol):
    c = X.shape[1]
    dt = dtype or X.dtype
    attrs = {"num_groups": G}
    if epsilon is not None:
        attrs["epsilon"] = epsilon
    if stash is not None:
        attrs["stash_type"] = stash
    case = OpCase(
        "GroupNormalization",
        [X, _chan(c, dt, seed), _chan(c, dt, seed + 1)],
        attrs,
        id=tag,
        **tol,
    )
    # float64 finite differences of a float32-stash forward measure its rounding
    case.no_grad = no_grad or stash in (None, 1)
    return case


_GN = [
    _gn(rand(5, 6, 3, 4), 3, "f32_4d_g3"),
    _gn(rand(5, 6, 3, 4), 3, "f32_4d_g3_stash64", stash=11),
    _gn(rand(4, 6, 5, dtype=F64), 6, "f64_3d_g_is_c_eps", epsilon=1e-2, stash=11),
    _gn(rand(4, 6, 5, dtype=F64), 1, "f64_3d_g1", stash=11),
    _gn(rand(5, 8, dtype=F64), 2, "f64_2d_g2", stash=11),
    _gn(rand(3, 4, 2, 3, 2), 2, "f32_5d_g2_stash64", stash=11),
    _gn(rand(5, 6, 3, 4, dtype=F16), 2, "f16", **_F16_TOL),
]


def _rms_reference(axis=-1, epsilon=1e-5, stash=np.float32):
    """RMSNormalization per its ONNX function body (the evaluator knows stash 1 only)."""

    def ref(X, scale):
        axes = tuple(range(axis % X.ndim, X.ndim))
        xs = X.astype(stash)
        rms = np.sqrt((xs * xs).mean(axis=axes, keepdims=True) + epsilon)
        return [((xs / rms).astype(X.dtype) * scale).astype(X.dtype)]

    return ref


def _rms(X, scale, tag, *, axis=None, epsilon=None, stash=None, **kw):
    attrs = {}
    if axis is not None:
        attrs["axis"] = axis
    if epsilon is not None:
        attrs["epsilon"] = epsilon
    if stash is not None:
        attrs["stash_type"] = stash
    ref = None
    if stash == 11:
        ref = _rms_reference(
            -1 if axis is None else axis, 1e-5 if epsilon is None else epsilon, np.float64
        )
    case = OpCase("RMSNormalization", [X, scale], attrs, id=tag, reference=ref, opset=23, **kw)
    case.no_grad = stash in (None, 1)
    return case


_RMS = [
    _rms(rand(5, 7, 6), rand(6, seed=1), "f32_3d"),
    _rms(rand(5, 7, 3, 4), rand(7, 1, 4, seed=1), "f32_4d_axis1_bcast", axis=1),
    _rms(rand(5, 7, 6), rand(6, seed=1), "f32_3d_stash64", stash=11),
    _rms(_f64(5, 7, 6), _f64(7, 6, seed=1), "f64_scale_covers_leading_axis", stash=11),
    _rms(
        _f64(5, 7, 3, 4), _f64(3, 4, seed=1), "f64_4d_axis-2_eps", axis=-2, epsilon=1e-2, stash=11
    ),
    _rms(_f64(4, 3, 5), _f64(4, 3, 5, seed=1), "f64_axis0", axis=0, stash=11),
    _rms(rand(5, 7, 6, dtype=F16), rand(6, dtype=F16, seed=1), "f16", **_F16_TOL),
]


def _lp_reference(axis=-1, p=2):
    """LpNormalization per the spec (the evaluator sums x, not |x|, for p=1)."""

    def ref(X):
        x = X.astype(np.float64)
        n = (
            np.abs(x).sum(axis=axis, keepdims=True)
            if p == 1
            else np.sqrt((x * x).sum(axis, keepdims=True))
        )
        with np.errstate(invalid="ignore", divide="ignore"):
            return [np.where(n == 0, 0, x / n).astype(X.dtype)]

    return ref


def _lp_zeros() -> np.ndarray:
    x = rand(5, 7, 6, seed=4)
    x[2, 3, :] = 0
    return x


_LP = [
    OpCase("LpNormalization", [rand(5, 7, 6)], id="f32_default"),
    OpCase("LpNormalization", [rand(5, 7, 6)], {"axis": 1, "p": 2}, id="f32_axis1"),
    OpCase("LpNormalization", [_f64(5, 7, 6)], {"axis": 0}, id="f64_axis0", rtol=1e-10),
    OpCase(
        "LpNormalization",
        [rand(5, 7, 6)],
        {"axis": -1, "p": 1},
        reference=_lp_reference(-1, 1),
        id="f32_p1",
    ),
    OpCase(
        "LpNormalization",
        [_f64(5, 7, 6)],
        {"axis": 1, "p": 1},
        reference=_lp_reference(1, 1),
        id="f64_p1_axis1",
    ),
    OpCase("LpNormalization", [rand(5, 7, 6, dtype=F16)], id="f16", **_F16_TOL),
]
# a zero norm gives 0 (and no derivative): forward only
_zero_cases = [
    OpCase("LpNormalization", [_lp_zeros()], id="zero_norm", reference=_lp_reference(-1, 2)),
    OpCase(
        "LpNormalization",
        [_lp_zeros()],
        {"p": 1},
        id="zero_norm_p1",
        reference=_lp_reference(-1, 1),
    ),
]
for _c in _zero_cases:
    _c.no_grad = True
_LP += _zero_cases


def _cs_group_norm(x, scale, bias, g, eps):
    n, c = x.shape[:2]
    xs = x.reshape(n, g, -1)
    mean = xs.mean(axis=2, keepdims=True)
    d = xs - mean
    y = (d / np.sqrt((d * d).mean(axis=2, keepdims=True) + eps)).reshape(x.shape)
    shp = (1, c) + (1,) * (x.ndim - 2)
    return [y * scale.reshape(shp) + bias.reshape(shp)]


def _gn_grad_ref(g, epsilon=1e-5):
    def ref(dY, X, scale):
        n, c = X.shape[:2]
        s = np.broadcast_to(scale, (n, c)).copy()
        bias = np.zeros((n, c))

        def f(x, s_, b_):
            # per-sample scale/bias rows give the per-(n, c) parameter gradients
            outs = [_cs_group_norm(x[i : i + 1], s_[i], b_[i], g, epsilon)[0] for i in range(n)]
            return [np.concatenate(outs)]

        return [
            cs_vjp(f, [X, s, bias], 0, [dY]).astype(X.dtype),
            cs_vjp(f, [X, s, bias], 1, [dY]).astype(scale.dtype),
            cs_vjp(f, [X, s, bias], 2, [dY]).astype(scale.dtype),
        ]

    return ref


def _cs_rms(x, scale, ax, eps):
    axes = tuple(range(ax, x.ndim))
    return [x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + eps) * scale]


def _rms_grad_ref(axis=-1, epsilon=1e-5):
    def ref(dY, X, scale):
        ax = axis % X.ndim
        return [cs_vjp(lambda x: _cs_rms(x, scale, ax, epsilon), [X], 0, [dY]).astype(X.dtype)]

    return ref


def _rms_param_ref(axis=-1, epsilon=1e-5, param_axis=None):
    def ref(dY, X):
        ax = axis % X.ndim
        pa = ax if param_axis is None else param_axis % X.ndim
        s = np.ones(X.shape[pa:])
        return [cs_vjp(lambda s_: _cs_rms(X, s_, ax, epsilon), [s], 0, [dY]).astype(X.dtype)]

    return ref


def _cs_lp(x, ax, p):
    if p == 1:
        # |x| as sign(re x) * x: analytic along the complex step
        n = (np.sign(x.real) * x).sum(axis=ax, keepdims=True)
    else:
        n = np.sqrt((x * x).sum(axis=ax, keepdims=True))
    return [x / n]


def _lp_grad_ref(axis=-1, p=2):
    def ref(dY, X):
        return [cs_vjp(lambda x: _cs_lp(x, axis % X.ndim, p), [X], 0, [dY]).astype(X.dtype)]

    return ref


_NORM_GRADS = [
    OpCase(
        "GroupNormalizationGrad",
        [rand(4, 6, 3, 2, seed=3), rand(4, 6, 3, 2), _chan(6, seed=1)],
        {"num_groups": 3},
        n_outputs=3,
        domain="dfdl",
        reference=_gn_grad_ref(3),
        id="f32_4d_g3",
        **_tol(F32),
    ),
    OpCase(
        "GroupNormalizationGrad",
        [_f64(3, 4, 5, seed=3), _f64(3, 4, 5), _chan(4, F64, 1)],
        {"num_groups": 1, "epsilon": 1e-2},
        n_outputs=3,
        domain="dfdl",
        reference=_gn_grad_ref(1, 1e-2),
        id="f64_3d_g1_eps",
        **_tol(F64),
    ),
    OpCase(
        "RMSNormalizationGrad",
        [rand(5, 7, 6, seed=3), rand(5, 7, 6), rand(6, seed=1)],
        domain="dfdl",
        reference=_rms_grad_ref(),
        id="f32_3d",
        **_tol(F32),
    ),
    OpCase(
        "RMSNormalizationGrad",
        [_f64(5, 7, 3, 4, seed=3), _f64(5, 7, 3, 4), _f64(7, 1, 4, seed=1)],
        {"axis": 1, "epsilon": 1e-2},
        domain="dfdl",
        reference=_rms_grad_ref(1, 1e-2),
        id="f64_4d_axis1_bcast",
        **_tol(F64),
    ),
    OpCase(
        "RMSNormalizationParamGrad",
        [rand(5, 7, 6, seed=3), rand(5, 7, 6)],
        domain="dfdl",
        reference=_rms_param_ref(),
        id="f32_3d",
        **_tol(F32),
    ),
    OpCase(
        "RMSNormalizationParamGrad",
        [_f64(5, 7, 3, 4, seed=3), _f64(5, 7, 3, 4)],
        {"axis": -1, "param_axis": 1, "epsilon": 1e-2},
        domain="dfdl",
        reference=_rms_param_ref(-1, 1e-2, 1),
        id="f64_4d_param_axis1",
        **_tol(F64),
    ),
    OpCase(
        "LpNormalizationGrad",
        [rand(5, 7, 6, seed=3), rand(5, 7, 6)],
        domain="dfdl",
        reference=_lp_grad_ref(),
        id="f32_p2",
        **_tol(F32),
    ),
    OpCase(
        "LpNormalizationGrad",
        [_f64(5, 7, 6, seed=3), _f64(5, 7, 6)],
        {"axis": 1, "p": 1},
        domain="dfdl",
        reference=_lp_grad_ref(1, 1),
        id="f64_p1_axis1",
        **_tol(F64),
    ),
]


CASES += _GN + _RMS + _LP + _NORM_GRADS
