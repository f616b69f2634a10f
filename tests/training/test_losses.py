"""dfdl.training.losses: each loss built on a tiny bound graph, run on the cluster at two tilings,
against torch.nn.functional and an independent numpy formula; and its gradient through
dfdl's autodiff against torch.autograd (once the VJP rules of its ops exist)."""

from __future__ import annotations

import numpy as np
import pytest

from dfdl.errors import ConfigError, DfdlError, ShapeError, UnsupportedOpError
from dfdl.ir.graph import Graph
from dfdl.ops.registry import TensorType
from dfdl.plan.tiling import make_plan
from dfdl.runtime.executor import execute
from dfdl.training.autodiff import GradBuilder, gradients
from dfdl.training.losses import DICE_SMOOTH, LOSSES, build_loss, validate_loss

RNG = np.random.default_rng(1234)


def _graph(feeds: dict[str, np.ndarray]) -> Graph:
    g = Graph(name="loss_test", inputs=list(feeds))
    for k, v in feeds.items():
        g.types[k] = TensorType(v.shape, v.dtype)
    return g


def _labels(shape, n_classes, ignore=None, frac=0.3, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, size=shape).astype(np.int64)
    if ignore is not None:
        y[rng.random(shape) < frac] = ignore
    return y


# ----------------------------------------------------------- independent numpy formulas


def _np_log_softmax(x):
    x = x.astype(np.float64)
    d = x - x.max(axis=1, keepdims=True)
    return d - np.log(np.exp(d).sum(axis=1, keepdims=True))


def _token_rows(x, y):
    """A language model's logits (N, T, V) and labels (N, T) as rows: (N*T, V), (N*T,)."""
    if x.ndim >= 3 and y.shape == x.shape[:-1] != x.shape[:1] + x.shape[2:]:
        return x.reshape(-1, x.shape[-1]), y.reshape(-1)
    return x, y


def np_cross_entropy(x, y, weight=None, ignore_index=None):
    x, y = _token_rows(x, y)
    logp = np.moveaxis(_np_log_softmax(x), 1, -1).reshape(-1, x.shape[1])
    y = y.reshape(-1)
    keep = np.ones(y.shape, bool) if ignore_index is None else y != ignore_index
    w = np.ones(x.shape[1]) if weight is None else np.asarray(weight, np.float64)
    rows = np.nonzero(keep)[0]
    wy = w[y[rows]]
    return float(-(wy * logp[rows, y[rows]]).sum() / wy.sum())


def np_mse(x, y):
    return float(np.mean((x.astype(np.float64) - y.astype(np.float64)) ** 2))


def np_bce_with_logits(x, y, weight=None):
    x, y = x.astype(np.float64), y.astype(np.float64)
    # -[y log s(x) + (1 - y) log(1 - s(x))] with log s(x) = -log1p(exp(-x)) (stable form)
    log_s = -np.logaddexp(0, -x)
    log_1ms = -np.logaddexp(0, x)
    loss = -(y * log_s + (1 - y) * log_1ms)
    if weight is not None:
        loss = loss * weight
    return float(loss.mean())


def np_dice(x, y, weight=None, ignore_index=None, smooth=DICE_SMOOTH):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    n_classes = x.shape[1]
    keep = np.ones(y.shape) if ignore_index is None else (y != ignore_index).astype(float)
    scores = []
    for c in range(n_classes):
        pc = p[:, c] * keep
        tc = (y == c) * keep
        scores.append((2 * (pc * tc).sum() + smooth) / (pc.sum() + tc.sum() + smooth))
    w = np.ones(n_classes) if weight is None else np.asarray(weight, np.float64)
    return float(1 - (w * np.array(scores)).sum() / w.sum())


# ------------------------------------------------------------------------ torch oracles


def torch_loss(name, x, y, weight=None, ignore_index=None):
    """The loss in torch (float64 copies of the inputs); also returns d loss / d x."""
    torch = pytest.importorskip("torch", reason="torch is the reference for loss values")
    F = torch.nn.functional
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    if name == "cross_entropy":
        w = None if weight is None else torch.tensor(weight, dtype=torch.float64)
        ig = -100 if ignore_index is None else ignore_index
        rows, labels = _token_rows(x, y)  # what a torch user writes for a language model
        xr = xt.reshape(rows.shape)
        loss = F.cross_entropy(xr, torch.tensor(labels), weight=w, ignore_index=ig)
    elif name == "mse":
        loss = F.mse_loss(xt, torch.tensor(y, dtype=torch.float64))
    elif name == "bce_with_logits":
        w = None if weight is None else torch.tensor(weight, dtype=torch.float64)
        loss = F.binary_cross_entropy_with_logits(
            xt, torch.tensor(y, dtype=torch.float64), weight=w
        )
    else:  # dice: the documented formula written with torch ops
        p = torch.softmax(xt, dim=1)
        yt = torch.tensor(y)
        keep = torch.ones(yt.shape, dtype=torch.float64)
        if ignore_index is not None:
            keep = (yt != ignore_index).to(torch.float64)
        onehot = torch.stack([(yt == c).to(torch.float64) for c in range(x.shape[1])], 1)
        keep = keep.unsqueeze(1)
        p, t = p * keep, onehot * keep
        dims = [0] + list(range(2, x.ndim))
        score = (2 * (p * t).sum(dims) + DICE_SMOOTH) / (p.sum(dims) + t.sum(dims) + DICE_SMOOTH)
        w = torch.ones(x.shape[1], dtype=torch.float64)
        if weight is not None:
            w = torch.tensor(weight, dtype=torch.float64)
        loss = 1 - (w * score).sum() / w.sum()
    loss.backward()
    return float(loss.detach()), xt.grad.numpy()


