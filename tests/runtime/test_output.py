"""Output files: the path is checked before any work, and models are written atomically
(no partial file, the previous one untouched), with external data when they are large."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import dfdl.models
from dfdl.errors import DfdlError, ModelError, OutputError
from dfdl.ir.onnx_io import load_model, tensor_bytes
from dfdl.runtime.output import EXTERNAL_MIN_TENSOR, check_output_path, save_model
from dfdl.runtime.result import TrainResult

ROOT = os.geteuid() == 0
#: an MLP whose two weights (8 KiB, 1.25 KiB) go to external data and biases stay inline
SIZES = (64, 32, 10)


def mlp(seed: int = 1) -> onnx.ModelProto:
    return dfdl.models.mlp(SIZES, seed=seed)


def arrays(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def run_ort(model: onnx.ModelProto | str | Path, x: np.ndarray) -> np.ndarray:
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def listing(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


# ---- check_output_path -------------------------------------------------------------------


def test_a_writable_path_passes_and_leaves_nothing(tmp_path):
    assert check_output_path(tmp_path / "out.onnx", size=1) == tmp_path / "out.onnx"
    (tmp_path / "old.onnx").write_bytes(b"previous")
    assert check_output_path(str(tmp_path / "old.onnx")) == tmp_path / "old.onnx"
    assert listing(tmp_path) == ["old.onnx"]
    assert (tmp_path / "old.onnx").read_bytes() == b"previous"


def test_a_relative_path_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert check_output_path("out.onnx") == tmp_path / "out.onnx"


BAD_PATHS = {
    "empty": ("", ["-o is empty", "e.g. trained.onnx"]),
    "folder": (".", ["-o .: that is a folder", "give a file name inside it"]),
    "missing folder": ("no/such/out.onnx", ["no/such", "does not exist", "mkdir -p"]),
    "proc": ("/proc/dfdl-out.onnx", ["/proc", "cannot create a file", "choose a folder"]),
    "folder is a file": ("plain.txt/out.onnx", ["plain.txt", "is not a folder"]),
}


@pytest.mark.parametrize("case", list(BAD_PATHS), ids=list(BAD_PATHS))
def test_bad_paths_are_refused_with_what_to_do(tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain.txt").write_text("a file")
    path, words = BAD_PATHS[case]
    with pytest.raises(OutputError) as e:
        check_output_path(path, "-o")
    message = str(e.value)
    assert "\n" not in message
    for word in words:
        assert word in message
    assert isinstance(e.value, DfdlError) and isinstance(e.value, OSError)
    assert listing(tmp_path) == ["plain.txt"]


@pytest.fixture
def open_folder():
    """A folder every user can enter (pytest's own are root's alone when run as root)."""
    folder = Path(tempfile.mkdtemp(prefix="dfdl-output-test-"))
    folder.chmod(0o755)
    yield folder
    for p in (folder, *folder.iterdir()):
        p.chmod(0o755)
    shutil.rmtree(folder)


def check_unprivileged(path: Path) -> str:
    """The OutputError message of ``check_output_path(path)`` for a user without write
    permission there ("" if it passes): this user, or, as root (who may write anywhere),
    a child process that drops to ``nobody`` after importing dfdl."""
    if not ROOT:
        try:
            check_output_path(path)
        except OutputError as e:
            return str(e)
        return ""
    script = textwrap.dedent(f"""
        import os
        from dfdl.errors import OutputError
        from dfdl.runtime.output import check_output_path
        os.setgroups([])
        os.setresgid(65534, 65534, 65534)
        os.setresuid(65534, 65534, 65534)
        try:
            check_output_path({str(path)!r})
        except OutputError as e:
            print(e)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_folder_without_write_permission_is_refused(open_folder):
    locked = open_folder / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    message = check_unprivileged(locked / "out.onnx")
    assert f"cannot create a file in {locked} (Permission denied)" in message
    assert listing(locked) == []


def test_a_read_only_file_is_refused(open_folder):
    path = open_folder / "kept.onnx"
    path.write_bytes(b"keep me")
    path.chmod(0o444)
    assert "that file is read-only; make it writable" in check_unprivileged(path)
    assert path.read_bytes() == b"keep me"
    assert listing(open_folder) == ["kept.onnx"]


def test_a_special_file_is_refused(tmp_path):
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="not a regular file"):
        check_output_path(fifo)
    with pytest.raises(OutputError, match="not a regular file"):
        save_model(mlp(), fifo)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_too_little_free_space_is_refused(tmp_path):
    with pytest.raises(OutputError, match="needs about .* free some space"):
        check_output_path(tmp_path / "out.onnx", size=2**62)
    assert listing(tmp_path) == []


# ---- save_model: atomic ------------------------------------------------------------------


