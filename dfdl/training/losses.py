"""Training losses, emitted as IR nodes (phase ``"loss"``) after a model's forward pass.

:func:`build_loss` appends the nodes computing a scalar loss from the model's output and
the labels. Every loss is a mean built from a tiled per-element term and tree-reduced
sums (``ReduceSum`` over all axes, then a division), so no loss node needs the whole
batch in one task. The values follow torch:

* ``"cross_entropy"``: ``F.cross_entropy(logits, labels, weight, ignore_index)``
  (reduction mean: ``sum(w[y] * nll) / sum(w[y])`` over non-ignored elements), logits
  ``(N, C)`` or ``(N, C, d1, ...)``, integer labels ``(N,)`` / ``(N, d1, ...)``; or a
  language model's logits ``(N, T, ..., V)`` with labels ``(N, T, ...)`` (classes on the
  last axis, as Hugging Face models output them): the mean over every token, as
  ``F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1))``.
* ``"mse"``: ``F.mse_loss(output, target)``, the mean of ``(output - target) ** 2``.
* ``"bce_with_logits"``: ``F.binary_cross_entropy_with_logits(x, y, weight)``, the mean
  of ``weight * (max(x, 0) - x * y + log(1 + exp(-|x|)))``.
* ``"dice"``: soft Dice loss for segmentation, see :func:`dice`.

Example:
    >>> from dfdl.training.autodiff import GradBuilder
    >>> b = GradBuilder(graph)                                      # doctest: +SKIP
    >>> loss = build_loss(b, "cross_entropy", graph.outputs, "labels")  # doctest: +SKIP
    >>> graph.types[loss].shape                                     # doctest: +SKIP
    ()
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import helper

from dfdl.errors import ConfigError, ShapeError
from dfdl.ops.registry import TensorType
from dfdl.training.optimizers import scope

#: smoothing term of the Dice loss (numerator and denominator), as MONAI's default
DICE_SMOOTH = 1e-5


def _cast(b, name: str, dtype: np.dtype) -> str:
    """``name`` converted to ``dtype`` (a no-op when it already has it)."""
    if b.type(name).dtype == np.dtype(dtype):
        return name
    return b.op("Cast", [name], {"to": int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))})


def _mean_all(b, x: str, count: int | None = None) -> str:
    """Mean of every element: a tiled tree sum, then one division by the count."""
    t = b.type(x)
    total = b.op("ReduceSum", [x], {"keepdims": 0})
    n = int(np.prod(t.shape, dtype=np.int64)) if count is None else count
    return b.op("Div", [total, b.const(n, t.dtype, "count")])


def classes_last(logits: TensorType, labels: TensorType) -> bool:
    """Whether integer ``labels`` index the last axis of ``logits`` (a language model's
    ``(N, T, V)`` with labels ``(N, T)``) rather than axis 1 (torch's ``(N, C, d1)``)."""
    torch_layout = logits.shape[:1] + logits.shape[2:]
    return logits.rank >= 3 and labels.shape == logits.shape[:-1] != torch_layout


def label_classes(logits: TensorType, labels: TensorType) -> int:
    """How many classes integer ``labels`` index: ``logits``' axis 1, or its last axis for
    a language model's ``(N, T, V)`` with labels ``(N, T)`` (:func:`classes_last`).

    Example:
        >>> label_classes(TensorType((2, 5, 9), "float32"), TensorType((2, 5), "int64"))
        9
    """
    if classes_last(logits, labels):
        return logits.shape[-1]
    return logits.shape[1] if logits.rank > 1 else logits.shape[0]


def _check_labels(logits: TensorType, labels: TensorType, loss: str) -> None:
    if logits.rank < 2 or logits.dtype.kind != "f":
        raise ShapeError(
            f"{loss}: the model output must be float scores (N, C, d1, ...), got "
            f"{list(logits.shape)} {logits.dtype}",
            name="output",
        )
    if labels.dtype.kind not in "iu":
        raise ShapeError(
            f"{loss}: labels must be integer class indices, got {labels.dtype}; "
            "convert the targets to int64",
            name="target",
        )
    want = logits.shape[:1] + logits.shape[2:]
    if labels.shape != want and not classes_last(logits, labels):
        also = f" (classes on axis 1) or {list(logits.shape[:-1])}" if logits.rank >= 3 else ""
        raise ShapeError(
            f"{loss}: labels of shape {list(labels.shape)} do not match the model output "
            f"{list(logits.shape)}; expected {list(want)}{also}",
            name="target",
            expected=want,
            given=labels.shape,
        )


def _class_weight(weight, n_classes: int, dtype: np.dtype, loss: str) -> np.ndarray | None:
    if weight is None:
        return None
    w = np.asarray(weight, dtype=np.float64)
    if w.shape != (n_classes,) or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ConfigError(
            f"{loss}: weight must hold {n_classes} finite non-negative class weights, "
            f"got shape {list(w.shape)}"
        )
    return w.astype(dtype)


def _float_target(b, x: str, target: str, loss: str) -> str:
    xt, tt = b.type(x), b.type(target)
    if xt.dtype.kind != "f" or tt.dtype.kind not in "fiub" or tt.shape != xt.shape:
        raise ShapeError(
            f"{loss}: target {list(tt.shape)} {tt.dtype} must be numbers of the model "
            f"output's shape {list(xt.shape)} (output dtype {xt.dtype})",
            name="target",
            expected=xt.shape,
            given=tt.shape,
        )
    return _cast(b, target, xt.dtype)


def _no_option(loss: str, weight, ignore_index) -> None:
    if weight is not None:
        raise ConfigError(f"loss {loss!r} takes no weight")
    if ignore_index is not None:
        raise ConfigError(f"loss {loss!r} takes no ignore_index")


# ------------------------------------------------------------------------------ losses


def cross_entropy(b, x: str, target: str, *, weight=None, ignore_index=None) -> str:
    """``torch.nn.functional.cross_entropy`` (reduction mean) of scores ``x``.

    Per element, ``SoftmaxCrossEntropyLoss(reduction="none")`` gives
    ``-w[y] * log_softmax(x)[y]`` (0 where ``y == ignore_index``), tiled over batch
    and spatial axes; the loss is its sum divided by the sum of ``w[y]`` over
    non-ignored elements (their count without weights). All labels ignored gives NaN,
    as in torch.

    Example:
        >>> loss = cross_entropy(b, "logits", "labels", ignore_index=-100)  # doctest: +SKIP
    """
    xt, yt = b.type(x), b.type(target)
    _check_labels(xt, yt, "cross_entropy")
    if classes_last(xt, yt):
        # (N, T, ..., V) -> (N * T * ..., V): every token a row, its label a class index
        x = b.op("Reshape", [x, b.const(np.asarray([-1, xt.shape[-1]], np.int64), hint="rows")])
        target = b.op("Reshape", [target, b.const(np.asarray([-1], np.int64), hint="flat")])
        xt, yt = b.type(x), b.type(target)
    w = _class_weight(weight, xt.shape[1], xt.dtype, "cross_entropy")
    attrs = {"reduction": "none"}
    if ignore_index is not None:
        attrs["ignore_index"] = int(ignore_index)
    ins = [x, target] + ([b.const(w, hint="class_weight")] if w is not None else [])
    per = b.op("SoftmaxCrossEntropyLoss", ins, attrs)
    if w is None and ignore_index is None:
        return _mean_all(b, per)
    total = b.op("ReduceSum", [per], {"keepdims": 0})
    # the mean's denominator: the weight of each element's label, 0 where ignored
    zero = b.const(0, xt.dtype, "zero")
    if ignore_index is not None:
        ignored = b.op("Equal", [target, b.const(ignore_index, yt.dtype, "ignore_index")])
    if w is None:
        per_w = b.op("Where", [ignored, zero, b.const(1, xt.dtype, "one")])
    elif ignore_index is None:
        per_w = b.op("Gather", [b.const(w, hint="class_weight"), target], {"axis": 0})
    else:
        safe = b.op("Where", [ignored, b.const(0, yt.dtype, "class0"), target])
        picked = b.op("Gather", [b.const(w, hint="class_weight"), safe], {"axis": 0})
        per_w = b.op("Where", [ignored, zero, picked])
    return b.op("Div", [total, b.op("ReduceSum", [per_w], {"keepdims": 0})])


def mse(b, x: str, target: str, *, weight=None, ignore_index=None) -> str:
    """``torch.nn.functional.mse_loss``: the mean of ``(x - target) ** 2``.

    Example:
        >>> loss = mse(b, "y_pred", "y")  # doctest: +SKIP
    """
    _no_option("mse", weight, ignore_index)
    d = b.op("Sub", [x, _float_target(b, x, target, "mse")])
    return _mean_all(b, b.op("Mul", [d, d]))


def bce_with_logits(b, x: str, target: str, *, weight=None, ignore_index=None) -> str:
    """``torch.nn.functional.binary_cross_entropy_with_logits`` (reduction mean).

    ``mean(weight * (max(x, 0) - x * y + log(1 + exp(-|x|))))``, stable for any ``x``.
    ``|x|`` is built as ``relu(x) + relu(-x)`` and ``max(x, 0)`` as ``(x + |x|) / 2``
    (both exact in floating point) so that the gradient is ``sigmoid(x) - y`` even at
    ``x == 0``, whatever derivative Relu's rule takes there. ``weight`` (optional)
    broadcasts against ``x``, as torch's ``weight`` argument.

    Example:
        >>> loss = bce_with_logits(b, "logits", "targets")  # doctest: +SKIP
    """
    _no_option("bce_with_logits", None, ignore_index)
    xt = b.type(x)
    y = _float_target(b, x, target, "bce_with_logits")
    absx = b.op("Add", [b.op("Relu", [x]), b.op("Relu", [b.op("Neg", [x])])])
    pos = b.op("Mul", [b.op("Add", [x, absx]), b.const(0.5, xt.dtype, "half")])
    softplus_tail = b.op(
        "Log", [b.op("Add", [b.op("Exp", [b.op("Neg", [absx])]), b.const(1, xt.dtype, "one")])]
    )
    per = b.op("Add", [b.op("Sub", [pos, b.op("Mul", [x, y])]), softplus_tail])
    if weight is not None:
        w = np.asarray(weight, dtype=xt.dtype)
        try:
            np.broadcast_shapes(w.shape, xt.shape)
        except ValueError:
            raise ConfigError(
                f"bce_with_logits: weight of shape {list(w.shape)} does not broadcast to "
                f"the output {list(xt.shape)}"
            ) from None
        per = b.op("Mul", [per, b.const(w, hint="weight")])
    return _mean_all(b, per)


def dice(b, x: str, target: str, *, weight=None, ignore_index=None) -> str:
    """Soft Dice loss of scores ``x`` (N, C, d1, ...) against integer labels (N, d1, ...).

    With ``p = softmax(x, axis=1)`` and ``t`` the one-hot labels (both zeroed at pixels
    whose label is ``ignore_index``), sums run over the batch and spatial axes per
    class ``c``::

        dice_c = (2 * sum(p_c * t_c) + s) / (sum(p_c) + sum(t_c) + s),  s = DICE_SMOOTH
        loss   = 1 - sum_c w_c * dice_c / sum_c w_c                     (w_c = 1 default)

    A class absent from both labels and prediction scores ``dice_c = 1`` (``s / s``).

    Example:
        >>> loss = dice(b, "logits", "mask")  # doctest: +SKIP
    """
    xt, yt = b.type(x), b.type(target)
    _check_labels(xt, yt, "dice")
    n_classes, dt = xt.shape[1], xt.dtype
    w = _class_weight(weight, n_classes, np.float64, "dice")
    w = np.full(n_classes, 1.0) if w is None else w
    if w.sum() <= 0:
        raise ConfigError("dice: the class weights sum to 0")
    p = b.op("Softmax", [x], {"axis": 1})
    y = b.op("Unsqueeze", [target, b.const([1], np.int64, "axes")])  # (N, 1, d...)
    classes = np.arange(n_classes, dtype=yt.dtype).reshape((1, n_classes) + (1,) * (xt.rank - 2))
    t = _cast(b, b.op("Equal", [y, b.const(classes, hint="classes")]), dt)
    if ignore_index is not None:
        ignored = b.op("Equal", [y, b.const(ignore_index, yt.dtype, "ignore_index")])
        keep = _cast(b, b.op("Not", [ignored]), dt)
        p = b.op("Mul", [p, keep])
        t = b.op("Mul", [t, keep])
    axes = b.const([0] + list(range(2, xt.rank)), np.int64, "axes")
    inter = b.op("ReduceSum", [b.op("Mul", [p, t]), axes], {"keepdims": 0})
    sum_p = b.op("ReduceSum", [p, axes], {"keepdims": 0})
    sum_t = b.op("ReduceSum", [t, axes], {"keepdims": 0})
    smooth = b.const(DICE_SMOOTH, dt, "smooth")
    num = b.op("Add", [b.op("Mul", [inter, b.const(2, dt, "two")]), smooth])
    den = b.op("Add", [b.op("Add", [sum_p, sum_t]), smooth])
    score = b.op("Div", [num, den])  # (C,)
    weights = b.const((w / w.sum()).astype(dt), hint="class_weight")
    mean_dice = b.op("ReduceSum", [b.op("Mul", [score, weights])], {"keepdims": 0})
    return b.op("Sub", [b.const(1, dt, "one"), mean_dice])


#: loss name -> builder ``fn(b, output, target, *, weight, ignore_index) -> loss name``
LOSSES: dict[str, Callable[..., str]] = {
    "cross_entropy": cross_entropy,
    "mse": mse,
    "bce_with_logits": bce_with_logits,
    "dice": dice,
}


def validate_loss(name: str) -> str:
    """``name`` if it is a known loss, else :class:`~dfdl.errors.ConfigError`.

    Example:
        >>> validate_loss("mse")
        'mse'
    """
    if not isinstance(name, str) or name not in LOSSES:
        raise ConfigError(f"unknown loss {name!r}; dfdl's losses are {sorted(LOSSES)}")
    return name


def build_loss(
    b,
    name: str,
    outputs: list[str],
    target: str,
    *,
    weight: np.ndarray | None = None,
    ignore_index: int | None = None,
) -> str:
    """Append the nodes of loss ``name`` to ``b.graph``; returns the scalar loss value.

    Args:
        b: a :class:`dfdl.training.autodiff.GradBuilder` on the bound graph; the new nodes
            get phase ``"loss"`` (the builder's phase and owner are restored after).
        name: one of :data:`LOSSES`.
        outputs: the model's outputs; the loss reads ``outputs[0]`` (others are ignored).
        target: the labels/targets value (a graph input, typed in ``b.graph.types``).
        weight: class weights (cross_entropy, dice) or an elementwise weight
            broadcasting to the output (bce_with_logits).
        ignore_index: label excluded from the loss (cross_entropy, dice).

    Returns:
        The name of the 0-d loss value (dtype of the model output).

    Raises:
        ConfigError: unknown loss, or an option the loss does not take.
        ShapeError: output and target shapes or dtypes do not fit the loss.

    Example:
        >>> loss = build_loss(b, "mse", ["y_pred"], "y")  # doctest: +SKIP
    """
    fn = LOSSES[validate_loss(name)]
    if not outputs:
        raise ConfigError("build_loss: the model has no output to compute a loss from")
    if ignore_index is not None and (
        isinstance(ignore_index, bool) or not isinstance(ignore_index, int | np.integer)
    ):
        raise ConfigError(f"ignore_index must be an integer, not {ignore_index!r}")
    with scope(b, "loss", "loss"):
        return fn(b, outputs[0], target, weight=weight, ignore_index=ignore_index)
