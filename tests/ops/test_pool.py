"""Pooling helpers that the registry's cases do not reach on their own: the slab of dX a
MaxPoolGrad tile keeps (``dfdl.ops.halo.crop_slab``, shared by the forward and the CPU kernel)."""

from __future__ import annotations

import numpy as np

from dfdl.ops.halo import crop_slab


def test_crop_slab_keeps_a_slab_and_pads_past_the_end_with_zeros():
    dx = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5) + 1
    np.testing.assert_array_equal(crop_slab(dx, [1, 2, 0, 5]), dx[:, :, 1:3])
    past = crop_slab(dx, [2, 3, 1, 4])
    assert past.shape == (2, 3, 3, 4)
    np.testing.assert_array_equal(past[:, :, :2], dx[:, :, 2:4, 1:5])
    assert not past[:, :, 2].any()


def test_crop_slab_of_the_whole_image_returns_it_without_a_copy():
    dx = np.ones((2, 3, 4, 5), np.float32)
    assert crop_slab(dx, [0, 4, 0, 5]) is dx
    assert crop_slab(dx, (0, 4, 0, 5)) is dx
    assert crop_slab(dx, None) is dx
    assert crop_slab(dx, [0, 4, 0, 4]) is not dx
