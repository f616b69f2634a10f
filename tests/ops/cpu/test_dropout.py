"""The Dropout kernel draws the forward's numbers on any tile of a tensor, bit for bit."""

import numpy as np
import pytest

from dfdl.ops import REGISTRY
from dfdl.ops.dropout import Dropout

RATIO, ON = np.array(0.3, np.float32), np.array(True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("seed", [0, 7, 2**63 + 5])
def test_tiles_match_the_whole_tensor_forward(dtype, seed):
    x = np.random.default_rng(1).standard_normal((6, 5, 9)).astype(dtype)
    want, want_mask = Dropout(x, RATIO, ON, seed=seed)
    assert 0 < want_mask.mean() < 1
    dropout = REGISTRY["Dropout"].kernel("cpu")
    for lo, hi in [((0, 0, 0), (6, 5, 9)), ((2, 1, 3), (5, 4, 9)), ((5, 0, 8), (6, 5, 9))]:
        region = tuple(slice(a, b) for a, b in zip(lo, hi))
        out, mask = dropout(x[region], RATIO, ON, seed=seed, _offset=lo, _full_shape=x.shape)
        assert out.dtype == x.dtype and mask.dtype == np.bool_
        np.testing.assert_array_equal(mask, want_mask[region])
        assert out.tobytes() == want[region].tobytes()


@pytest.mark.parametrize(
    "data, ratio, training_mode, taken",
    [
        (np.ones((2, 3), np.float32), RATIO, ON, True),
        (np.ones((2, 3), np.float64), None, ON, True),  # default ratio 0.5
        (np.ones((2, 3), np.float32), RATIO, None, False),  # inference
        (np.ones((2, 3), np.float32), RATIO, np.array(False), False),
        (np.ones((2, 3), np.float32), np.array(0.0, np.float32), ON, False),
        (np.ones((2, 3), np.float32), np.array(1.0, np.float32), ON, False),
        (np.ones((2, 3), np.int32), RATIO, ON, False),
        (np.ones((), np.float32), RATIO, ON, False),  # rank 0
    ],
)
def test_kernel_takes_training_floats_with_a_proper_ratio(data, ratio, training_mode, taken):
    accepts = REGISTRY["Dropout"].kernels["cpu"].accepts
    assert accepts(data, ratio, training_mode, seed=3) is taken
