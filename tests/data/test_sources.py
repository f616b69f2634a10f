"""Training data from numpy arrays, dask arrays, .npy files and zarr stores."""

from __future__ import annotations

import numpy as np
import pytest

import dfdl
import dfdl.models
from dfdl.data.order import batch_plan
from dfdl.data.sources import FileRows, as_source, read_rows
from dfdl.errors import DataError


def _data(n=40, f=12, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, f)).astype(np.float32)
    y = rng.integers(0, classes, n).astype(np.int64)
    return X, y


def test_batch_plan_shuffles_per_epoch_and_keeps_order_without_shuffle():
    plain = [list(i) for _, _, i in batch_plan(10, 4, epochs=2, shuffle=False)]
    assert plain == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] * 2
    shuffled = [i for _, _, i in batch_plan(10, 5, epochs=2, seed=3)]
    assert sorted(np.concatenate(shuffled[:2])) == list(range(10))
    assert not np.array_equal(np.concatenate(shuffled[:2]), np.concatenate(shuffled[2:]))
    dropped = list(batch_plan(10, 4, drop_last=True))
    assert [len(i) for _, _, i in dropped] == [4, 4]


def test_read_rows_keeps_batch_order(tmp_path):
    X, _ = _data()
    np.save(tmp_path / "X.npy", X)
    idx = np.array([7, 2, 30, 2, 11])
    got = read_rows(str(tmp_path / "X.npy"), "npy", idx, (slice(3, 9),))
    np.testing.assert_array_equal(got, X[idx][:, 3:9])


def test_file_sources_are_read_on_workers(tmp_path):
    X, _ = _data()
    np.save(tmp_path / "X.npy", X)
    src = as_source(tmp_path / "X.npy", "X")
    batch = src.batch(np.array([3, 1]))
    assert isinstance(batch, FileRows) and batch.shape == (2, 12)


def test_bad_paths_are_data_errors(tmp_path):
    with pytest.raises(DataError, match="cannot read"):
        as_source(tmp_path / "missing.npy", "X")


def test_npy_zarr_dask_and_numpy_train_alike(tmp_path, client):
    zarr = pytest.importorskip("zarr", reason="zarr is not installed")
    da = pytest.importorskip("dask.array", reason="dask.array is not installed")
    X, y = _data()
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    zarr.create_array(str(tmp_path / "X.zarr"), data=X, chunks=(7, 12))
    model = dfdl.models.mlp((12, 16, 4))
    kwargs = dict(
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=0.1, momentum=0.9),
        batch_size=8,
        epochs=2,
        seed=5,
        client=client,
        progress=False,
        tiles={"batch": 2},
    )
    ref = dfdl.train(model, data=(X, y), **kwargs).history["loss"]
    for data in [
        (tmp_path / "X.npy", tmp_path / "y.npy"),
        (str(tmp_path / "X.zarr"), y),
        (da.from_array(X, chunks=(9, 12)), y),
    ]:
        got = dfdl.train(model, data=data, **kwargs).history["loss"]
        assert got == ref