# --------------------------------------------------------------------------------- cases

NUMPY = {
    "cross_entropy": np_cross_entropy,
    "mse": lambda x, y, **_: np_mse(x, y),
    "bce_with_logits": lambda x, y, weight=None, **_: np_bce_with_logits(x, y, weight),
    "dice": np_dice,
}


def _cases():
    f32 = np.float32
    cls_w = np.array([0.2, 1.0, 2.5, 0.7, 1.3])
    return [
        ("cross_entropy", "2d", RNG.normal(size=(7, 5)).astype(f32), _labels(7, 5), {}),
        (
            "cross_entropy",
            "weight",
            RNG.normal(size=(7, 5)).astype(f32),
            _labels(7, 5, seed=1),
            {"weight": cls_w},
        ),
        (
            "cross_entropy",
            "ignore_-100",
            RNG.normal(size=(9, 5)).astype(f32),
            _labels(9, 5, ignore=-100, seed=2),
            {"ignore_index": -100},
        ),
        (
            "cross_entropy",
            "ignore_class_2_weight",
            RNG.normal(size=(9, 5)).astype(f32),
            _labels(9, 5, seed=3),
            {"ignore_index": 2, "weight": cls_w},
        ),
        (
            "cross_entropy",
            "spatial_weight_ignore_f64",
            RNG.normal(size=(3, 5, 4, 3)),
            _labels((3, 4, 3), 5, ignore=255, seed=4),
            {"ignore_index": 255, "weight": cls_w},
        ),
        (
            "cross_entropy",
            "tokens_classes_last",
            RNG.normal(size=(3, 6, 11)).astype(f32),
            _labels((3, 6), 11, seed=8),
            {},
        ),
        (
            "cross_entropy",
            "tokens_classes_last_ignore",
            RNG.normal(size=(2, 5, 7)).astype(f32),
            _labels((2, 5), 7, ignore=-100, seed=9),
            {"ignore_index": -100},
        ),
        (
            "mse",
            "2d",
            RNG.normal(size=(7, 3)).astype(f32),
            RNG.normal(size=(7, 3)).astype(f32),
            {},
        ),
        (
            "mse",
            "3d_f64_target",
            RNG.normal(size=(4, 5, 6)).astype(f32),
            RNG.normal(size=(4, 5, 6)),
            {},
        ),
        (
            "bce_with_logits",
            "soft_labels",
            (RNG.normal(size=(7, 3)) * 3).astype(f32),
            RNG.random((7, 3)).astype(f32),
            {},
        ),
        (
            "bce_with_logits",
            "large_logits_weight",
            np.array([[-120.0, -30.0, 0.0], [0.0, 25.0, 90.0], [1.5, -2.0, 7.0]], f32),
            np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0]], f32),
            {"weight": np.array([0.5, 1.0, 2.0])},
        ),
        ("dice", "2d", RNG.normal(size=(5, 3, 4, 6)).astype(f32), _labels((5, 4, 6), 3), {}),
        (
            "dice",
            "1d_weight",
            RNG.normal(size=(3, 4, 7)).astype(f32),
            _labels((3, 7), 4, seed=5),
            {"weight": np.array([0.1, 1.0, 2.0, 1.0])},
        ),
        (
            "dice",
            "ignore_255",
            RNG.normal(size=(4, 3, 5, 3)).astype(f32),
            _labels((4, 5, 3), 3, ignore=255, seed=6),
            {"ignore_index": 255},
        ),
        (
            "dice",
            "absent_class",
            RNG.normal(size=(3, 4, 5)).astype(f32),
            _labels((3, 5), 3, seed=7),  # class 3 never appears in the labels
            {},
        ),
    ]


CASES = _cases()
IDS = [f"{c[0]}-{c[1]}" for c in CASES]


