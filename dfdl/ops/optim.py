"""Fused optimizer update ops (``dfdl`` domain): one pass over param, grad and state.

``dfdl.SGDUpdate`` and ``dfdl.AdamUpdate`` apply one step of ``torch.optim.SGD`` and
``torch.optim.Adam``/``AdamW`` to a tensor, reproducing torch's single-tensor (CPU)
code path operation by operation in the parameter's dtype, so results agree with
torch to float rounding. Hyperparameters that never change are attributes; values that
change from step to step (learning rate, bias corrections) are 0-d inputs computed on
the host by :mod:`dfdl.optim`. Both ops are elementwise: every output tile needs only
the same tile of each tensor input, so updates tile exactly like the parameter.

They are not differentiable (updates are never differentiated). The CPU kernels
(:mod:`dfdl.ops.cpu.optim`) receive the hyperparameters resolved by the params rules.

Example:
    >>> p = np.ones(3, np.float32); g = np.full(3, 0.5, np.float32)
    >>> SGDUpdate(p, g, np.float32(0.1))
    array([0.95, 0.95, 0.95], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from dfdl.errors import ShapeError, UnsupportedOpError
from dfdl.ops.common import elementwise_tile, whole_tile
from dfdl.ops.registry import DFDL_DOMAIN, TensorType, lookup, register


def _check_same(op: str, inputs, names: tuple[str, ...]) -> None:
    """Tensor inputs (present ones) must all have the parameter's type."""
    p = inputs[0]
    if p.dtype.kind != "f":
        raise ShapeError(f"{op}: the parameter must be a float tensor, got {p.dtype}")
    for t, name in zip(inputs[1:], names[1:]):
        if t is not None and (t.shape != p.shape or t.dtype != p.dtype):
            raise ShapeError(
                f"{op}: {name} has type {list(t.shape)} {t.dtype}, the parameter "
                f"{list(p.shape)} {p.dtype}",
                name=name,
                expected=p.shape,
                given=t.shape,
            )


def _check_scalars(op: str, inputs, names: tuple[str, ...]) -> None:
    for t, name in zip(inputs, names):
        if t is not None and (t.rank != 0 or t.dtype.kind != "f"):
            raise ShapeError(
                f"{op}: {name} must be a 0-d float tensor, got {list(t.shape)} {t.dtype}",
                name=name,
            )


# --------------------------------------------------------------------------- SGDUpdate


def _sgd_shape(inputs, consts, *, momentum=0.0, dampening=0.0, nesterov=0, weight_decay=0.0):
    inputs = list(inputs) + [None] * (5 - len(inputs))
    _check_same("SGDUpdate", [inputs[0], inputs[1], inputs[3]], ("param", "grad", "buffer"))
    _check_scalars("SGDUpdate", [inputs[2], inputs[4]], ("lr", "first"))
    if momentum != 0 and (inputs[3] is None or inputs[4] is None):
        raise UnsupportedOpError(
            "SGDUpdate: momentum != 0 needs the momentum_buffer and first inputs",
            op_type="SGDUpdate",
            domain=DFDL_DOMAIN,
        )
    if nesterov and (momentum <= 0 or dampening != 0):
        raise UnsupportedOpError(
            "SGDUpdate: nesterov needs momentum > 0 and dampening == 0",
            op_type="SGDUpdate",
            domain=DFDL_DOMAIN,
        )
    p = inputs[0]
    return [p, TensorType(p.shape, p.dtype)] if momentum != 0 else [p]


def sgd_params(
    param,
    grad,
    lr,
    momentum_buffer=None,
    first=None,
    *,
    momentum=0.0,
    dampening=0.0,
    nesterov=0,
    weight_decay=0.0,
) -> dict:
    """The SGDUpdate kernels' parameters: the hyperparameters as floats, ``nesterov`` as
    a bool.

    Example:
        >>> sgd_params(None, None, None, momentum=0.9, nesterov=1)["nesterov"]
        True
    """
    return {
        "momentum": float(momentum),
        "dampening": float(dampening),
        "nesterov": bool(nesterov),
        "weight_decay": float(weight_decay),
    }


