"""Cases for the fused optimizer updates ``dfdl.SGDUpdate`` and ``dfdl.AdamUpdate``, and
for ``dfdl.UpdateGroup`` of several of them.

The references are the textbook update formulas evaluated in float64 (independent of
the ops' torch-ordered float32 arithmetic); test_optim.py checks the ops against
torch.optim itself.
"""

from __future__ import annotations

import numpy as np

from dfdl.ops.optim import GROUPABLE
from tests.ops.case import OpCase, rand


def _f(x, dtype=np.float32) -> np.ndarray:
    return np.asarray(x, dtype=dtype)


def _sgd_ref(momentum=0.0, dampening=0.0, nesterov=0, weight_decay=0.0):
    def ref(p, g, lr, buf=None, first=None):
        dt = p.dtype
        p, g, lr = (np.asarray(a, np.float64) for a in (p, g, lr))
        g = g + weight_decay * p
        if momentum == 0:
            return [(p - lr * g).astype(dt)]
        if float(first):
            buf = g
        else:
            buf = momentum * np.asarray(buf, np.float64) + (1 - dampening) * g
        step = g + momentum * buf if nesterov else buf
        return [(p - lr * step).astype(dt), buf.astype(dt)]

    return ref


def _adam_ref(beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    def ref(p, g, m, v, step_size, bc2_sqrt, decay=None):
        dt = p.dtype
        p, g, m, v = (np.asarray(a, np.float64) for a in (p, g, m, v))
        if decay is not None:
            p = p * float(decay)
        g = g + weight_decay * p
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        p = p - float(step_size) * m / (np.sqrt(v) / float(bc2_sqrt) + eps)
        return [p.astype(dt), m.astype(dt), v.astype(dt)]

    return ref


def _sgd(shape, dtype, attrs, *, first=None, id, rtol=1e-5, atol=1e-6):
    p, g = rand(*shape, dtype=dtype, seed=1), rand(*shape, dtype=dtype, seed=2)
    inputs = [np.asarray(p), np.asarray(g), _f(0.1)]
    if attrs.get("momentum", 0.0):
        inputs += [np.asarray(rand(*shape, dtype=dtype, seed=3)), _f(first)]
    return OpCase(
        "SGDUpdate",
        inputs,
        attrs,
        n_outputs=2 if attrs.get("momentum", 0.0) else 1,
        domain="dfdl",
        reference=_sgd_ref(**attrs),
        id=id,
        rtol=rtol,
        atol=atol,
    )


def _adam(shape, dtype, attrs, *, decay=None, id, scalar_dtype=np.float32):
    p, g = rand(*shape, dtype=dtype, seed=4), rand(*shape, dtype=dtype, seed=5)
    m = rand(*shape, dtype=dtype, seed=6, low=-0.5, high=0.5)
    v = rand(*shape, dtype=dtype, seed=7, low=0.01, high=1.0)
    inputs = [np.asarray(a) for a in (p, g, m, v)] + [_f(0.05, scalar_dtype), _f(0.3, scalar_dtype)]
    if decay is not None:
        inputs.append(_f(decay, scalar_dtype))
    return OpCase(
        "AdamUpdate",
        inputs,
        attrs,
        n_outputs=3,
        domain="dfdl",
        reference=_adam_ref(**attrs),
        id=id,
    )


def _group(members: list[OpCase], *, id) -> OpCase:
    """``dfdl.UpdateGroup`` of member cases with one op, attributes and scalar values:
    the shared scalars are the first member's; the reference is the members'."""
    first = members[0]
    n = len(first.inputs)
    shared_at = [i for i in GROUPABLE[first.op] if i < n]
    layout, arity = [], 0
    for i in range(n):
        if i in shared_at:
            layout.append(-1 - shared_at.index(i))
        else:
            layout.append(arity)
            arity += 1
    inputs = [first.inputs[i] for i in shared_at]
    for m in members:
        inputs += [m.inputs[i] for i in range(n) if i not in shared_at]

    def reference(*_):
        return [o for m in members for o in m.reference(*m.inputs)]

    attrs = {**first.attrs, "update": first.op, "layout": layout, "arity": arity}
    return OpCase(
        "UpdateGroup",
        inputs,
        {**attrs, "n_shared": len(shared_at)},
        n_outputs=sum(m.n_outputs for m in members),
        domain="dfdl",
        reference=reference,
        id=id,
        rtol=max(m.rtol for m in members),
        atol=max(m.atol for m in members),
    )


_MOMENTUM = {"momentum": 0.9, "dampening": 0.2, "weight_decay": 0.01}

CASES = [
    _sgd((5, 7), np.float32, {}, id="plain"),
    _sgd((5, 7), np.float32, {"weight_decay": 0.01}, id="weight_decay"),
    _sgd(
        (5, 7),
        np.float32,
        {"momentum": 0.9, "dampening": 0.2, "weight_decay": 0.01},
        first=1.0,
        id="momentum_first_step",
    ),
    _sgd(
        (3, 4, 5),
        np.float64,
        {"momentum": 0.8, "dampening": 0.1, "weight_decay": 0.05},
        first=0.0,
        id="momentum_f64",
    ),
    _sgd((7,), np.float32, {"momentum": 0.9, "nesterov": 1}, first=0.0, id="nesterov"),
    _sgd((5, 3), np.float16, {"momentum": 0.5}, first=0.0, id="f16", rtol=1e-2, atol=1e-2),
    _adam((5, 7), np.float32, {}, id="adam"),
    _adam(
        (3, 4, 5),
        np.float64,
        {"beta1": 0.8, "beta2": 0.99, "eps": 1e-6, "weight_decay": 0.1},
        id="adam_l2_f64",
        scalar_dtype=np.float64,
    ),
    _adam((6,), np.float32, {"beta1": 0.3, "beta2": 0.9}, decay=0.99, id="adamw_small_beta1"),
    _adam((), np.float32, {}, decay=0.999, id="adamw_scalar_param"),
    _group(
        [_sgd((5, 7), np.float32, {}, id="a"), _sgd((3,), np.float32, {}, id="b")],
        id="group_sgd",
    ),
    _group(
        [
            _sgd((5, 7), np.float32, _MOMENTUM, first=0.0, id="a"),
            _sgd((4, 2, 3), np.float32, _MOMENTUM, first=0.0, id="b"),
        ],
        id="group_sgd_momentum",
    ),
    _group(
        [
            _adam((5, 7), np.float32, {}, decay=0.99, id="a"),
            _adam((6,), np.float32, {}, decay=0.99, id="b"),
            _adam((), np.float32, {}, decay=0.99, id="c"),
        ],
        id="group_adamw",
    ),
]
