"""numba kernels for the fused optimizer updates (``dfdl.SGDUpdate``, ``dfdl.AdamUpdate``).

One loop per tile reads param, grad and state once and writes the new values, instead of
the 6-10 full passes of the numpy forward. The kernels take the forward's inputs and the
hyperparameters resolved by the op's params rule (:func:`dfdl.ops.optim.sgd_params`,
:func:`dfdl.ops.optim.adam_params`); every scalar is cast to the parameter's dtype on the
host first (as torch casts its Python-float hyperparameters), so the loop does the
forward's operations in the same order and dtype, giving bit-identical results. Other
dtypes (float16) take the numpy forward.

Example:
    >>> p = np.ones(3, np.float32); g = np.full(3, 0.5, np.float32)
    >>> sgd_update(p, g, np.float32(0.1), momentum=0.0, dampening=0.0, nesterov=False,
    ...            weight_decay=0.0)
    array([0.95, 0.95, 0.95], dtype=float32)
"""

from __future__ import annotations

import numba
import numpy as np

from dfdl.ops.registry import DFDL_DOMAIN, kernel, lookup

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

# error_model="numpy": x / 0 gives inf/nan like numpy instead of raising
_jit = numba.njit(cache=True, nogil=True, error_model="numpy")


def _flat(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).reshape(-1)


def _same_float(*xs) -> bool:
    d = xs[0].dtype if isinstance(xs[0], np.ndarray) else None
    return d in _FLOATS and all(isinstance(x, np.ndarray) and x.dtype == d for x in xs)


# ------------------------------------------------------------------------------- SGD


@_jit
def _sgd(p, g, buf, out_p, out_buf, neg_lr, wd, mom, damp_c, use_wd, use_mom, nesterov, first):
    for i in range(p.size):
        gi = g[i]
        if use_wd:
            gi = gi + wd * p[i]
        if use_mom:
            if first:
                b = gi
            else:
                b = buf[i] * mom + damp_c * gi
            out_buf[i] = b
            if nesterov:
                gi = gi + mom * b
            else:
                gi = b
        out_p[i] = p[i] + neg_lr * gi


def _accepts_sgd(param, grad, lr, momentum_buffer=None, first=None, *, momentum=0.0, **attrs):
    tensors = [param, grad] + ([momentum_buffer] if momentum != 0 else [])
    return _same_float(*tensors)


@kernel("SGDUpdate", accepts=_accepts_sgd, domain=DFDL_DOMAIN)
def sgd_update(
    param,
    grad,
    lr,
    momentum_buffer=None,
    first=None,
    *,
    momentum,
    dampening,
    nesterov,
    weight_decay,
):
    """numba :func:`dfdl.ops.optim.SGDUpdate` (same results, bit for bit)."""
    dt = param.dtype.type
    p, g = _flat(param), _flat(grad)
    use_mom = momentum != 0
    buf = _flat(momentum_buffer) if use_mom else p
    out_p = np.empty_like(p)
    out_buf = np.empty_like(p) if use_mom else out_p
    _sgd(
        p,
        g,
        buf,
        out_p,
        out_buf,
        -dt(lr),
        dt(weight_decay),
        dt(momentum),
        dt(1.0 - dampening),
        weight_decay != 0,
        use_mom,
        nesterov,
        use_mom and float(first) != 0,
    )
    new = out_p.reshape(param.shape)
    return (new, out_buf.reshape(param.shape)) if use_mom else new


# ------------------------------------------------------------------------------ Adam


@_jit
def _adam(p, g, m, v, out_p, out_m, out_v, decay, use_decay, wd, use_wd, w1, one, b2, c2, bc2, eps,
          neg_step):  # fmt: skip
    small = abs(w1) < 0.5
    for i in range(p.size):
        pi = p[i]
        if use_decay:
            pi = pi * decay
        gi = g[i]
        if use_wd:
            gi = gi + wd * pi
        mi = m[i]
        # torch.lerp: start + w * (end - start) for small w, else end - (end - start) * (1 - w)
        if small:
            mi = mi + w1 * (gi - mi)
        else:
            mi = gi - (gi - mi) * (one - w1)
        vi = v[i] * b2 + c2 * gi * gi
        denom = np.sqrt(vi) / bc2 + eps
        out_p[i] = pi + neg_step * mi / denom
        out_m[i] = mi
        out_v[i] = vi


def _accepts_adam(param, grad, exp_avg, exp_avg_sq, *rest, **attrs):
    return _same_float(param, grad, exp_avg, exp_avg_sq)


@kernel("AdamUpdate", accepts=_accepts_adam, domain=DFDL_DOMAIN)
def adam_update(
    param,
    grad,
    exp_avg,
    exp_avg_sq,
    step_size,
    bias_correction2_sqrt,
    decay=None,
    *,
    beta1,
    beta2,
    eps,
    weight_decay,
):
    """numba :func:`dfdl.ops.optim.AdamUpdate` (same results, bit for bit)."""
    dt = param.dtype.type
    p = _flat(param)
    outs = [np.empty_like(p) for _ in range(3)]
    _adam(
        p,
        _flat(grad),
        _flat(exp_avg),
        _flat(exp_avg_sq),
        *outs,
        dt(1.0 if decay is None else decay),
        decay is not None,
        dt(weight_decay),
        weight_decay != 0,
        dt(1.0 - beta1),
        dt(1.0),
        dt(beta2),
        dt(1.0 - beta2),
        dt(bias_correction2_sqrt),
        dt(eps),
        -dt(step_size),
    )
    return tuple(o.reshape(param.shape) for o in outs)


@kernel("UpdateGroup", domain=DFDL_DOMAIN)
def update_group(*inputs, update, members, member_attrs):
    """:func:`dfdl.ops.optim.UpdateGroup` on the CPU: each member (its inputs at the
    positions ``members`` gives) runs its update op's CPU tile function, so the results
    are the members' own tasks', bit for bit.

    Example:
        >>> p = np.ones(2, np.float32); g = np.full(2, 0.5, np.float32)
        >>> update_group(np.float32(0.1), p, g, update="SGDUpdate", members=[[1, 2, 0]],
        ...              member_attrs={})[0]
        array([0.95, 0.95], dtype=float32)
    """
    fn = lookup(update, DFDL_DOMAIN).kernel("cpu")
    out: list = []
    for positions in members:
        r = fn(*(inputs[i] for i in positions), **member_attrs)
        out += list(r) if isinstance(r, tuple) else [r]
    return tuple(out)
