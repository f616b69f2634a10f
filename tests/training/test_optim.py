"""dfdl.optim: optimizer updates emitted as IR and run on the cluster, step by step,
against torch.optim (and torch's clip_grad_norm_ and LR schedulers) on the same numbers."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from dfdl.errors import ConfigError, DfdlError
from dfdl.ir.graph import Graph
from dfdl.ops.registry import TensorType
from dfdl.optim import SGD, Adam, AdamW, emit_clip, schedules
from dfdl.plan.tiling import make_plan
from dfdl.runtime.executor import execute
from dfdl.training.autodiff import GradBuilder

STEPS = 5
SHAPES = {"w": (5, 7), "b": (3,)}


def _params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def _grads() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    # the scale varies per step so that clipping is active on some steps only
    return [
        {
            k: (rng.standard_normal(s) * (0.1 + 0.6 * t)).astype(np.float32)
            for k, s in SHAPES.items()
        }
        for t in range(STEPS)
    ]


def assert_close(got, want, what):
    """Within 1e-6 relative to the tensor's magnitude (float32 rounding order differs:
    torch's CPU kernels fuse multiply-adds)."""
    want = np.asarray(want)
    scale = max(float(np.abs(want).max()), 1e-30)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * scale, err_msg=what)


# ---------------------------------------------------------------------------- dfdl side


class StepGraph:
    """The update graph of ``opt`` for SHAPES, built once and run once per step."""

    def __init__(self, opt):
        self.opt = opt
        self.keys = list(opt.step_scalars(1, opt.lr))
        self.step_inputs = {k: f"step.{k}" for k in self.keys}
        params = _params()
        g = Graph(name="update")
        types = {}
        for p, v in params.items():
            types[p] = TensorType(v.shape, v.dtype)
            types[f"grad.{p}"] = TensorType(v.shape, v.dtype)
            for s in opt.state_names(p):
                types[s] = TensorType(v.shape, v.dtype)
        for name in ["lr"] + list(self.step_inputs.values()):
            types[name] = TensorType((), np.float32)
        g.inputs = list(types)
        g.types.update(types)
        b = GradBuilder(g)
        grads = {p: f"grad.{p}" for p in params}
        states = {p: opt.state_names(p) for p in params}
        self.new_params, self.new_states = opt.emit_step(b, grads, states, "lr", self.step_inputs)
        g.outputs = list(self.new_params.values()) + [s for p in params for s in self.new_states[p]]
        assert all(n.phase == "update" for n in g.nodes)
        self.graph = g

    def run(self, client, tiles) -> list[dict[str, np.ndarray]]:
        """Param and state values after each step."""
        params = _params()
        state = {
            s: v
            for p in params
            for s, v in zip(self.opt.state_names(p), self.opt.init_state(params[p]))
        }
        plan = make_plan(self.graph, tiles, cores=2)
        history = []
        for t, grads in enumerate(_grads(), start=1):
            feeds = {**params, **state, **{f"grad.{p}": g for p, g in grads.items()}}
            feeds.update(self.opt.step_feeds(t, "lr", self.step_inputs))
            out = execute(plan, feeds, client, step=t)
            params = {p: out[n] for p, n in self.new_params.items()}
            state = {
                s: out[n]
                for p in params
                for s, n in zip(self.opt.state_names(p), self.new_states[p])
            }
            history.append({**params, **state})
        return history


# --------------------------------------------------------------------------- torch side


def _torch_schedule(torch, opt, spec):
    sched = torch.optim.lr_scheduler
    kind = spec[0]
    if kind == "constant":
        return None
    if kind == "step":
        return sched.StepLR(opt, step_size=spec[1], gamma=spec[2])
    if kind == "cosine":
        return sched.CosineAnnealingLR(opt, T_max=spec[1], eta_min=spec[2])
    if kind == "warmup":
        return sched.LinearLR(opt, start_factor=1 / (spec[1] + 1), total_iters=spec[1])
    if kind == "warmup_cosine":
        return sched.SequentialLR(
            opt,
            [
                sched.LinearLR(opt, start_factor=1 / (spec[1] + 1), total_iters=spec[1]),
                sched.CosineAnnealingLR(opt, T_max=spec[2]),
            ],
            milestones=[spec[1]],
        )
    raise AssertionError(kind)


def _dfdl_schedule(spec):
    kind = spec[0]
    if kind == "constant":
        return schedules.constant()
    if kind == "step":
        return schedules.step(spec[1], spec[2])
    if kind == "cosine":
        return schedules.cosine(spec[1], spec[2])
    if kind == "warmup":
        return schedules.linear_warmup(spec[1])
    return schedules.linear_warmup(spec[1], then=schedules.cosine(spec[2]))


