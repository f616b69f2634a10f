"""Tensors in files the workers read and write (dfdl.runtime.stored): any tiling of a
tensor written tile by tile gives the tensor back, and only whole-file memory maps are
taken for stored tensors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dfdl.errors import TrainingError
from dfdl.runtime.stored import Stored, Zeros, create, of_memmap, read_tile, write_tile


def _tilings(shape, rng):
    cuts = [sorted({0, n, *rng.integers(0, n + 1, 2).tolist()}) for n in shape]
    for idx in itertools.product(*(range(len(c) - 1) for c in cuts)):
        yield tuple(slice(c[i], c[i + 1]) for c, i in zip(cuts, idx))


@pytest.mark.parametrize("shape", [(7,), (5, 6), (3, 4, 5), (2, 3, 4, 5), (1, 1), (4, 0)])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "float16"])
def test_tiles_written_in_any_order_give_the_tensor(tmp_path, shape, dtype):
    rng = np.random.default_rng(sum(shape))
    want = (rng.standard_normal(shape) * 100).astype(dtype)
    target = create(tmp_path / "t.npy", shape, dtype)
    regions = list(_tilings(shape, rng))
    for i in rng.permutation(len(regions)):
        written = write_tile(want[regions[i]], target, regions[i])
        assert written == want[regions[i]].nbytes
    got = np.load(tmp_path / "t.npy")
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    whole = tuple(slice(0, n) for n in shape)
    np.testing.assert_array_equal(read_tile(target, whole), want)
    for r in regions:
        np.testing.assert_array_equal(read_tile(target, r), want[r])


def test_a_tile_of_a_tuple_and_of_the_wrong_shape(tmp_path):
    target = create(tmp_path / "t.npy", (2, 4), "float32")
    region = (slice(0, 2), slice(2, 4))
    pair = (np.zeros(1), np.full((2, 2), 3, np.float32))
    write_tile(pair, target, region, pos=1)
    assert np.load(tmp_path / "t.npy")[:, 2:].tolist() == [[3, 3], [3, 3]]
    with pytest.raises(ValueError, match=r"a tile of shape \(2, 3\) for a region of shape"):
        write_tile(np.zeros((2, 3), np.float32), target, region)


def test_a_new_file_is_sparse_until_written(tmp_path):
    target = create(tmp_path / "big.npy", (1024, 1024, 64), "float32")
    st = (tmp_path / "big.npy").stat()
    assert st.st_size == target.offset + 2**28
    assert st.st_blocks * 512 < 2**20  # nothing of the 256 MiB allocated


def test_only_whole_memory_maps_are_stored_tensors(tmp_path):
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    np.save(tmp_path / "a.npy", a)
    m = np.load(tmp_path / "a.npy", mmap_mode="r")
    s = of_memmap(m)
    assert isinstance(s, Stored) and s.shape == (4, 6) and s.nbytes == a.nbytes
    np.testing.assert_array_equal(s.mapped(), a)
    assert of_memmap(m[1:]) is None  # a view: its offset attribute is the parent's
    assert of_memmap(m.T) is None
    assert of_memmap(a) is None


def test_zeros_are_made_per_tile():
    z = Zeros((3, 5), "float64")
    tile = read_tile(z, (slice(1, 3), slice(0, 5)))
    assert tile.shape == (2, 5) and tile.dtype == np.float64 and not tile.any()
    assert z.nbytes == 120


def test_a_file_a_worker_cannot_reach_is_a_training_error_naming_it(tmp_path):
    gone = Stored(str(tmp_path / "elsewhere" / "w.npy"), 128, (2, 2), "float32")
    with pytest.raises(TrainingError, match=r"cannot read .*elsewhere/w.npy .*filesystem"):
        read_tile(gone, (slice(0, 2), slice(0, 2)))
    with pytest.raises(TrainingError, match=r"cannot write .*elsewhere/w.npy"):
        write_tile(np.zeros((2, 2), np.float32), gone, (slice(0, 2), slice(0, 2)))
