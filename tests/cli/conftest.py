"""The ``work`` folder every ``dfdl`` command-line test runs in."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.helpers import write_work_files


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A folder with mlp.onnx, data.npz (X, y), X.npy, y.npy, bad.onnx, bad.npz, unique.onnx."""
    return write_work_files(tmp_path_factory.mktemp("cli"))