def test_save_writes_a_model_with_the_permissions_of_a_new_file(tmp_path):
    model = mlp()
    before = model.SerializeToString()
    files = save_model(model, tmp_path / "m.onnx")
    assert files == [tmp_path / "m.onnx"]
    assert listing(tmp_path) == ["m.onnx"]
    assert model.SerializeToString() == before
    assert onnx.load(str(files[0])) == model
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(files[0]).st_mode) == 0o666 & ~umask
    files[0].chmod(0o640)
    save_model(mlp(seed=2), files[0])
    assert stat.S_IMODE(os.stat(files[0]).st_mode) == 0o640


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failed_write_keeps_the_previous_file_and_leaves_no_temporary(
    tmp_path, monkeypatch, failing
):
    path = tmp_path / "m.onnx"
    save_model(mlp(seed=1), path)
    previous = path.read_bytes()

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, failing, no_space)
    with pytest.raises(OutputError) as e:
        save_model(mlp(seed=2), path)
    monkeypatch.undo()
    assert str(path) in str(e.value) and "No space left on device" in str(e.value)
    assert "unchanged" in str(e.value)
    assert path.read_bytes() == previous
    assert listing(tmp_path) == ["m.onnx"]


def test_a_real_write_failure_keeps_the_previous_file(tmp_path):
    """A file-size limit (RLIMIT_FSIZE) makes the kernel fail the write itself ("File
    too large") part way through the new model."""
    path = tmp_path / "m.onnx"
    save_model(dfdl.models.mlp((4, 3)), path)
    previous = path.read_bytes()
    assert len(previous) < 2048 < len(mlp().SerializeToString())
    script = textwrap.dedent(f"""
        import resource, signal
        import dfdl.models
        from dfdl.errors import OutputError
        from dfdl.runtime.output import save_model
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))
        try:
            save_model(dfdl.models.mlp({SIZES}, seed=1), {str(path)!r})
        except OutputError as e:
            print(e)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"cannot write the model to {path} (File too large)" in r.stdout
    assert path.read_bytes() == previous
    assert listing(tmp_path) == ["m.onnx"]


def test_a_model_with_unloaded_external_data_is_refused(tmp_path):
    save_model(mlp(), tmp_path / "ext.onnx", external_threshold=0)
    shell = onnx.load(str(tmp_path / "ext.onnx"), load_external_data=False)
    with pytest.raises(ModelError, match="external data that is not loaded"):
        save_model(shell, tmp_path / "copy.onnx")
    assert listing(tmp_path) == ["ext.onnx", "ext.onnx.data"]


def test_a_model_whose_tensors_are_left_in_their_files_is_copied_from_them(tmp_path):
    model = mlp()
    save_model(model, tmp_path / "ext.onnx", external_threshold=0)
    mapped = load_model(tmp_path / "ext.onnx", map_external=True)
    assert tensor_bytes(mapped) < 200  # nothing loaded
    files = save_model(mapped, tmp_path / "copy.onnx")
    assert [f.name for f in files] == ["copy.onnx", "copy.onnx.data"]
    copied = onnx.load(str(files[0]))
    want = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    got = {t.name: numpy_helper.to_array(t) for t in copied.graph.initializer}
    assert want.keys() == got.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    # the small ones are inside the model file, the rest in its data file
    small = {t.name for t in model.graph.initializer if t.ByteSize() < EXTERNAL_MIN_TENSOR}
    inside = {
        t.name
        for t in onnx.load(str(files[0]), load_external_data=False).graph.initializer
        if t.data_location != onnx.TensorProto.EXTERNAL
    }
    assert small and inside == small


def test_train_result_save_is_atomic_and_checked(tmp_path):
    result = TrainResult(model=mlp())
    assert result.save(tmp_path / "t.onnx") == [tmp_path / "t.onnx"]
    with pytest.raises(OutputError, match="is a folder"):
        result.save(tmp_path)
    with pytest.raises(OutputError, match="does not exist"):
        result.save(tmp_path / "missing" / "t.onnx")
    assert listing(tmp_path) == ["t.onnx"]


# ---- save_model: external data -----------------------------------------------------------


def test_a_large_model_is_saved_with_one_external_data_file(tmp_path):
    model = mlp()
    before = model.SerializeToString()
    path = tmp_path / "big.onnx"
    files = save_model(model, path, external_threshold=tensor_bytes(model) - 1)
    assert files == [path, tmp_path / "big.onnx.data"]
    assert listing(tmp_path) == ["big.onnx", "big.onnx.data"]
    assert model.SerializeToString() == before
    shell = onnx.load(str(path), load_external_data=False)
    external = {}
    for t in shell.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            assert info["location"] == "big.onnx.data"
            assert int(info["offset"]) % 4096 == 0
            external[t.name] = int(info["length"])
    sizes = {k: v.nbytes for k, v in arrays(model).items()}
    assert external == {k: n for k, n in sizes.items() if n >= EXTERNAL_MIN_TENSOR}
    assert len(external) == 2
    assert os.path.getsize(path) < 2048

    x = np.random.default_rng(0).standard_normal((5, SIZES[0])).astype(np.float32)
    np.testing.assert_array_equal(run_ort(path, x), run_ort(model, x))
    loaded = load_model(path)
    assert loaded.graph.node == model.graph.node
    got = arrays(loaded)
    for name, value in arrays(model).items():
        np.testing.assert_array_equal(got[name], value)


def test_saving_a_large_model_again_replaces_its_data(tmp_path):
    path = tmp_path / "big.onnx"
    save_model(mlp(seed=1), path, external_threshold=0)
    size = os.path.getsize(tmp_path / "big.onnx.data")
    second = mlp(seed=2)
    save_model(second, path, external_threshold=0)
    assert os.path.getsize(tmp_path / "big.onnx.data") == size
    got = arrays(load_model(path))
    for name, value in arrays(second).items():
        np.testing.assert_array_equal(got[name], value)
    assert listing(tmp_path) == ["big.onnx", "big.onnx.data"]


def failing_rename_of(monkeypatch, target: Path) -> None:
    """Make ``os.replace`` fail (EIO) when it renames a file onto ``target`` only."""
    real_replace = os.replace

    def replace(src, dst):
        if os.fspath(dst) == str(target):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)


def test_a_failed_model_rename_restores_the_previous_data_file(tmp_path, monkeypatch):
    path = tmp_path / "big.onnx"
    first = mlp(seed=1)
    save_model(first, path, external_threshold=0)
    model_bytes = path.read_bytes()
    data_bytes = (tmp_path / "big.onnx.data").read_bytes()
    failing_rename_of(monkeypatch, path)
    with pytest.raises(OutputError, match="Input/output error"):
        save_model(mlp(seed=2), path, external_threshold=0)
    monkeypatch.undo()
    assert path.read_bytes() == model_bytes
    assert (tmp_path / "big.onnx.data").read_bytes() == data_bytes
    assert listing(tmp_path) == ["big.onnx", "big.onnx.data"]
    got = arrays(load_model(path))
    for name, value in arrays(first).items():
        np.testing.assert_array_equal(got[name], value)


def test_a_failed_model_rename_removes_the_new_data_file(tmp_path, monkeypatch):
    failing_rename_of(monkeypatch, tmp_path / "new.onnx")
    with pytest.raises(OutputError, match="Input/output error"):
        save_model(mlp(), tmp_path / "new.onnx", external_threshold=0)
    monkeypatch.undo()
    assert listing(tmp_path) == []


def test_a_small_model_over_a_large_one_removes_its_data_file(tmp_path):
    path = tmp_path / "m.onnx"
    save_model(mlp(seed=1), path, external_threshold=0)
    (tmp_path / "other.onnx.data").write_bytes(b"not ours")
    assert save_model(mlp(seed=2), path) == [path]
    assert listing(tmp_path) == ["m.onnx", "other.onnx.data"]
    got = arrays(load_model(path))
    for name, value in arrays(mlp(seed=2)).items():
        np.testing.assert_array_equal(got[name], value)


def test_a_data_file_the_previous_model_did_not_use_is_kept(tmp_path):
    path = tmp_path / "m.onnx"
    save_model(mlp(seed=1), path)
    (tmp_path / "m.onnx.data").write_bytes(b"someone else's")
    save_model(mlp(seed=2), path)
    assert (tmp_path / "m.onnx.data").read_bytes() == b"someone else's"


def test_saving_through_a_symbolic_link_replaces_the_file_it_points_to(tmp_path):
    real = tmp_path / "runs" / "model-5.onnx"
    real.parent.mkdir()
    save_model(mlp(seed=1), real)
    link = tmp_path / "latest.onnx"
    link.symlink_to(real)
    assert check_output_path(link) == link
    save_model(mlp(seed=2), link)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert listing(tmp_path) == ["latest.onnx", "runs"]
    assert listing(real.parent) == ["model-5.onnx"]
    assert onnx.load(str(real)) == mlp(seed=2)

    beside = real.parent / "latest.onnx"  # with external data: beside the file itself
    beside.symlink_to(real.name)
    save_model(mlp(seed=3), beside, external_threshold=0)
    assert listing(real.parent) == ["latest.onnx", "model-5.onnx", "model-5.onnx.data"]
    for loaded in (load_model(beside), load_model(real)):
        got = arrays(loaded)
        for name, value in arrays(mlp(seed=3)).items():
            np.testing.assert_array_equal(got[name], value)

    link.unlink()
    link.symlink_to(tmp_path / "gone.onnx")
    with pytest.raises(OutputError, match="not a regular file .*broken link"):
        check_output_path(link)