def torch_history(cls_name, kwargs, schedule, clip):
    torch = pytest.importorskip("torch", reason="torch.optim is the reference")
    params = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in _params().items()}
    opt = getattr(torch.optim, cls_name)(list(params.values()), **kwargs)
    sched = _torch_schedule(torch, opt, schedule)
    names = {"SGD": ["momentum_buffer"], "Adam": ["exp_avg", "exp_avg_sq"]}
    names["AdamW"] = names["Adam"]
    history, lrs = [], []
    for grads in _grads():
        for k, p in params.items():
            p.grad = torch.tensor(grads[k])
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        if sched is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sched.step()
        snap = {k: p.detach().numpy().copy() for k, p in params.items()}
        for k, p in params.items():
            for s in names[cls_name]:
                if s in opt.state[p]:
                    snap[f"{k}.{s}"] = opt.state[p][s].numpy().copy()
        history.append(snap)
    return history, lrs


# (id, dfdl class, kwargs shared with torch, schedule spec, clip_norm)
CONFIGS = [
    ("sgd", SGD, {"lr": 0.1}, ("constant",), None),
    ("sgd_momentum", SGD, {"lr": 0.1, "momentum": 0.9}, ("constant",), None),
    (
        "sgd_dampening_wd",
        SGD,
        {"lr": 0.05, "momentum": 0.8, "dampening": 0.3, "weight_decay": 0.01},
        ("constant",),
        None,
    ),
    (
        "sgd_nesterov_wd",
        SGD,
        {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.05},
        ("constant",),
        None,
    ),
    ("sgd_steplr_clip", SGD, {"lr": 0.1, "momentum": 0.9}, ("step", 2, 0.5), 1.0),
    ("sgd_warmup_cosine", SGD, {"lr": 0.2, "momentum": 0.5}, ("warmup_cosine", 2, 3), None),
    ("adam", Adam, {"lr": 0.01}, ("constant",), None),
    (
        "adam_l2",
        Adam,
        {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1},
        ("constant",),
        None,
    ),
    ("adam_small_beta1", Adam, {"lr": 0.01, "betas": (0.3, 0.9)}, ("constant",), None),
    ("adam_warmup_noclip", Adam, {"lr": 0.01}, ("warmup", 3), 100.0),
    ("adamw", AdamW, {"lr": 0.01}, ("constant",), None),
    (
        "adamw_cosine_clip",
        AdamW,
        {"lr": 0.02, "weight_decay": 0.1},
        ("cosine", 5, 0.001),
        0.5,
    ),
]


@pytest.mark.parametrize("config", CONFIGS, ids=[c[0] for c in CONFIGS])
@pytest.mark.parametrize("tiles", [None, "uneven"])
def test_optimizer_matches_torch(config, tiles, client):
    _, cls, kwargs, schedule, clip = config
    opt = cls(**kwargs, schedule=_dfdl_schedule(schedule), clip_norm=clip)
    want, lrs = torch_history(cls.__name__, kwargs, schedule, clip)
    for t, lr in enumerate(lrs, start=1):
        assert opt.lr_at(t) == pytest.approx(lr, rel=1e-12, abs=1e-15)
    got = StepGraph(opt).run(client, tiles)
    for t, (g, w) in enumerate(zip(got, want), start=1):
        assert set(g) == set(w)
        for name in w:
            assert g[name].dtype == np.float32
            assert_close(g[name], w[name], f"{name} after step {t}")


def test_clipping_matches_torch(client):
    torch = pytest.importorskip("torch", reason="torch's clip_grad_norm_ is the reference")
    for max_norm in (0.3, 1e3):  # active, inactive
        grads = _grads()[2]
        g = Graph(name="clip", inputs=list(grads))
        for k, v in grads.items():
            g.types[k] = TensorType(v.shape, v.dtype)
        out = emit_clip(GradBuilder(g), {k: k for k in grads}, max_norm)
        g.outputs = list(out.values())
        got = execute(make_plan(g, "uneven"), grads, client)
        params = [torch.nn.Parameter(torch.zeros(v.shape)) for v in grads.values()]
        for p, v in zip(params, grads.values()):
            p.grad = torch.tensor(v)
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        for k, p in zip(grads, params):
            assert_close(got[out[k]], p.grad.numpy(), f"clipped {k} at max_norm={max_norm}")
    assert emit_clip(GradBuilder(Graph()), {}, 1.0) == {}


# -------------------------------------------------------------------------- schedules


@pytest.mark.parametrize(
    "spec",
    [
        ("constant",),
        ("step", 3, 0.5),
        ("cosine", 7, 0.0),
        ("cosine", 4, 0.01),
        ("warmup", 4),
        ("warmup_cosine", 3, 6),
    ],
    ids=str,
)
def test_schedule_matches_torch(spec):
    torch = pytest.importorskip("torch", reason="torch's LR schedulers are the reference")
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.3)
    sched = _torch_schedule(torch, opt, spec)
    mine = _dfdl_schedule(spec)
    for k in range(20):
        assert mine(k, 0.3) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12, abs=1e-15)
        opt.step()
        if sched is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sched.step()


