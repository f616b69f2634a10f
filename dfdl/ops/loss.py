"""Loss ops: SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss, with their VJPs.

Inputs are scores ``(N, C, d1, ...)``, integer labels ``(N, d1, ...)`` and optional class
weights ``(C,)``. The labels input is not differentiable (a VJP returns None for it);
scores and weights get gradients from the ``dfdl``-domain backward ops below.

The CPU kernel of ``dfdl.SoftmaxCrossEntropyLossGrad`` (:mod:`dfdl.ops.cpu.loss`)
receives the coefficients :func:`sce_grad_params` resolves.

Example:
    >>> from dfdl.ops import REGISTRY
    >>> loss, log_prob = REGISTRY["SoftmaxCrossEntropyLoss"].forward(
    ...     np.zeros((2, 4), np.float32), np.array([0, 3]))
    >>> round(float(loss), 4)  # log(4)
    1.3863
"""

from __future__ import annotations

import numpy as np

from dfdl.errors import ShapeError, UnsupportedOpError
from dfdl.ops.common import letters
from dfdl.ops.registry import DFDL_DOMAIN, TensorType, TileContext, TileSpec, defvjp, register

_REDUCTIONS = ("none", "mean", "sum")


def _check(op: str, inputs, reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise UnsupportedOpError(
            f"{op}: reduction={reduction!r} is not one of {_REDUCTIONS}", op_type=op
        )
    X, T, W = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
    if X.rank < 2 or T.shape != X.shape[:1] + X.shape[2:]:
        raise ShapeError(
            f"{op}: scores {X.shape} and labels {T.shape} must be (N, C, d...) and (N, d...)",
            name="target",
            expected=X.shape[:1] + X.shape[2:],
            given=T.shape,
        )
    if T.dtype.kind not in "iu":
        raise ShapeError(f"{op}: labels must be integers, got {T.dtype}", name="target")
    if W is not None and W.shape != (X.shape[1],):
        raise ShapeError(
            f"{op}: weights must have shape ({X.shape[1]},)",
            name="weight",
            expected=(X.shape[1],),
            given=W.shape,
        )


def _loss_type(X: TensorType, T: TensorType, reduction: str) -> TensorType:
    return TensorType(T.shape if reduction == "none" else (), X.dtype)


def _loss_tile(ctx: TileContext) -> TileSpec:
    X = ctx.inputs[0]
    reduction = ctx.attrs.get("reduction", "mean")
    if reduction == "none":
        # per-element loss: batch and spatial axes split, the class axis stays whole
        lab = letters(X.rank - 1)
        x = lab[:1] + "." + lab[1:]
        loss = lab
    else:
        # a mean/sum over everything needs the whole tensor (cross-tile reduction: later)
        x, lab, loss = "." * X.rank, "." * (X.rank - 1), ""
    # inputs: scores, labels (not differentiable), weights (whole)
    ins = [x, lab] + [None if w is None else "." for w in ctx.inputs[2:]]
    outs = (loss, x)[: len(ctx.outputs)]
    return TileSpec(inputs=tuple(ins), outputs=outs)


def _nll(logp: np.ndarray, target, weight, reduction: str, ignore_index) -> np.ndarray:
    """Weighted negative log-likelihood of ``target`` under log-probabilities ``logp``."""
    target = np.asarray(target)
    ignored = np.zeros(target.shape, dtype=bool) if ignore_index is None else target == ignore_index
    # ignored labels may lie outside [0, C): gather class 0 for them, then zero them
    safe = np.where(ignored, 0, target).astype(np.intp)
    picked = np.take_along_axis(logp, safe[:, None], axis=1)[:, 0]
    if weight is None:
        w = (~ignored).astype(logp.dtype)
    else:
        w = np.where(ignored, 0, np.take(weight, safe)).astype(logp.dtype)
    loss = -picked * w
    if reduction == "none":
        return loss.astype(logp.dtype, copy=False)
    total = loss.sum()
    if reduction == "sum":
        return np.asarray(total, dtype=logp.dtype)
    # mean: divided by the total weight of the non-ignored elements
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(total / w.sum(), dtype=logp.dtype)


# -------------------------------------------------------------- NegativeLogLikelihoodLoss


def _nll_shape(inputs, consts, *, ignore_index=None, reduction="mean"):
    _check("NegativeLogLikelihoodLoss", inputs, reduction)
    return [_loss_type(inputs[0], inputs[1], reduction)]


@register("NegativeLogLikelihoodLoss", shape=_nll_shape, tile=_loss_tile)
def NegativeLogLikelihoodLoss(input, target, weight=None, *, ignore_index=None, reduction="mean"):
    """``loss[n, d] = -input[n, target[n, d], d] * weight[target[n, d]]``, reduced."""
    return _nll(input, target, weight, reduction, ignore_index)


# --------------------------------------------------------------- SoftmaxCrossEntropyLoss


def _sce_shape(inputs, consts, *, ignore_index=None, reduction="mean"):
    _check("SoftmaxCrossEntropyLoss", inputs, reduction)
    X = inputs[0]
    return [_loss_type(X, inputs[1], reduction), X]


def sce_params(scores, labels, weights=None, *, ignore_index=None, reduction="mean") -> dict:
    """The SoftmaxCrossEntropyLoss kernels' parameters: ``ignore_index`` (None: none) and
    ``reduction``.

    Example:
        >>> sce_params(None, None)
        {'ignore_index': None, 'reduction': 'mean'}
    """
    return {"ignore_index": ignore_index, "reduction": reduction}


@register("SoftmaxCrossEntropyLoss", shape=_sce_shape, tile=_loss_tile, params=sce_params)
def SoftmaxCrossEntropyLoss(scores, labels, weights=None, *, ignore_index=None, reduction="mean"):
    """NLL of ``labels`` under ``LogSoftmax(scores, axis=1)``; returns (loss, log_prob)."""
    d = scores - scores.max(axis=1, keepdims=True)
    log_prob = (d - np.log(np.exp(d).sum(axis=1, keepdims=True))).astype(scores.dtype, copy=False)
    return _nll(log_prob, labels, weights, reduction, ignore_index), log_prob


# ============================================================= backward ops (dfdl domain)


def loss_coefficients(dloss, target, weight, reduction: str, ignore_index):
    """Per-element float64 factor of the loss gradient, and labels safe to index with.

    ``d loss / d logp[n, target[n, d], d] = -coef[n, d]``: the loss gradient times the
    element's class weight (0 where ignored), divided by the total weight for "mean".
    """
    target = np.asarray(target)
    ignored = np.zeros(target.shape, dtype=bool) if ignore_index is None else target == ignore_index
    safe = np.where(ignored, 0, target).astype(np.intp)
    w = np.ones(target.shape) if weight is None else np.take(np.asarray(weight, np.float64), safe)
    w[ignored] = 0.0
    coef = np.asarray(dloss, dtype=np.float64) * w
    if reduction == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            coef = coef / w.sum()
    return np.broadcast_to(coef, target.shape), safe


def _grad_shape(op: str, inputs, reduction: str) -> TensorType:
    dloss, X, T = inputs[0], inputs[1], inputs[2]
    _check(op, inputs[1:], reduction)
    want = _loss_type(X, T, reduction)
    if dloss is None or dloss.shape != want.shape:
        raise ShapeError(
            f"{op}: dloss must have the loss's shape {want.shape}",
            name="dloss",
            expected=want.shape,
            given=None if dloss is None else dloss.shape,
        )
    return X


def _loss_grad_tile(ctx: TileContext, weight_out: bool = False) -> TileSpec:
    X = ctx.inputs[1]
    reduction = ctx.attrs.get("reduction", "mean")
    if reduction == "mean":
        # the total weight couples every element: one task (as the forward)
        x, lab, dl = "." * X.rank, "." * (X.rank - 1), ""
    else:
        lab = letters(X.rank - 1)
        x = lab[:1] + "." + lab[1:]
        dl = lab if reduction == "none" else ""
    ins = [dl, x, lab] + [None if w is None else "." for w in ctx.inputs[3:]]
    if not weight_out:
        return TileSpec(inputs=tuple(ins), outputs=(x,))
    # the class-weight gradient sums over every element: partial sums, tree-added
    return TileSpec(inputs=tuple(ins), outputs=(".",), reduce={c: "sum" for c in lab if c != "."})


def _nll_grad_shape(inputs, consts, *, ignore_index=None, reduction="mean"):
    return [_grad_shape("dfdl.NegativeLogLikelihoodLossGrad", inputs, reduction)]


@register(
    "NegativeLogLikelihoodLossGrad",
    domain=DFDL_DOMAIN,
    shape=_nll_grad_shape,
    tile=_loss_grad_tile,
    differentiable=False,
)
def NegativeLogLikelihoodLossGrad(
    dloss, input, target, weight=None, *, ignore_index=None, reduction="mean"
):
    """Gradient of NegativeLogLikelihoodLoss for ``input``: ``-coef`` at each label."""
    coef, safe = loss_coefficients(dloss, target, weight, reduction, ignore_index)
    dx = np.zeros(input.shape)
    np.put_along_axis(dx, safe[:, None], -coef[:, None], axis=1)
    return dx.astype(input.dtype)


def _sce_grad_shape(inputs, consts, *, ignore_index=None, reduction="mean"):
    return [_grad_shape("dfdl.SoftmaxCrossEntropyLossGrad", inputs, reduction)]


def sce_grad_params(
    dloss, scores, labels, weights=None, *, ignore_index=None, reduction="mean"
) -> dict:
    """The SoftmaxCrossEntropyLossGrad kernels' parameters, from
    :func:`loss_coefficients`: ``coef``, each element's float64 gradient factor, and
    ``safe_labels``, the labels with ignored ones replaced by 0 (both of the labels'
    shape).

    Example:
        >>> p = sce_grad_params(np.float32(1), None, np.array([0, 2]), ignore_index=2)
        >>> p["coef"], p["safe_labels"]
        (array([1., 0.]), array([0, 0]))
    """
    coef, safe = loss_coefficients(dloss, labels, weights, reduction, ignore_index)
    return {"coef": coef, "safe_labels": safe}


@register(
    "SoftmaxCrossEntropyLossGrad",
    domain=DFDL_DOMAIN,
    shape=_sce_grad_shape,
    tile=_loss_grad_tile,
    differentiable=False,
    params=sce_grad_params,
)
def SoftmaxCrossEntropyLossGrad(
    dloss, scores, labels, weights=None, *, ignore_index=None, reduction="mean"
):
    """Gradient of SoftmaxCrossEntropyLoss's loss for ``scores``.

    ``dscores[n, :, d] = coef[n, d] * (softmax(scores)[n, :, d] - onehot(labels[n, d]))``.
    """
    coef, safe = loss_coefficients(dloss, labels, weights, reduction, ignore_index)
    x = np.asarray(scores, dtype=np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    dx = e / e.sum(axis=1, keepdims=True) * coef[:, None]
    at = np.take_along_axis(dx, safe[:, None], axis=1)
    np.put_along_axis(dx, safe[:, None], at - coef[:, None], axis=1)
    return dx.astype(scores.dtype)


def _weight_grad_shape(inputs, consts, *, ignore_index=None, reduction="mean"):
    _grad_shape("dfdl.NegativeLogLikelihoodLossWeightGrad", inputs, reduction)
    if len(inputs) < 4 or inputs[3] is None:
        raise ShapeError("dfdl.NegativeLogLikelihoodLossWeightGrad: weight is required")
    return [inputs[3]]


@register(
    "NegativeLogLikelihoodLossWeightGrad",
    domain=DFDL_DOMAIN,
    shape=_weight_grad_shape,
    tile=lambda ctx: _loss_grad_tile(ctx, weight_out=True),
    differentiable=False,
)
def NegativeLogLikelihoodLossWeightGrad(
    dloss, input, target, weight, *, ignore_index=None, reduction="mean"
):
    """Gradient of NegativeLogLikelihoodLoss for its class weights ``(C,)``.

    Element ``e`` with label ``c`` adds ``-input[e, c] * dloss`` to ``dweight[c]``; for
    "mean" the loss is ``sum(w * l) / sum(w)``, so it adds ``(l_e - loss) * dloss / W``.
    """
    target = np.asarray(target)
    ignored = np.zeros(target.shape, dtype=bool) if ignore_index is None else target == ignore_index
    safe = np.where(ignored, 0, target).astype(np.intp)
    nll = -np.take_along_axis(np.asarray(input, np.float64), safe[:, None], axis=1)[:, 0]
    g = np.asarray(dloss, dtype=np.float64)
    if reduction == "mean":
        w = np.where(ignored, 0.0, np.take(np.asarray(weight, np.float64), safe))
        total = w.sum()
        with np.errstate(invalid="ignore", divide="ignore"):
            h = g * (nll - (w * nll).sum() / total) / total
    else:
        h = g * nll
    h = np.where(ignored, 0.0, np.broadcast_to(h, target.shape))
    dw = np.bincount(safe.reshape(-1), weights=h.reshape(-1), minlength=weight.shape[0])
    return dw[: weight.shape[0]].astype(weight.dtype)


# ============================================================================ VJP rules


def _loss_attrs(node) -> dict:
    return {k: node.attrs[k] for k in ("ignore_index", "reduction") if k in node.attrs}


def _weight_input(node) -> str | None:
    return node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None


@defvjp("NegativeLogLikelihoodLoss")
def _nll_vjp(b, node, dys):
    x, target = node.inputs[:2]
    w = _weight_input(node)
    ins = [dys[0], x, target, w]
    attrs = _loss_attrs(node)
    dx = b.op("NegativeLogLikelihoodLossGrad", ins, attrs, domain=DFDL_DOMAIN)
    dw = None
    if w is not None:
        dw = b.op("NegativeLogLikelihoodLossWeightGrad", ins, attrs, domain=DFDL_DOMAIN)
    return [dx, None, dw][: len(node.inputs)]


@defvjp("SoftmaxCrossEntropyLoss")
def _sce_vjp(b, node, dys):
    scores, labels = node.inputs[:2]
    w = _weight_input(node)
    attrs = _loss_attrs(node)
    dloss = dys[0]
    dlogp = dys[1] if len(dys) > 1 else None
    parts = []
    if dloss is not None:
        parts.append(
            b.op(
                "SoftmaxCrossEntropyLossGrad",
                [dloss, scores, labels, w],
                attrs,
                domain=DFDL_DOMAIN,
            )
        )
    if dlogp is not None:  # the log_prob output is LogSoftmax(scores, axis=1)
        parts.append(
            b.op("LogSoftmaxGrad", [dlogp, node.outputs[1]], {"axis": 1}, domain=DFDL_DOMAIN)
        )
    dw = None
    if w is not None and dloss is not None:
        logp = node.outputs[1] if len(node.outputs) > 1 and node.outputs[1] else None
        if logp is None:
            logp = b.op("LogSoftmax", [scores], {"axis": 1})
        dw = b.op(
            "NegativeLogLikelihoodLossWeightGrad",
            [dloss, logp, labels, w],
            attrs,
            domain=DFDL_DOMAIN,
        )
    return [b.add_all(parts), None, dw][: len(node.inputs)]
