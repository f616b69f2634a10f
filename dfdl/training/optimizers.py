"""Optimizers that emit their update step as IR nodes (phase ``"update"``).

Each optimizer reproduces its ``torch.optim`` namesake (torch 2.13, single-tensor CPU
path) to float rounding. The update of one parameter is one fused, elementwise
``dfdl``-domain node (:mod:`dfdl.ops.optim`), so it tiles like the parameter and reads
param, grad and state once per tile.

Per-step values (the learning rate from the schedule, Adam's bias corrections) are
computed on the host in float64, exactly as torch computes them in Python, and fed as
0-d inputs; the update op casts them to the parameter's dtype, as torch does.

How a trainer uses an optimizer:

1. for every parameter, ``state_names(p)`` / ``init_state(value)`` give its state
   tensors (they live on the cluster between steps, like the weights);
2. declare a 0-d float input for the learning rate and one per key of
   ``step_scalars(1, lr)`` (the keys never change);
3. emit the update with ``emit`` (or ``emit_step`` for all parameters, with gradient
   clipping when ``clip_norm`` is set);
4. before update ``t`` (1-based), feed ``step_feeds(t, lr_name, step_inputs)``.

Example:
    >>> opt = SGD(lr=0.1, momentum=0.9)
    >>> opt.state_names("w")
    ['w.momentum_buffer']
    >>> opt.step_scalars(1, 0.1)
    {'first': 1.0}
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping
from contextlib import contextmanager

import numpy as np

from dfdl.errors import ConfigError, ShapeError
from dfdl.ir.graph import Node
from dfdl.training.schedules import Schedule, constant

#: added to the total norm before dividing, as torch.nn.utils.clip_grad_norm_ does
CLIP_EPS = 1e-6


@contextmanager
def scope(b, owner: str, phase: str):
    """Emit nodes through ``b`` named after ``owner`` and tagged with ``phase``.

    ``b`` is a :class:`dfdl.training.autodiff.GradBuilder` (or anything with its
    ``op``/``const``/``type`` methods and ``node``/``phase`` attributes); its previous
    owner and phase are restored afterwards.

    Example:
        >>> with scope(b, "loss", "loss"):  # doctest: +SKIP
        ...     s = b.op("ReduceSum", [x], {"keepdims": 0})
    """
    old_node, old_phase = b.node, b.phase
    b.node, b.phase = Node(owner, "", [], []), phase
    try:
        yield b
    finally:
        b.node, b.phase = old_node, old_phase


def _number(name: str, value, low: float = 0.0, high: float | None = None, *, open_high=False):
    """``value`` as a float in [low, high] (or [low, high) with ``open_high``)."""
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a number, not {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, not {value!r}") from None
    bad = not math.isfinite(v) or v < low
    if high is not None:
        bad = bad or (v >= high if open_high else v > high)
    if bad:
        hi = "inf)" if high is None else f"{high}{')' if open_high else ']'}"
        raise ConfigError(f"invalid {name}={value!r}: must be a finite number in [{low}, {hi}")
    return v


class Optimizer(abc.ABC):
    """Base class: learning rate, schedule and gradient clipping.

    Args:
        lr: base learning rate (>= 0).
        schedule: ``schedule(step, base_lr) -> lr`` from :mod:`dfdl.training.schedules`;
            None means constant.
        clip_norm: clip the gradients' global 2-norm to this value before the update
            (``torch.nn.utils.clip_grad_norm_``); None for no clipping.
    """

    #: suffixes of the per-parameter state tensors
    state_suffixes: tuple[str, ...] = ()

    def __init__(self, lr: float, *, schedule: Schedule | None = None, clip_norm=None):
        self.lr = _number("lr", lr)
        if schedule is not None and not callable(schedule):
            raise ConfigError(
                f"schedule must be a callable (step, base_lr) -> lr, not {schedule!r}"
            )
        self.schedule = schedule or constant()
        self.clip_norm = None if clip_norm is None else _number("clip_norm", clip_norm)
        if self.clip_norm == 0.0:
            raise ConfigError("invalid clip_norm=0: must be > 0 (or None for no clipping)")

    # ------------------------------------------------------------------ host side

    def lr_at(self, step: int) -> float:
        """The learning rate of update ``step`` (1-based), from the schedule.

        Example:
            >>> SGD(lr=0.5).lr_at(1)
            0.5
        """
        _check_step(step)
        lr = float(self.schedule(step - 1, self.lr))
        if not math.isfinite(lr) or lr < 0:
            raise ConfigError(f"the schedule gave learning rate {lr} at step {step}")
        return lr

    def state_names(self, param: str) -> list[str]:
        """Names of ``param``'s state tensors, e.g. ``["w.exp_avg", "w.exp_avg_sq"]``."""
        return [f"{param}.{s}" for s in self.state_suffixes]

    def init_state(self, param_value: np.ndarray) -> list[np.ndarray]:
        """Initial state tensors (zeros shaped and typed like the parameter)."""
        value = np.asarray(param_value)
        return [np.zeros(value.shape, value.dtype) for _ in self.state_suffixes]

    def step_scalars(self, step: int, lr: float) -> dict[str, float]:
        """Per-step scalars of update ``step`` (1-based) at learning rate ``lr``."""
        _check_step(step)
        return {}

    def step_feeds(
        self, step: int, lr_name: str, step_inputs: Mapping[str, str], dtype=np.float32
    ) -> dict[str, np.ndarray]:
        """The 0-d feeds of update ``step``: the scheduled lr and :meth:`step_scalars`.

        Args:
            step: 1-based update number.
            lr_name: the graph input holding the learning rate.
            step_inputs: graph input name per key of :meth:`step_scalars`.
            dtype: dtype of the feeds (the parameters' dtype is the most exact).

        Example:
            >>> SGD(lr=0.1, momentum=0.9).step_feeds(2, "lr", {"first": "sgd.first"})
            {'lr': array(0.1, dtype=float32), 'sgd.first': array(0., dtype=float32)}
        """
        lr = self.lr_at(step)
        feeds = {lr_name: np.asarray(lr, dtype)}
        for key, value in self.step_scalars(step, lr).items():
            feeds[step_inputs[key]] = np.asarray(value, dtype)
        return feeds

    # ----------------------------------------------------------------- graph side

    @abc.abstractmethod
    def emit(
        self, b, param: str, grad: str, state: list[str], lr: str, step_inputs: Mapping[str, str]
    ) -> tuple[str, list[str]]:
        """Append the update of one parameter; returns (new param, new state names)."""

    def emit_step(
        self,
        b,
        grads: Mapping[str, str],
        states: Mapping[str, list[str]],
        lr: str,
        step_inputs: Mapping[str, str],
    ) -> tuple[dict[str, str], dict[str, list[str]]]:
        """Clip (when ``clip_norm`` is set) and update every parameter of ``grads``.

        Args:
            b: the builder (a GradBuilder on the bound training graph).
            grads: gradient value name per parameter name.
            states: state value names per parameter name (``state_names`` order).
            lr: the learning-rate input; ``step_inputs`` the per-step scalar inputs.

        Returns:
            ``({param: new param}, {param: new state names})``.

        Example:
            >>> new_params, new_states = opt.emit_step(b, grads, states, "lr", {})  # doctest: +SKIP
        """
        if self.clip_norm is not None:
            grads = emit_clip(b, grads, self.clip_norm)
        new_params, new_states = {}, {}
        for param, grad in grads.items():
            new_params[param], new_states[param] = self.emit(
                b, param, grad, list(states.get(param, [])), lr, step_inputs
            )
        return new_params, new_states

    def _check_emit(self, b, param: str, grad: str, state: list[str]) -> None:
        if len(state) != len(self.state_suffixes):
            raise ConfigError(
                f"{type(self).__name__} needs {len(self.state_suffixes)} state tensors for "
                f"{param!r} ({self.state_names(param)}), got {len(state)}"
            )
        pt, gt = b.type(param), b.type(grad)
        if pt.shape != gt.shape or pt.dtype.kind != "f":
            raise ShapeError(
                f"parameter {param!r} {list(pt.shape)} {pt.dtype} and its gradient "
                f"{list(gt.shape)} {gt.dtype} do not match",
                name=param,
                expected=pt.shape,
                given=gt.shape,
            )

    @staticmethod
    def _as_param_dtype(b, name: str, dtype: np.dtype) -> str:
        """``name`` cast to ``dtype`` where it differs (a float64 gradient of a float32 param)."""
        if b.type(name).dtype == dtype:
            return name
        from onnx import helper

        return b.op("Cast", [name], {"to": int(helper.np_dtype_to_tensor_dtype(dtype))})

    def _scalar_inputs(self, step_inputs: Mapping[str, str]) -> dict[str, str]:
        keys = list(self.step_scalars(1, self.lr))
        missing = [k for k in keys if k not in step_inputs]
        if missing:
            raise ConfigError(
                f"{type(self).__name__}.emit needs step inputs {keys}; missing {missing}"
            )
        return {k: step_inputs[k] for k in keys}


