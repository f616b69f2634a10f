"""Warnings of ``dfdl.train`` (``dfdl.runtime.session``): runs that go on, but probably
not as the user meant them."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dfdl
from dfdl.errors import FoldedParametersWarning, TiedParametersWarning
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


def _tied_model() -> object:
    """y = (x * a.weight) * b.weight, where b.weight is ``Identity(a.weight)``: what
    TorchScript's exporter in eval mode writes for two parameters that were equal."""
    init = numpy_helper.from_array(np.full(4, 0.5, np.float32), "a.weight")
    nodes = [
        helper.make_node("Identity", ["a.weight"], ["b.weight"], name="dedup"),
        helper.make_node("Mul", ["x", "a.weight"], ["h"], name="m1"),
        helper.make_node("Mul", ["h", "b.weight"], ["y"], name="m2"),
    ]
    graph = helper.make_graph(
        nodes,
        "tied",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [init],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_training_initializers_read_through_identities_warns_naming_them(client):
    with pytest.warns(TiedParametersWarning, match=r"b\.weight = a\.weight.*TRAINING") as record:
        result = _train(_tied_model(), client)
    assert len(record) == 1 and record[0].filename == __file__
    assert set(result.params) == {"a.weight"}  # one tensor trains, as the file says


def test_training_a_dynamo_export_does_not_warn_of_ties(client):
    with warnings.catch_warnings():
        warnings.simplefilter("error", TiedParametersWarning)
        _train(torch_marked_model(folded=False), client)
