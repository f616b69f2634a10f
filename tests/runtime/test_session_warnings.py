"""Warnings of ``dfdl.train`` (``dfdl.runtime.session``): runs that go on, but probably
not as the user meant them."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import dfdl
from dfdl.errors import FoldedParametersWarning
from tests.ir.helpers import torch_marked_model


def _train(model, client):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((8, 4)).astype(np.float32)
    return dfdl.train(
        model, (X, X), loss="mse", batch_size=4, steps=1, client=client, progress=False
    )


def test_training_a_folded_export_warns_naming_the_copies(client):
    with pytest.warns(FoldedParametersWarning, match=r"val_12.*optimize=False") as record:
        result = _train(torch_marked_model(folded=True), client)
    assert len(record) == 1
    # the warning points at the caller's line, not into dfdl
    assert record[0].filename == __file__
    # the run goes on: the copy trains, as the warning says
    assert set(result.params) == {"w", "val_12"}


def test_training_an_unfolded_export_does_not_warn(client):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FoldedParametersWarning)
        result = _train(torch_marked_model(folded=False), client)
    assert set(result.params) == {"w", "v"}
