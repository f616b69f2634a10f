"""Folding last-two-axes Transposes into the products that read them
(dfdl.training.passes.fold_transpose): which operands fold, and the folded training step gives
the unfolded step's numbers at every tiling."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from dfdl.ir.graph import Graph, Node
from dfdl.ops.registry import TensorType
from dfdl.training.passes import fold_transpose
from dfdl.training.passes.fold_transpose import fold_transposes
from tests.training.passes.test_recompute import _run, _training


def _graph(nodes: list[Node], types: dict[str, tuple], outputs: list[str]) -> Graph:
    g = Graph(name="g", nodes=nodes, inputs=["x", "w"], outputs=outputs)
    g.types = {k: TensorType(v, np.float32) for k, v in types.items()}
    return g


def test_swap_of_the_last_two_axes_folds_into_the_product():
    g = _graph(
        [
            Node("t", "Transpose", ["w"], ["wt"], {"perm": [0, 2, 1]}),
            Node("mm", "MatMul", ["x", "wt"], ["y"]),
            Node("neg", "Neg", ["wt"], ["n"]),  # another reader keeps the Transpose
        ],
        {"x": (2, 3, 4), "w": (2, 5, 4), "wt": (2, 4, 5), "y": (2, 3, 5), "n": (2, 4, 5)},
        ["y", "n"],
    )
    assert fold_transposes(g) == 1
    mm = next(n for n in g.nodes if n.name == "mm")
    assert (mm.op_type, mm.domain, mm.inputs) == ("MatMulT", "dfdl", ["x", "w"])
    assert mm.attrs == {"transA": 0, "transB": 1}
    assert [n.op_type for n in g.nodes] == ["Transpose", "MatMulT", "Neg"]
    g.outputs = ["y"]
    g.prune()
    assert [n.op_type for n in g.nodes] == ["MatMulT"]


def test_other_transposes_stay():
    g = _graph(
        [
            Node("heads", "Transpose", ["x"], ["xh"], {"perm": [1, 0, 2]}),  # not a swap
            Node("t2", "Transpose", ["w"], ["wt"], {"perm": [0, 2, 1]}, after=["x"]),
            Node("mm", "MatMul", ["xh", "wt"], ["y"]),
        ],
        {"x": (3, 2, 4), "xh": (2, 3, 4), "w": (2, 5, 4), "wt": (2, 4, 5), "y": (2, 3, 5)},
        ["y"],
    )
    assert fold_transposes(g) == 0  # an ordering edge would be lost with the second
    assert [n.op_type for n in g.nodes] == ["Transpose", "Transpose", "MatMul"]


def test_onnx_default_perm_of_a_matrix_is_a_swap():
    g = _graph(
        [
            Node("t", "Transpose", ["x"], ["xt"]),
            Node("mm", "MatMul", ["xt", "xt"], ["y"]),
        ],
        {"x": (4, 4), "xt": (4, 4), "y": (4, 4)},
        ["y"],
    )
    assert fold_transposes(g) == 2
    assert g.nodes[1].inputs == ["x", "x"]
    assert g.nodes[1].attrs == {"transA": 1, "transB": 1}


@pytest.mark.parametrize("tiles", [{"batch": 2}, {"batch": 2, "model": 2}, {"model": 3}])
def test_the_folded_transformer_step_gives_the_unfolded_numbers(tiles):
    plain, values = _training("transformer", fold=False)
    folded, _ = _training("transformer")
    before = Counter(n.op_type for n in plain.graph.nodes)
    after = Counter(n.op_type for n in folded.graph.nodes)
    # the attention's gradients and the dense layers' input gradients: every product
    # that read a swap of the last two axes now reads the operand in place
    assert after["MatMulT"] >= 8
    assert after["Transpose"] < before["Transpose"]
    assert after["MatMul"] + after["MatMulT"] == before["MatMul"]
    swaps = {
        n.outputs[0]
        for n in folded.graph.nodes
        if n.op_type == "Transpose" and fold_transpose._swaps_last_two(n, len(n.attrs["perm"]))
    }
    assert not any(set(n.inputs) & swaps for n in folded.graph.nodes if n.op_type == "MatMul")
    want, _, _ = _run(plain, values, tiles)
    got, _, _ = _run(folded, values, tiles)
    assert want.keys() == got.keys()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
