"""``-o`` of ``dfdl train`` and ``dfdl export-training-graph``: refused in one line (exit
2) before any training or graph building when it cannot be written; a model that cannot
be written at the end is kept elsewhere rather than lost."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

import dfdl.models
from dfdl.cli import main
from dfdl.cli.train import save_trained
from dfdl.errors import OutputError
from dfdl.runtime.output import save_model
from dfdl.runtime.result import TrainResult
from tests.cli.helpers import SIZES, dfdl_cli, params

#: -o values no user can write, and what the error says about each
BAD_OUTPUTS = {
    "empty": ("", "-o is empty"),
    "a folder": (".", "-o .: that is a folder"),
    "missing folder": ("no/o.onnx", "no does not exist"),
    "under /proc": ("/proc/dfdl-o.onnx", "cannot create a file in /proc"),
}
COMMANDS = {
    "train": ("train", "mlp.onnx", "--data", "data.npz", "--batch-size", "4"),
    "export": ("export-training-graph", "mlp.onnx", "--batch-size", "4"),
}


def listing(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case", list(BAD_OUTPUTS))
def test_an_unwritable_output_is_refused_before_any_work(work, monkeypatch, capsys, command, case):
    monkeypatch.chdir(work)
    before = listing(work)
    output, words = BAD_OUTPUTS[case]
    start = time.perf_counter()
    status = main([*COMMANDS[command], "-o", output])
    elapsed = time.perf_counter() - start
    out, err = capsys.readouterr()
    assert status == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("dfdl: error: -o")
    assert words in err
    assert elapsed < 5, "no cluster was started, no graph built"
    assert listing(work) == before


@pytest.fixture
def open_work(work):
    """The MLP and its data in a folder every user can enter, with a folder no user but
    root can write to, ``locked``."""
    folder = Path(tempfile.mkdtemp(prefix="dfdl-cli-output-"))
    for name in ("mlp.onnx", "data.npz"):
        shutil.copy(work / name, folder / name)
    (folder / "locked").mkdir()
    (folder / "locked").chmod(0o555)
    folder.chmod(0o755)
    yield folder
    (folder / "locked").chmod(0o755)
    shutil.rmtree(folder)


def test_an_output_folder_without_write_permission_is_refused(open_work):
    """As root (who may write anywhere) the command runs as ``nobody``."""
    drop = ""
    if os.geteuid() == 0:
        drop = "os.setgroups([]); os.setresgid(65534, 65534, 65534); "
        drop += "os.setresuid(65534, 65534, 65534)"
    script = textwrap.dedent(f"""
        import os, sys
        from dfdl.cli import main
        {drop}
        sys.exit(main({[*COMMANDS["train"], "-o", "locked/o.onnx"]!r}))
    """)
    r = subprocess.run(
        [sys.executable, "-c", script], cwd=open_work, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    assert r.stderr == (
        f"dfdl: error: -o locked/o.onnx: cannot create a file in {open_work / 'locked'} "
        "(Permission denied); choose a folder you can write to\n"
    )
    assert listing(open_work / "locked") == []


def test_train_writes_the_model_over_the_previous_one(work):
    (work / "previous.onnx").write_bytes(b"an older model")
    r = dfdl_cli(*COMMANDS["train"], "--steps", "1", "-o", "previous.onnx", cwd=work)
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("wrote previous.onnx\n")
    onnx.checker.check_model(onnx.load(str(work / "previous.onnx")))
    assert set(params(work / "previous.onnx")) == set(params(work / "mlp.onnx"))
    assert not [n for n in os.listdir(work) if n.startswith(".previous.onnx.")]


def test_a_model_that_cannot_be_written_at_the_end_is_kept_elsewhere(tmp_path):
    result = TrainResult(model=dfdl.models.mlp(SIZES, seed=1))
    target = tmp_path / "gone" / "trained.onnx"  # its folder went away during training
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    with pytest.raises(OutputError) as e:
        save_trained(result, str(target), fallback_dir=str(fallback))
    (kept,) = fallback.glob("dfdl-trained-*/trained.onnx")
    message = str(e.value)
    assert message.startswith(
        f"cannot write the model to {target}: the folder {target.parent} does not exist"
    )
    assert f"The trained model was written to {kept} instead" in message
    got = params(kept)
    for t in result.model.graph.initializer:
        np.testing.assert_array_equal(got[t.name], onnx.numpy_helper.to_array(t))


def test_info_reads_a_model_saved_with_external_data(tmp_path):
    model = dfdl.models.mlp((64, 32, 10), seed=1)
    files = save_model(model, tmp_path / "big.onnx", external_threshold=0)
    assert [f.name for f in files] == ["big.onnx", "big.onnx.data"]
    r = dfdl_cli("info", "big.onnx", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "parameters: 2,410 values in 4 initializers, 9.4 KiB" in r.stdout