def _check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 1:
        raise ConfigError(f"optimizer step must be an integer >= 1 (1-based), not {step!r}")


class SGD(Optimizer):
    """``torch.optim.SGD``: momentum, dampening, Nesterov momentum and L2 weight decay.

    Per update (``g`` the gradient, ``b`` the momentum buffer)::

        g = g + weight_decay * p
        b = g                                  at the first update
        b = momentum * b + (1 - dampening) * g afterwards
        g = g + momentum * b if nesterov else b
        p = p - lr * g

    Args:
        lr: learning rate (>= 0).
        momentum: momentum factor (>= 0).
        dampening: dampening of the momentum (>= 0; must be 0 with nesterov).
        weight_decay: L2 penalty added to the gradient (>= 0).
        nesterov: Nesterov momentum (needs momentum > 0 and dampening == 0).
        schedule: learning-rate schedule (see :class:`Optimizer`).
        clip_norm: global gradient-norm clipping (see :class:`Optimizer`).

    Example:
        >>> SGD(lr=0.1, momentum=0.9, nesterov=True).state_names("fc.weight")
        ['fc.weight.momentum_buffer']
    """

    def __init__(
        self,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        schedule: Schedule | None = None,
        clip_norm: float | None = None,
    ):
        super().__init__(lr, schedule=schedule, clip_norm=clip_norm)
        self.momentum = _number("momentum", momentum)
        self.dampening = _number("dampening", dampening)
        self.weight_decay = _number("weight_decay", weight_decay)
        if not isinstance(nesterov, bool | np.bool_ | int):
            raise ConfigError(f"nesterov must be a bool, not {nesterov!r}")
        self.nesterov = bool(nesterov)
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ConfigError(
                "nesterov=True requires momentum > 0 and dampening == 0 "
                f"(got momentum={momentum!r}, dampening={dampening!r})"
            )
        self.state_suffixes = ("momentum_buffer",) if self.momentum != 0 else ()

    def step_scalars(self, step: int, lr: float) -> dict[str, float]:
        """``{"first": 1.0}`` at the first update, 0.0 after (only with momentum).

        Example:
            >>> SGD(lr=0.1, momentum=0.9).step_scalars(3, 0.1)
            {'first': 0.0}
        """
        _check_step(step)
        return {"first": 1.0 if step == 1 else 0.0} if self.momentum != 0 else {}

    def emit(
        self, b, param: str, grad: str, state: list[str], lr: str, step_inputs: Mapping[str, str]
    ) -> tuple[str, list[str]]:
        """Append one ``dfdl.SGDUpdate`` node; returns (new param, [new buffer] or []).

        Example:
            >>> new_w, (new_buf,) = opt.emit(b, "w", "dw", ["w.momentum_buffer"], "lr",
            ...                              {"first": "first"})  # doctest: +SKIP
        """
        self._check_emit(b, param, grad, state)
        scalars = self._scalar_inputs(step_inputs)
        attrs = {
            "momentum": self.momentum,
            "dampening": self.dampening,
            "nesterov": int(self.nesterov),
            "weight_decay": self.weight_decay,
        }
        with scope(b, f"{param}.sgd", "update"):
            grad = self._as_param_dtype(b, grad, b.type(param).dtype)
            if self.momentum == 0:
                new = b.op("SGDUpdate", [param, grad, lr], attrs, domain="dfdl")
                return new, []
            new, buf = b.op(
                "SGDUpdate",
                [param, grad, lr, state[0], scalars["first"]],
                attrs,
                domain="dfdl",
                n_outputs=2,
            )
        return new, [buf]