@register(
    "SGDUpdate",
    domain=DFDL_DOMAIN,
    shape=_sgd_shape,
    tile=elementwise_tile,
    params=sgd_params,
    differentiable=False,
)
def SGDUpdate(
    param,
    grad,
    lr,
    momentum_buffer=None,
    first=None,
    *,
    momentum=0.0,
    dampening=0.0,
    nesterov=0,
    weight_decay=0.0,
):
    """One ``torch.optim.SGD`` step; returns the new param (and buffer when momentum != 0).

    ``first`` (0-d) is nonzero at the optimizer's first step, where torch initializes
    the momentum buffer to the (weight-decayed) gradient itself, undampened.
    """
    dt = param.dtype.type
    g = grad
    if weight_decay != 0:
        g = g + dt(weight_decay) * param
    buf = None
    if momentum != 0:
        if float(first) != 0:
            buf = np.array(g, copy=True)
        else:
            buf = momentum_buffer * dt(momentum) + dt(1.0 - dampening) * g
        g = g + dt(momentum) * buf if nesterov else buf
    new = param + (-dt(lr)) * g
    return (new, buf) if momentum != 0 else new


# -------------------------------------------------------------------------- AdamUpdate


def _adam_shape(inputs, consts, *, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    inputs = list(inputs) + [None] * (7 - len(inputs))
    _check_same("AdamUpdate", inputs[:4], ("param", "grad", "exp_avg", "exp_avg_sq"))
    if inputs[2] is None or inputs[3] is None:
        raise ShapeError("AdamUpdate: exp_avg and exp_avg_sq are required inputs")
    _check_scalars("AdamUpdate", inputs[4:7], ("step_size", "bias_correction2_sqrt", "decay"))
    if inputs[4] is None or inputs[5] is None:
        raise ShapeError("AdamUpdate: step_size and bias_correction2_sqrt are required inputs")
    p = inputs[0]
    return [p, TensorType(p.shape, p.dtype), TensorType(p.shape, p.dtype)]


def _lerp(start, end, weight):
    """torch.lerp's formula: two forms, whichever is exact at its end of [0, 1]."""
    if abs(weight) < 0.5:
        return start + weight * (end - start)
    return end - (end - start) * (type(weight)(1.0) - weight)


def adam_params(
    param,
    grad,
    exp_avg,
    exp_avg_sq,
    step_size,
    bias_correction2_sqrt,
    decay=None,
    *,
    beta1=0.9,
    beta2=0.999,
    eps=1e-8,
    weight_decay=0.0,
) -> dict:
    """The AdamUpdate kernels' parameters: the hyperparameters as floats.

    Example:
        >>> adam_params(*[None] * 6, beta1=0.8)
        {'beta1': 0.8, 'beta2': 0.999, 'eps': 1e-08, 'weight_decay': 0.0}
    """
    return {
        "beta1": float(beta1),
        "beta2": float(beta2),
        "eps": float(eps),
        "weight_decay": float(weight_decay),
    }


@register(
    "AdamUpdate",
    domain=DFDL_DOMAIN,
    shape=_adam_shape,
    tile=elementwise_tile,
    params=adam_params,
    differentiable=False,
)
def AdamUpdate(
    param,
    grad,
    exp_avg,
    exp_avg_sq,
    step_size,
    bias_correction2_sqrt,
    decay=None,
    *,
    beta1=0.9,
    beta2=0.999,
    eps=1e-8,
    weight_decay=0.0,
):
    """One ``torch.optim.Adam`` step (``AdamW`` when ``decay`` is given).

    Returns ``(param, exp_avg, exp_avg_sq)``. ``step_size = lr / (1 - beta1**t)`` and
    ``bias_correction2_sqrt = (1 - beta2**t) ** 0.5`` come from the host; ``decay`` is
    AdamW's ``1 - lr * weight_decay`` (decoupled decay, applied to the param first);
    ``weight_decay`` is Adam's L2 term added to the gradient.
    """
    dt = param.dtype.type
    p = param
    if decay is not None:
        p = p * dt(decay)
    g = grad
    if weight_decay != 0:
        g = g + dt(weight_decay) * p
    m = _lerp(exp_avg, g, dt(1.0 - beta1))
    v = exp_avg_sq * dt(beta2) + dt(1.0 - beta2) * g * g
    denom = np.sqrt(v) / dt(bias_correction2_sqrt) + dt(eps)
    new = p + (-dt(step_size)) * m / denom
    return new, m, v


# ------------------------------------------------------------------------- UpdateGroup

#: the update ops a group may hold, and the input positions of their per-step scalars
#: (shared by every parameter of an optimizer step); a split BatchNorm's running
#: statistics update (:mod:`dfdl.ops.batch_norm`) has none
GROUPABLE = {"SGDUpdate": (2, 4), "AdamUpdate": (4, 5, 6), "BatchNormRunning": ()}


def _member_positions(
    n_inputs: int, update: str, layout, arity: int, n_shared: int
) -> list[list[int]]:
    """Per member update, the positions of its inputs among the group's ``n_inputs``:
    ``layout[i]`` >= 0 is the member's tensor input of that index, < 0 the shared input
    ``-1 - layout[i]``."""
    if update not in GROUPABLE:
        raise UnsupportedOpError(
            f"UpdateGroup: cannot group {update!r} (groupable: {sorted(GROUPABLE)})",
            op_type="UpdateGroup",
            domain=DFDL_DOMAIN,
        )
    n_tensors = max(0, n_inputs - n_shared)
    if arity < 1 or not n_tensors or n_tensors % arity:
        raise ShapeError(f"UpdateGroup: {n_tensors} tensor inputs for members of {arity}")
    if any(-1 - i >= n_shared for i in layout if i < 0):
        raise ShapeError(
            f"UpdateGroup: layout {list(layout)} names a shared input past the {n_shared} given"
        )
    return [
        [n_shared + k + i if i >= 0 else -1 - i for i in layout] for k in range(0, n_tensors, arity)
    ]


def _members(inputs, update: str, layout, arity: int, n_shared: int) -> list[list]:
    """The member updates' input lists (see :func:`_member_positions`)."""
    inputs = list(inputs)
    return [
        [inputs[i] for i in positions]
        for positions in _member_positions(len(inputs), update, layout, arity, n_shared)
    ]


def _group_shape(inputs, consts, *, update, layout, arity, n_shared, **attrs):
    rule = lookup(update, DFDL_DOMAIN).shape if update in GROUPABLE else None
    out = []
    for ins, cs in zip(
        _members(inputs, update, layout, arity, n_shared),
        _members(consts, update, layout, arity, n_shared),
    ):
        out += rule(ins, cs, **attrs)
    return out


def run_group(kernel_of, inputs, update, layout, arity, n_shared, attrs) -> tuple:
    """Run each member update with ``kernel_of(update)``; their outputs, in order."""
    fn = kernel_of(update)
    out: list = []
    for ins in _members(inputs, update, layout, arity, n_shared):
        r = fn(*ins, **attrs)
        out += list(r) if isinstance(r, tuple) else [r]
    return tuple(out)


def update_group_params(*inputs, update, layout, arity, n_shared, **attrs) -> dict:
    """The UpdateGroup kernels' parameters: the member op ``update``, ``members`` (per
    member, the positions of its inputs among the group's) and ``member_attrs`` (the
    member op's attributes, which its own params rule resolves).

    Example:
        >>> p = update_group_params(0.1, "p1", "g1", "p2", "g2", update="SGDUpdate",
        ...                         layout=[0, 1, -1], arity=2, n_shared=1)
        >>> p["members"]
        [[1, 2, 0], [3, 4, 0]]
    """
    return {
        "update": update,
        "members": _member_positions(len(inputs), update, layout, arity, n_shared),
        "member_attrs": attrs,
    }


@register(
    "UpdateGroup",
    domain=DFDL_DOMAIN,
    shape=_group_shape,
    tile=whole_tile,
    params=update_group_params,
    differentiable=False,
)
def UpdateGroup(*inputs, update, layout, arity, n_shared, **attrs):
    """Several parameters' ``update`` ops (``SGDUpdate``/``AdamUpdate``, or a split
    BatchNorm's running statistics, ``BatchNormRunning``) in one node.

    Inputs are the ``n_shared`` per-step scalars, then each member's ``arity`` tensor
    inputs; ``layout`` places them in the member op's input order. Outputs are the
    members' outputs, member by member; ``attrs`` are the member op's. One node (one
    task per step) instead of one per small parameter: a task costs the embedded
    cluster a scheduler round trip, and a network's biases and normalization scales are
    dozens of tasks of a few microseconds each (:mod:`dfdl.training.passes.group_updates`).

    Example:
        >>> p = np.ones(2, np.float32); g = np.full(2, 0.5, np.float32)
        >>> UpdateGroup(np.float32(0.1), p, g, p, g, update="SGDUpdate",
        ...             layout=[0, 1, -1], arity=2, n_shared=1)[1]
        array([0.95, 0.95], dtype=float32)
    """
    return run_group(_member_forward, inputs, update, layout, arity, n_shared, attrs)


def _member_forward(update: str):
    return lookup(update, DFDL_DOMAIN).forward
