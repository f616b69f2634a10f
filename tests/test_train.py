"""``dfdl.train``: determinism, checkpoints and resume, saving, history, validation,
data order, tiling invariance, the exported training graph and NaN detection.

Most cases train the same small MLP for a handful of steps on the session's 2-worker
cluster (``client`` fixture); the determinism case starts its own 1- and 3-worker ones.
"""

from __future__ import annotations

import math
import os

import numpy as np
import onnx
import pytest

import dfdl
import dfdl.models
from dfdl.errors import TrainingError
from dfdl.runtime import checkpoint

SIZES = (6, 16, 3)
BATCH = 8
N = 24  # 3 steps per epoch


def data(n: int = N, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, SIZES[0])).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0.5)  # learnable labels 0..2
    return X, y


@pytest.fixture(scope="module")
def mlp():
    return dfdl.models.mlp(SIZES, seed=3)


def fit(model, train_data, client, **kwargs) -> dfdl.TrainResult:
    kwargs.setdefault("optimizer", dfdl.optim.SGD(lr=0.1, momentum=0.9))
    kwargs.setdefault("batch_size", BATCH)
    return dfdl.train(model, train_data, client=client, progress=False, **kwargs)


def assert_same_params(a: dfdl.TrainResult, b: dfdl.TrainResult) -> None:
    assert set(a.params) == set(b.params)
    for k in a.params:
        assert a.params[k].dtype == b.params[k].dtype, k
        assert np.array_equal(a.params[k], b.params[k]), f"{k} differs"


# ---- determinism across cluster sizes ------------------------------------------------------


def _cluster(n_workers: int, attempts: int = 3):
    """A LocalCluster of ``n_workers`` processes; retried when a nanny fails to start."""
    from distributed import LocalCluster

    for attempt in range(attempts):
        try:
            return LocalCluster(
                n_workers=n_workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
            )
        except Exception:  # a slow machine can time out starting a worker
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _train_on(n_workers: int, model, train_data) -> dfdl.TrainResult:
    from distributed import Client

    with _cluster(n_workers) as cluster, Client(cluster) as c:
        c.wait_for_workers(n_workers, timeout=120)
        return fit(
            model,
            train_data,
            c,
            optimizer=dfdl.optim.AdamW(lr=0.01),
            steps=4,
            tiles={"batch": 2},
            seed=5,
        )


def test_bit_identical_on_one_and_three_workers(mlp):
    """Same plan (explicit tiles), different worker counts: the very same weights."""
    train_data = data()
    one = _train_on(1, mlp, train_data)
    three = _train_on(3, mlp, train_data)
    assert_same_params(one, three)
    assert one.history["loss"] == three.history["loss"]


def test_bit_identical_on_one_and_six_workers():
    """Six workers read each BatchNorm's merged moments: four merge them, the other two
    take a copy from one of those (partition.BROADCAST_FAN_OUT); the same weights."""
    model = dfdl.models.resnet(
        in_channels=2, image_size=8, stem=4, stages=(4,), blocks_per_stage=1, num_classes=3
    )
    rng = np.random.default_rng(0)
    train_data = (rng.standard_normal((16, 2, 8, 8), dtype=np.float32), rng.integers(0, 3, 16))
    from distributed import Client

    runs = []
    for n in (1, 6):
        with _cluster(n) as cluster, Client(cluster) as c:
            c.wait_for_workers(n, timeout=120)
            runs.append(
                fit(model, train_data, c, optimizer=dfdl.optim.SGD(lr=0.1), steps=2,
                    batch_size=8, tiles={"batch": 8, "model": 1, "split_norms": 1})
            )  # fmt: skip
    one, six = runs
    assert_same_params(one, six)
    assert one.history["loss"] == six.history["loss"]


# ---- checkpoints and resume ------------------------------------------------------------------

RESUME_STEPS, RESUME_AT, EVERY = 7, 4, 2


def _resume_kwargs() -> dict:
    # AdamW: the resumed run must continue the bias-correction step count
    return {"optimizer": dfdl.optim.AdamW(lr=0.01), "shuffle": True, "seed": 11, "epochs": 3}


@pytest.fixture(scope="module")
def uninterrupted(client, mlp):
    return fit(mlp, data(), client, steps=RESUME_STEPS, **_resume_kwargs())


@pytest.fixture(scope="module")
def interrupted(client, mlp, tmp_path_factory):
    """A checkpoint directory left by a run stopped after ``RESUME_AT`` steps."""
    ckpt = tmp_path_factory.mktemp("ckpt")
    first = fit(
        mlp,
        data(),
        client,
        steps=RESUME_AT,
        checkpoint_dir=ckpt,
        checkpoint_every=EVERY,
        **_resume_kwargs(),
    )
    assert len(first.history["loss"]) == RESUME_AT
    return ckpt, first