class Adam(Optimizer):
    """``torch.optim.Adam`` (``amsgrad=False``), weight decay as an L2 gradient term.

    Per update ``t`` (torch's single-tensor order, in the parameter's dtype)::

        g = g + weight_decay * p
        m = lerp(m, g, 1 - beta1)
        v = v * beta2 + (1 - beta2) * g * g
        denom = sqrt(v) / sqrt(1 - beta2**t) + eps
        p = p - (lr / (1 - beta1**t)) * m / denom

    Args:
        lr: learning rate (>= 0).
        betas: (beta1, beta2), each in [0, 1).
        eps: added to the denominator (>= 0).
        weight_decay: L2 penalty (>= 0).
        schedule: learning-rate schedule (see :class:`Optimizer`).
        clip_norm: global gradient-norm clipping (see :class:`Optimizer`).

    Example:
        >>> Adam(lr=1e-3).state_names("w")
        ['w.exp_avg', 'w.exp_avg_sq']
    """

    state_suffixes = ("exp_avg", "exp_avg_sq")
    #: AdamW sets this: weight decay multiplies the parameter instead of joining the grad
    decoupled = False

    def __init__(
        self,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        schedule: Schedule | None = None,
        clip_norm: float | None = None,
    ):
        super().__init__(lr, schedule=schedule, clip_norm=clip_norm)
        try:
            beta1, beta2 = betas
        except (TypeError, ValueError):
            raise ConfigError(f"betas must be a pair (beta1, beta2), not {betas!r}") from None
        self.beta1 = _number("betas[0]", beta1, 0.0, 1.0, open_high=True)
        self.beta2 = _number("betas[1]", beta2, 0.0, 1.0, open_high=True)
        self.eps = _number("eps", eps)
        self.weight_decay = _number("weight_decay", weight_decay)
        if amsgrad:
            raise ConfigError("amsgrad=True is not supported by dfdl (use amsgrad=False)")

    def step_scalars(self, step: int, lr: float) -> dict[str, float]:
        """Host-side bias corrections of update ``step``, computed as torch does.

        ``step_size = lr / (1 - beta1**step)``, ``bias_correction2_sqrt =
        (1 - beta2**step) ** 0.5`` and, for AdamW, ``decay = 1 - lr * weight_decay``.

        Example:
            >>> Adam(lr=0.1, betas=(0.5, 0.75)).step_scalars(1, 0.1)
            {'step_size': 0.2, 'bias_correction2_sqrt': 0.5}
        """
        _check_step(step)
        out = {
            "step_size": lr / (1 - self.beta1**step),
            "bias_correction2_sqrt": (1 - self.beta2**step) ** 0.5,
        }
        if self.decoupled:
            out["decay"] = 1 - lr * self.weight_decay
        return out

    def emit(
        self, b, param: str, grad: str, state: list[str], lr: str, step_inputs: Mapping[str, str]
    ) -> tuple[str, list[str]]:
        """Append one ``dfdl.AdamUpdate`` node; returns (new param, [new m, new v]).

        ``lr`` is not read: the learning rate reaches the node through the step inputs
        ``step_size`` (and ``decay`` for AdamW), which torch computes in float64.

        Example:
            >>> new_w, (m, v) = opt.emit(b, "w", "dw", ["w.exp_avg", "w.exp_avg_sq"],
            ...                          "lr", step_inputs)  # doctest: +SKIP
        """
        self._check_emit(b, param, grad, state)
        s = self._scalar_inputs(step_inputs)
        attrs = {
            "beta1": self.beta1,
            "beta2": self.beta2,
            "eps": self.eps,
            "weight_decay": 0.0 if self.decoupled else self.weight_decay,
        }
        inputs = [param, None, state[0], state[1], s["step_size"], s["bias_correction2_sqrt"]]
        if self.decoupled:
            inputs.append(s["decay"])
        with scope(b, f"{param}.{type(self).__name__.lower()}", "update"):
            inputs[1] = self._as_param_dtype(b, grad, b.type(param).dtype)
            new, m, v = b.op("AdamUpdate", inputs, attrs, domain="dfdl", n_outputs=3)
        return new, [m, v]


