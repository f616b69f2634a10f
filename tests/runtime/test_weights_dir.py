"""Training with ``weights_dir``: the weights never pass through the client.

The workers read their tiles of the model file's external data, make the optimizer
state's tiles, and write anchors and the trained weights into ``.npy`` files; the run
must give the same bits as the same training with the weights on the client, on two
worker processes, and its saved model must run in onnxruntime with the same outputs.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import dask
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from dask.task_spec import Task
from distributed import get_task_stream

import dfdl
import dfdl.models
from dfdl.errors import ClientMemoryWarning, ConfigError, TrainingError
from dfdl.ir.bind import bind
from dfdl.ir.onnx_io import file_tensor_bytes, load_model, to_ir
from dfdl.ops.registry import TensorType
from dfdl.plan.tiling import make_plan
from dfdl.runtime import checkpoint, stored
from dfdl.runtime import session as session_module
from dfdl.runtime.executor import _source_tiles, execute
from dfdl.runtime.session import TrainConfig, TrainingSession, check_client_memory

SIZES = (24, 96, 80, 6)


def _data(n=96):
    rng = np.random.default_rng(3)
    return rng.standard_normal((n, SIZES[0]), dtype=np.float32), rng.integers(0, SIZES[-1], n)


def _train(model, client, **kw):
    return dfdl.train(
        model,
        data=_data(),
        loss="cross_entropy",
        optimizer=dfdl.optim.Adam(lr=1e-2),
        batch_size=16,
        epochs=2,
        client=client,
        tiles={"batch": 2, "model": 2},
        unroll=2,
        progress=False,
        **kw,
    )


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "mlp.onnx"
    onnx.save(dfdl.models.mlp(SIZES), path, save_as_external_data=True, size_threshold=0)
    return path


@pytest.fixture(scope="module")
def reference(client, model_file):
    return _train(model_file, client)


def test_the_same_bits_as_weights_on_the_client(client, model_file, reference, tmp_path):
    with get_task_stream(client) as stream:
        got = _train(model_file, client, weights_dir=tmp_path)
    assert got.history["loss"] == reference.history["loss"]
    assert got.params.keys() == reference.params.keys()
    for k, want in reference.params.items():
        assert isinstance(got.params[k], np.memmap), k
        np.testing.assert_array_equal(got.params[k], want, err_msg=k)
    # the last anchor's folder is the result; earlier ones are gone
    (run,) = tmp_path.iterdir()
    assert got.weights_dir == run
    assert [p.name for p in run.iterdir()] == [f"step-{len(got.history['loss'])}"]
    # each initial tile was made on a worker by a task (read from the file, or zeros);
    # the same run without weights_dir scatters them from the client: no such task
    made = {str(t["key"]) for t in stream.data if "-init-" in str(t["key"])}
    with get_task_stream(client) as plain:
        _train(model_file, client, steps=1)
    assert not [t for t in plain.data if "-init-" in str(t["key"])]
    names = {k.split("-init-")[0].removeprefix("('") for k in made}
    adam = {f"{p}.{s}" for p in reference.params for s in ("exp_avg", "exp_avg_sq")}
    assert names == set(reference.params) | adam


def test_anchors_on_disk_give_the_same_bits(client, model_file, reference, tmp_path):
    config = {"dfdl.recovery.anchor-overhead": 1e9, "dfdl.recovery.first-anchor-s": 0.0}
    with dask.config.set(config):
        got = _train(model_file, client, weights_dir=tmp_path)
    assert got.history["loss"] == reference.history["loss"]
    for k, want in reference.params.items():
        np.testing.assert_array_equal(got.params[k], want, err_msg=k)
    assert [p.name for p in got.weights_dir.iterdir()] == [f"step-{len(got.history['loss'])}"]


def test_the_saved_model_runs_in_onnxruntime(client, model_file, reference, tmp_path):
    got = _train(model_file, client, weights_dir=tmp_path / "w")
    files = got.save(tmp_path / "trained.onnx")
    assert [f.name for f in files] == ["trained.onnx", "trained.onnx.data"]
    x = _data(8)[0]
    out = ort.InferenceSession(str(files[0])).run(None, {"x": x})[0]
    want = ort.InferenceSession(reference.model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(out, want)
    saved = onnx.load(str(files[0]))
    for t in saved.graph.initializer:
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(t), reference.params[t.name])


def test_a_model_given_in_memory_keeps_its_trained_weights_on_disk(client, reference, tmp_path):
    got = _train(dfdl.models.mlp(SIZES), client, weights_dir=tmp_path)
    assert got.history["loss"] == reference.history["loss"]
    for k, want in reference.params.items():
        np.testing.assert_array_equal(got.params[k], want, err_msg=k)


def test_checkpoints_are_folders_the_workers_write_and_resume_reads(
    client, model_file, reference, tmp_path
):
    """Checkpoints every 4 steps, a run of 8 steps, then a run resumed from its last
    checkpoint to the end: the same bits as one run on the client."""
    ckpt = tmp_path / "ckpt"
    first = _train(
        model_file, client, weights_dir=tmp_path / "w", checkpoint_dir=ckpt,
        checkpoint_every=4, steps=8,
    )  # fmt: skip
    assert first.history["loss"] == reference.history["loss"][:8]
    assert (ckpt / "latest").read_text() == "step-000000008"
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "latest", "step-000000004", "step-000000008"
    ]  # fmt: skip
    step, arrays, meta = checkpoint.load(ckpt / "step-000000008")
    assert step == 8 and meta["step"] == 8
    assert all(isinstance(v, np.memmap) for v in arrays.values())
    np.testing.assert_array_equal(arrays["layers.0.weight"], first.params["layers.0.weight"])
    rest = _train(
        model_file, client, weights_dir=tmp_path / "w", checkpoint_dir=ckpt,
        checkpoint_every=4, resume=True,
    )  # fmt: skip
    assert rest.history["loss"] == reference.history["loss"][8:]
    for k, want in reference.params.items():
        np.testing.assert_array_equal(rest.params[k], want, err_msg=k)


def test_frozen_weights_in_the_file_are_read_on_the_workers(client, model_file, tmp_path):
    frozen = ["layers.0.weight", "layers.1.bias"]
    want = _train(model_file, client, frozen=frozen)
    with get_task_stream(client) as stream:
        got = _train(model_file, client, frozen=frozen, weights_dir=tmp_path)
    assert got.history["loss"] == want.history["loss"]
    for k in want.params:
        np.testing.assert_array_equal(got.params[k], want.params[k], err_msg=k)
    made = {str(t["key"]).split("-init-")[0].removeprefix("('") for t in stream.data
            if "-init-" in str(t["key"])}  # fmt: skip
    assert set(frozen) <= made


def test_validation_reads_the_weights_on_the_workers(client, model_file, tmp_path):
    val = _data(40)
    want = _train(model_file, client, validation=val)
    got = _train(model_file, client, validation=val, weights_dir=tmp_path)
    for key in ("loss", "val_loss", "val_accuracy"):
        assert got.history[key] == want.history[key], key
    for k in want.params:
        np.testing.assert_array_equal(got.params[k], want.params[k], err_msg=k)


def test_an_inference_pass_has_the_workers_read_mapped_weights(client, model_file):
    """What the validation pass runs (``executor.execute``) on a model whose weights are
    memory maps: each weight tile is a task that reads the file, and the outputs are
    those of the same weights in memory."""
    mapped = to_ir(load_model(model_file, map_external=True))
    loaded = to_ir(load_model(model_file))
    x = _data(8)[0]
    plans = [
        make_plan(bind(g, {"x": TensorType(x.shape, x.dtype)}), {"batch": 2, "model": 2}, cores=2)
        for g in (mapped, loaded)
    ]
    dsk, sources, _ = _source_tiles(plans[0], {"x": x}, client, 0, "t")
    for name in mapped.initializers:
        for ref in sources[name].values():
            task = dsk[ref.key]
            assert isinstance(task, Task) and task.func is stored.read_tile, name
    got, want = (execute(p, {"x": x}, client) for p in plans)
    np.testing.assert_array_equal(got["logits"], want["logits"])


def test_a_weights_dir_that_cannot_be_written_is_refused(model_file, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError, match=r"weights_dir .*file cannot be written"):
        dfdl.train(model_file, data=_data(), weights_dir=blocker, progress=False)


def test_a_model_file_gone_before_the_run_is_a_training_error_naming_it(client, tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    onnx.save(dfdl.models.mlp(SIZES), folder / "mlp.onnx", save_as_external_data=True,
              location="w.bin", size_threshold=0)  # fmt: skip
    config = TrainConfig(batch_size=16, progress=False, weights_dir=tmp_path / "w")
    session = TrainingSession(folder / "mlp.onnx", _data(), config)
    (folder / "w.bin").unlink()  # as on a worker that does not share the folder
    with pytest.raises(TrainingError, match=r"cannot read .*w.bin .*filesystem every worker"):
        session.run(client)


def test_a_model_too_large_for_the_client_points_to_weights_dir(model_file, monkeypatch):
    need = file_tensor_bytes(model_file)
    assert need == sum(a.nbytes for a in _arrays(model_file).values())
    with pytest.raises(ConfigError, match=r"more than this process's .* weights_dir="):
        check_client_memory(model_file, available=need - 1)
    with pytest.warns(ClientMemoryWarning, match=r"up to 3 copies .* weights_dir="):
        check_client_memory(model_file, available=2 * need)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_client_memory(model_file, available=3 * need + 1)
    # dfdl.train checks before loading the model (and before any cluster starts)
    monkeypatch.setattr(
        session_module.psutil, "virtual_memory", lambda: SimpleNamespace(available=need // 2)
    )
    with pytest.raises(ConfigError, match="weights_dir"):
        dfdl.train(model_file, data=_data(), progress=False)


def _arrays(path):
    return {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