def _resumed(client, mlp, ckpt) -> dfdl.TrainResult:
    return fit(
        mlp,
        data(),
        client,
        steps=RESUME_STEPS,
        checkpoint_dir=ckpt,
        resume=True,
        **_resume_kwargs(),
    )


def test_resume_equals_uninterrupted_run(client, mlp, uninterrupted, interrupted, tmp_path):
    ckpt, first = interrupted
    assert first.history["loss"] == uninterrupted.history["loss"][:RESUME_AT]
    step, arrays, _meta = checkpoint.load_latest(ckpt)
    assert step == RESUME_AT
    assert set(first.params) <= set(arrays)
    for k, v in first.params.items():
        assert np.array_equal(arrays[k], v)
    work = tmp_path / "ckpt"
    work.mkdir()
    for f in ckpt.iterdir():
        (work / f.name).write_bytes(f.read_bytes())
    resumed = _resumed(client, mlp, work)
    assert_same_params(resumed, uninterrupted)
    tail = RESUME_STEPS - RESUME_AT
    assert resumed.history["loss"][-tail:] == uninterrupted.history["loss"][-tail:]


def test_stray_and_truncated_files_never_become_latest(
    client, mlp, uninterrupted, interrupted, tmp_path
):
    """What a crash mid-write leaves behind (a temp file, a truncated newer checkpoint)
    is ignored: resuming still starts from the last complete checkpoint."""
    ckpt, _ = interrupted
    work = tmp_path / "ckpt"
    work.mkdir()
    for f in ckpt.iterdir():
        (work / f.name).write_bytes(f.read_bytes())
    good = (work / f"step-{RESUME_AT:09d}.npz").read_bytes()
    newer = f"step-{RESUME_AT + EVERY:09d}.npz"
    (work / newer).write_bytes(good[: len(good) // 2])  # truncated, newer step number
    (work / f".{newer}.k3j9x2").write_bytes(good[:100])  # temp file of an unfinished write
    (work / ".latest.q8w1zz").write_bytes(newer.encode())  # unfinished pointer update
    step, _, _ = checkpoint.load_latest(work)
    assert step == RESUME_AT
    resumed = _resumed(client, mlp, work)
    assert_same_params(resumed, uninterrupted)
    # a checkpoint written now replaces the pointer atomically and leaves no temp file
    before = {p.name for p in work.iterdir()}
    checkpoint.save(work, 99, {"w": np.ones(2, np.float32)}, {})
    assert checkpoint.load_latest(work)[0] == 99
    assert {p.name for p in work.iterdir()} - before == {f"step-{99:09d}.npz"}


def test_resume_auto_without_checkpoint_starts_fresh(client, mlp, uninterrupted, tmp_path):
    """An empty checkpoint directory: resume="auto" trains from the start (resume=True
    is an error there: tests/runtime/test_checkpoint.py)."""
    result = fit(
        mlp,
        data(),
        client,
        steps=RESUME_STEPS,
        checkpoint_dir=tmp_path / "empty",
        resume="auto",
        **_resume_kwargs(),
    )
    assert_same_params(result, uninterrupted)


# ---- history ---------------------------------------------------------------------------------


def test_history_has_one_finite_float_per_step(uninterrupted):
    losses = uninterrupted.history["loss"]
    assert len(losses) == RESUME_STEPS
    assert all(type(v) is float and math.isfinite(v) for v in losses)


def test_validation_metrics_per_epoch(client, mlp):
    X, y = data()
    Xv, yv = data(10, seed=1)
    result = fit(mlp, (X, y), client, epochs=2, validation=(Xv, yv), shuffle=False)
    h = result.history
    assert len(h["loss"]) == 2 * N // BATCH
    assert len(h["val_loss"]) == 2 and len(h["val_accuracy"]) == 2
    assert all(type(v) is float and math.isfinite(v) for v in h["val_loss"])
    assert all(0.0 <= v <= 1.0 for v in h["val_accuracy"])
    # the last epoch's metrics are those of the returned model
    logits = dfdl.run(result.model, {"x": Xv}, client=client)["logits"].astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    assert h["val_loss"][-1] == pytest.approx(-logp[np.arange(len(yv)), yv].mean(), rel=1e-5)
    assert h["val_accuracy"][-1] == pytest.approx((logits.argmax(axis=1) == yv).mean())


# ---- saving ---------------------------------------------------------------------------------


def test_saved_model_runs_in_onnxruntime(client, tmp_path):
    """The saved model (BatchNorm statistics included) predicts as dfdl.run does."""
    ort = pytest.importorskip("onnxruntime")
    model = dfdl.models.resnet(
        in_channels=1, image_size=8, stem=4, stages=(4, 8), blocks_per_stage=1, num_classes=3
    )
    rng = np.random.default_rng(0)
    X = rng.standard_normal((8, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, size=8, dtype=np.int64)
    result = fit(model, (X, y), client, batch_size=4, steps=2)
    path = tmp_path / "trained.onnx"
    result.save(path)
    saved = onnx.load(str(path))
    onnx.checker.check_model(saved)
    stats = {t.name: onnx.numpy_helper.to_array(t) for t in saved.graph.initializer}
    assert np.array_equal(stats["stem.bn.running_mean"], result.params["stem.bn.running_mean"])
    assert not np.array_equal(stats["stem.bn.running_mean"], 0)  # statistics were updated
    got = ort.InferenceSession(str(path)).run(None, {"x": X})[0]
    want = dfdl.run(result.model, {"x": X}, client=client)["logits"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---- data order ----------------------------------------------------------------------------


def test_shuffle_false_keeps_the_order(client, mlp):
    """Without shuffling the seed does not matter; with it, different seeds differ."""
    train_data = data()
    a = fit(mlp, train_data, client, shuffle=False, seed=0, steps=3)
    b = fit(mlp, train_data, client, shuffle=False, seed=1, steps=3)
    assert a.history["loss"] == b.history["loss"]
    c = fit(mlp, train_data, client, shuffle=True, seed=0, steps=3)
    d = fit(mlp, train_data, client, shuffle=True, seed=1, steps=3)
    assert c.history["loss"] != d.history["loss"]
    # unshuffled batches are the samples in order: the first loss is that of X[:BATCH]
    X, y = train_data
    first = fit(mlp, (X[:BATCH], y[:BATCH]), client, steps=1)
    assert first.history["loss"][0] == a.history["loss"][0]


def test_uneven_tiles_give_the_same_losses(client, mlp):
    train_data = data()
    whole = fit(mlp, train_data, client, shuffle=False, steps=3, tiles={"batch": 1})
    uneven = fit(mlp, train_data, client, shuffle=False, steps=3, tiles="uneven")
    np.testing.assert_allclose(uneven.history["loss"], whole.history["loss"], rtol=1e-5)
    for k in whole.params:
        np.testing.assert_allclose(uneven.params[k], whole.params[k], rtol=1e-4, atol=1e-6)


# ---- the training graph as ONNX ------------------------------------------------------------


def test_training_graph_is_valid_onnx_with_dfdl_ops(mlp):
    m = dfdl.training_graph(mlp, "cross_entropy", dfdl.optim.SGD(lr=0.1, momentum=0.9))
    assert isinstance(m, onnx.ModelProto)
    onnx.checker.check_model(m)
    assert "dfdl" in {o.domain for o in m.opset_import}
    dfdl_ops = {n.op_type for n in m.graph.node if n.domain == "dfdl"}
    assert "SGDUpdate" in dfdl_ops
    assert dfdl_ops - {"SGDUpdate"}, f"no dfdl-domain backward op among {dfdl_ops}"
    names = {i.name for i in m.graph.input}
    assert {"layers.0.weight", "layers.0.weight.momentum_buffer"} <= names
    outputs = [o.name for o in m.graph.output]
    assert len(outputs) == 1 + 2 * 2 * (len(SIZES) - 1)  # loss, new params and buffers


# ---- NaN -------------------------------------------------------------------------------------


def test_nan_loss_names_the_step(client, mlp):
    X, y = data()
    X[2 * BATCH + 3, 1] = np.nan  # a sample of the third batch (step 2)
    with pytest.raises(TrainingError, match="step 2"):
        fit(mlp, (X, y), client, shuffle=False, epochs=1)


def test_checkpoint_save_is_atomic_under_failure(tmp_path, monkeypatch):
    """A failure while writing leaves the previous checkpoint as the latest, no temp file."""
    checkpoint.save(tmp_path, 2, {"w": np.zeros(3, np.float32)}, {})

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", broken)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(tmp_path, 4, {"w": np.ones(3, np.float32)}, {})
    assert sorted(os.listdir(tmp_path)) == ["latest", f"step-{2:09d}.npz"]
    step, arrays, _ = checkpoint.load_latest(tmp_path)
    assert step == 2 and np.array_equal(arrays["w"], np.zeros(3, np.float32))


def test_bit_identical_from_run_to_run_with_model_tiles(client):
    """Batch and model tiles over 2 workers: where each task runs must not change a bit."""
    model = dfdl.models.mlp((64, 256, 256, 10))
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((64, 64), dtype=np.float32), rng.integers(0, 10, 64)
    runs = [
        dfdl.train(
            model,
            data=(x, y),
            optimizer=dfdl.optim.SGD(lr=0.01, momentum=0.9),
            batch_size=32,
            steps=2,
            shuffle=False,
            client=client,
            tiles={"batch": 2, "model": 8},
            progress=False,
        )
        for _ in range(3)
    ]
    for other in runs[1:]:
        assert_same_params(runs[0], other)
