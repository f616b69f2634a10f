"""Loss ops: SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss.

Inputs are scores ``(N, C, d1, ...)``, integer labels ``(N, d1, ...)`` and optional class
weights ``(C,)``. The labels input is not differentiable (a VJP returns None for it).
"""

from __future__ import annotations

import numpy as np

from dfdl.errors import ShapeError, UnsupportedOpError
from dfdl.ops.common import letters
from dfdl.ops.registry import TensorType, TileContext, TileSpec, register

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


@register("SoftmaxCrossEntropyLoss", shape=_sce_shape, tile=_loss_tile)
def SoftmaxCrossEntropyLoss(scores, labels, weights=None, *, ignore_index=None, reduction="mean"):
    """NLL of ``labels`` under ``LogSoftmax(scores, axis=1)``; returns (loss, log_prob)."""
    d = scores - scores.max(axis=1, keepdims=True)
    log_prob = (d - np.log(np.exp(d).sum(axis=1, keepdims=True))).astype(scores.dtype, copy=False)
    return _nll(log_prob, labels, weights, reduction, ignore_index), log_prob