class AdamW(Adam):
    """``torch.optim.AdamW``: Adam with decoupled weight decay.

    The parameter is first multiplied by ``1 - lr * weight_decay``; the gradient gets
    no L2 term. Otherwise as :class:`Adam` (same arguments; ``weight_decay`` defaults
    to 0.01 as in torch).

    Example:
        >>> sorted(AdamW(lr=1e-3).step_scalars(1, 1e-3))
        ['bias_correction2_sqrt', 'decay', 'step_size']
    """

    decoupled = True

    def __init__(
        self,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        schedule: Schedule | None = None,
        clip_norm: float | None = None,
    ):
        super().__init__(
            lr, betas, eps, weight_decay, amsgrad, schedule=schedule, clip_norm=clip_norm
        )


def emit_clip(b, grads: Mapping[str, str], max_norm: float) -> dict[str, str]:
    """Scale gradients so their global 2-norm is at most ``max_norm``.

    Same arithmetic as ``torch.nn.utils.clip_grad_norm_`` (float32 on CPU): the norm of
    the per-tensor norms, then ``coef = min(max_norm * (1 / (total_norm + 1e-6)), 1)``
    (torch's ``max_norm / t`` on a tensor is ``t.reciprocal() * max_norm``), and every
    gradient multiplied by ``coef`` (also when ``coef`` is 1). The per-tensor sums of
    squares are tree reductions over the gradient's tiles; nodes get phase ``"update"``.

    Args:
        b: the builder (a GradBuilder on the bound training graph).
        grads: gradient value name per parameter name.
        max_norm: the largest allowed total norm (> 0).

    Returns:
        The clipped gradient's value name per parameter name (same keys and order).

    Example:
        >>> clipped = emit_clip(b, {"w": "dw", "b": "db"}, 1.0)  # doctest: +SKIP
    """
    max_norm = _number("max_norm", max_norm)
    if max_norm == 0.0:
        raise ConfigError("invalid max_norm=0: must be > 0")
    if not grads:
        return {}
    dtype = b.type(next(iter(grads.values()))).dtype
    with scope(b, "clip_grad_norm", "update"):
        squares = []
        for g in grads.values():
            g = Optimizer._as_param_dtype(b, g, dtype)
            sq = b.op("ReduceSum", [b.op("Mul", [g, g])], {"keepdims": 0})
            norm = b.op("Sqrt", [sq])
            squares.append(b.op("Mul", [norm, norm]))
        total = b.op("Sqrt", [b.add_all(squares)])
        inv = b.op("Reciprocal", [b.op("Add", [total, b.const(CLIP_EPS, dtype, "eps")])])
        coef = b.op("Mul", [inv, b.const(max_norm, dtype, "max_norm")])
        coef = b.op("Clip", [coef, None, b.const(1.0, dtype, "one")])
        out = {}
        for param, g in grads.items():
            gd = b.type(g).dtype
            c = coef if gd == dtype else Optimizer._as_param_dtype(b, coef, gd)
            out[param] = b.op("Mul", [g, c])
    return out