def _build(name, x, y, opts):
    g = _graph({"x": x, "y": y})
    b = GradBuilder(g)
    loss = build_loss(b, name, ["x"], "y", **opts)
    return g, b, loss


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("tiles", [None, "uneven"])
def test_loss_value(case, tiles, client):
    name, _, x, y, opts = case
    g, b, loss = _build(name, x, y, opts)
    assert g.types[loss] == TensorType((), x.dtype)
    assert all(n.phase == "loss" for n in g.nodes)
    assert b.phase == "bwd" and b.node is None  # the builder is left as it was
    g.outputs = [loss]
    got = execute(make_plan(g, tiles, cores=2), {"x": x, "y": y}, client)[loss]
    assert got.shape == () and got.dtype == x.dtype
    want = NUMPY[name](x, y, **opts)
    rtol = 1e-5 if x.dtype == np.float32 else 1e-12
    assert float(got) == pytest.approx(want, rel=rtol, abs=rtol)
    ref, _ = torch_loss(name, x, y, **opts)
    assert float(got) == pytest.approx(ref, rel=rtol, abs=rtol)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_loss_gradient_matches_torch(case, client):
    name, _, x, y, opts = case
    g, b, loss = _build(name, x, y, opts)
    try:
        grads = gradients(g, loss, ["x"])
    except UnsupportedOpError as e:  # VJP rules are added op by op
        pytest.skip(f"an op of this loss has no VJP rule yet: {e}")
    g.outputs = [grads["x"]]
    g.prune()
    got = execute(make_plan(g, "uneven", cores=2), {"x": x, "y": y}, client)[grads["x"]]
    _, want = torch_loss(name, x, y, **opts)
    tol = 1e-5 if x.dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def test_bce_gradient_at_zero_is_sigmoid_minus_target(client):
    x = np.zeros((2, 3), np.float32)
    y = np.array([[0, 1, 0.5], [1, 0, 0.25]], np.float32)
    g, _, loss = _build("bce_with_logits", x, y, {})
    try:
        grads = gradients(g, loss, ["x"])
    except UnsupportedOpError as e:
        pytest.skip(f"an op of this loss has no VJP rule yet: {e}")
    g.outputs = [grads["x"]]
    got = execute(make_plan(g, None), {"x": x, "y": y}, client)[grads["x"]]
    np.testing.assert_allclose(got, (0.5 - y) / y.size, rtol=1e-6)


# ------------------------------------------------------------------------------- errors


def test_loss_names():
    assert sorted(LOSSES) == ["bce_with_logits", "cross_entropy", "dice", "mse"]
    assert validate_loss("dice") == "dice"
    with pytest.raises(ConfigError, match="unknown loss 'hinge'"):
        validate_loss("hinge")
    assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, DfdlError)


@pytest.mark.parametrize(
    "name, x, y, opts, error, match",
    [
        ("nope", (4, 3), (4,), {}, ConfigError, "unknown loss"),
        ("cross_entropy", (4, 3), (5,), {}, ShapeError, "do not match"),
        ("cross_entropy", (4, 3), (4,), {"weight": np.ones(4)}, ConfigError, "3 finite"),
        ("dice", (4, 3, 2), (4, 2), {"weight": -np.ones(3)}, ConfigError, "non-negative"),
        ("mse", (4, 3), (4, 3), {"weight": np.ones(3)}, ConfigError, "takes no weight"),
        ("mse", (4, 3), (4, 2), {}, ShapeError, "target"),
        ("bce_with_logits", (4, 3), (4, 3), {"ignore_index": 1}, ConfigError, "ignore_index"),
        ("bce_with_logits", (4, 3), (4, 3), {"weight": np.ones(2)}, ConfigError, "broadcast"),
        ("cross_entropy", (4, 3), (4,), {"ignore_index": 1.5}, ConfigError, "integer"),
    ],
)
def test_bad_loss_setup(name, x, y, opts, error, match):
    labels = np.zeros(y, np.int64) if name in ("cross_entropy", "dice") else np.zeros(y, "f4")
    g = _graph({"x": np.zeros(x, np.float32), "y": labels})
    with pytest.raises(error, match=match):
        build_loss(GradBuilder(g), name, ["x"], "y", **opts)


def test_float_labels_rejected():
    g = _graph({"x": np.zeros((4, 3), np.float32), "y": np.zeros(4, np.float32)})
    with pytest.raises(ShapeError, match="integer class indices"):
        build_loss(GradBuilder(g), "cross_entropy", ["x"], "y")


def test_builder_state_restored_after_error():
    g = _graph({"x": np.zeros((4, 3), np.float32), "y": np.zeros(5, np.int64)})
    b = GradBuilder(g, phase="bwd")
    with pytest.raises(ShapeError):
        build_loss(b, "cross_entropy", ["x"], "y")
    assert b.phase == "bwd" and b.node is None