def test_schedule_closed_forms():
    assert [schedules.step(2, 0.1)(k, 1.0) for k in (0, 1, 2, 4)] == pytest.approx(
        [1, 1, 0.1, 0.01]
    )
    assert schedules.cosine(10, 0.1)(10, 1.0) == pytest.approx(0.1)
    assert schedules.cosine(10)(5, 2.0) == pytest.approx(1.0)
    assert schedules.linear_warmup(4)(0, 1.0) == pytest.approx(0.2)
    assert schedules.linear_warmup(4, start_factor=0.5)(2, 1.0) == pytest.approx(0.75)
    assert schedules.linear_warmup(4)(100, 1.0) == 1.0
    opt = SGD(lr=0.4, schedule=schedules.cosine(4))
    assert [opt.lr_at(t) for t in (1, 3, 5)] == pytest.approx([0.4, 0.2, 0.0])


# ---------------------------------------------------------------------- host scalars


def test_step_scalars():
    assert SGD(lr=0.1).step_scalars(1, 0.1) == {}
    assert SGD(lr=0.1, momentum=0.9).step_scalars(1, 0.1) == {"first": 1.0}
    assert SGD(lr=0.1, momentum=0.9).step_scalars(2, 0.1) == {"first": 0.0}
    s = Adam(lr=0.1).step_scalars(3, 0.05)
    assert s["step_size"] == 0.05 / (1 - 0.9**3)
    assert s["bias_correction2_sqrt"] == (1 - 0.999**3) ** 0.5
    assert "decay" not in s
    assert AdamW(lr=0.1, weight_decay=0.2).step_scalars(1, 0.05)["decay"] == 1 - 0.05 * 0.2
    feeds = Adam(lr=0.1).step_feeds(1, "lr", {"step_size": "a", "bias_correction2_sqrt": "b"})
    assert set(feeds) == {"lr", "a", "b"}
    assert all(v.shape == () and v.dtype == np.float32 for v in feeds.values())


def test_state_names_and_init():
    w = np.ones((2, 3), np.float64)
    assert SGD(lr=0.1).state_names("w") == []
    assert SGD(lr=0.1).init_state(w) == []
    opt = Adam()
    assert opt.state_names("fc.weight") == ["fc.weight.exp_avg", "fc.weight.exp_avg_sq"]
    init = opt.init_state(w)
    assert len(init) == 2
    assert all(s.shape == (2, 3) and s.dtype == np.float64 and not s.any() for s in init)


def test_emit_checks_its_inputs():
    g = Graph(name="u", inputs=["w", "dw", "lr"])
    g.types.update(
        w=TensorType((3,), np.float32),
        dw=TensorType((4,), np.float32),
        lr=TensorType((), np.float32),
    )
    b = GradBuilder(g)
    with pytest.raises(DfdlError, match="do not match"):
        SGD(lr=0.1).emit(b, "w", "dw", [], "lr", {})
    with pytest.raises(ConfigError, match="state tensors"):
        Adam().emit(b, "w", "w", [], "lr", {})
    with pytest.raises(ConfigError, match="missing"):
        SGD(lr=0.1, momentum=0.9).emit(b, "w", "w", ["w"], "lr", {})
    assert b.phase == "bwd" and b.node is None


# ----------------------------------------------------------------- bad hyperparameters


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: SGD(lr=-0.1), "lr"),
        (lambda: SGD(lr=math.nan), "lr"),
        (lambda: SGD(lr="fast"), "lr"),
        (lambda: SGD(momentum=-0.5), "momentum"),
        (lambda: SGD(dampening=-0.1), "dampening"),
        (lambda: SGD(weight_decay=-1e-4), "weight_decay"),
        (lambda: SGD(nesterov=True), "nesterov"),
        (lambda: SGD(momentum=0.9, dampening=0.1, nesterov=True), "nesterov"),
        (lambda: SGD(clip_norm=-1.0), "clip_norm"),
        (lambda: SGD(clip_norm=0), "clip_norm"),
        (lambda: SGD(schedule=0.5), "schedule"),
        (lambda: Adam(lr=-1e-3), "lr"),
        (lambda: Adam(eps=-1e-8), "eps"),
        (lambda: Adam(betas=(1.0, 0.999)), r"betas\[0\]"),
        (lambda: Adam(betas=(0.9, -0.1)), r"betas\[1\]"),
        (lambda: Adam(betas=0.9), "betas"),
        (lambda: Adam(weight_decay=-0.1), "weight_decay"),
        (lambda: Adam(amsgrad=True), "amsgrad"),
        (lambda: AdamW(weight_decay=math.inf), "weight_decay"),
        (lambda: schedules.step(0, 0.1), "step_size"),
        (lambda: schedules.step(2, -0.1), "gamma"),
        (lambda: schedules.cosine(0), "total_steps"),
        (lambda: schedules.cosine(5, min_lr=-1.0), "min_lr"),
        (lambda: schedules.linear_warmup(0), "warmup_steps"),
        (lambda: schedules.linear_warmup(3, start_factor=0.0), "start_factor"),
        (lambda: schedules.linear_warmup(3, start_factor=1.5), "start_factor"),
        (lambda: SGD(lr=0.1).lr_at(0), "step"),
        (lambda: Adam().step_scalars(0, 0.1), "step"),
        (lambda: emit_clip(None, {}, -1.0), "max_norm"),
    ],
)
def test_bad_hyperparameters_raise_config_error(make, match):
    with pytest.raises(ConfigError, match=match) as info:
        make()
    assert isinstance(info.value, ValueError)
