"""The GPU tile functions (dfdl.ops.gpu) as the client sees them, without cupy: every op
has one, kernels where registered and the CPU function on host copies elsewhere, and
they travel in tasks by reference. The kernels themselves run in tests/gpu."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import dfdl.ops.gpu  # noqa: F401  (registers the GPU kernels)
from dfdl.ops import REGISTRY
from dfdl.ops.gpu.device import FALLBACKS, GpuDispatch, is_device_array, to_host

#: the ops the zoo's MLP and transformer steps spend their time in: each has a GPU kernel
HOT = ["Gemm", "MatMul", "dfdl.MatMulT", "dfdl.MatMulGradB", "Relu", "dfdl.ReluGrad", "Add",
       "Sub", "Mul", "Div", "ReduceSum", "ReduceMean", "Reshape", "Expand", "Transpose",
       "Slice", "dfdl.SliceGrad", "Gather", "dfdl.GatherGrad", "Softmax", "dfdl.SoftmaxGrad",
       "LayerNormalization", "dfdl.LayerNormalizationGrad", "dfdl.LayerNormalizationParamGrad",
       "Gelu", "dfdl.GeluGrad", "Dropout", "dfdl.DropoutGrad", "SoftmaxCrossEntropyLoss",
       "dfdl.SoftmaxCrossEntropyLossGrad", "dfdl.SGDUpdate", "dfdl.AdamUpdate",
       "dfdl.UpdateGroup"]  # fmt: skip


@pytest.mark.parametrize("op", sorted(REGISTRY))
def test_every_op_has_a_gpu_tile_function_that_pickles(op):
    fn = REGISTRY[op].kernel("gpu")
    assert isinstance(fn, GpuDispatch)
    again = pickle.loads(pickle.dumps(fn))
    assert again.name == fn.name and again.kernel is fn.kernel
    assert repr(again.host) == repr(fn.host)  # the CPU tile function (a Dispatch, or the forward)


@pytest.mark.parametrize("op", HOT)
def test_the_hot_ops_have_gpu_kernels(op):
    fn = REGISTRY[op].kernel("gpu")
    assert fn.kernel is not None and fn.kernel.__module__.startswith("dfdl.ops.gpu.")


def test_an_op_without_a_gpu_kernel_runs_its_cpu_function_on_the_host():
    fn = REGISTRY["Elu"].kernel("gpu")
    assert fn.kernel is None
    x = np.array([[-1.0, 2.0, 3.0]], np.float32)
    before = FALLBACKS["Elu"]
    got = fn(x, alpha=0.5)
    np.testing.assert_array_equal(got, REGISTRY["Elu"].kernel("cpu")(x, alpha=0.5))
    assert FALLBACKS["Elu"] == before + 1


def test_a_tile_a_gpu_kernel_does_not_accept_runs_on_the_host():
    # integer tiles: no GPU kernel takes them, the CPU function does (no cupy needed)
    fn = REGISTRY["Add"].kernel("gpu")
    got = fn(np.array([1, 2], np.int64), np.array([3, 4], np.int64))
    np.testing.assert_array_equal(got, [4, 6])


def test_host_values_pass_to_host_unchanged():
    out = to_host((np.ones(2), None, 3.0))
    assert isinstance(out, tuple) and out[1] is None and out[2] == 3.0
    assert not is_device_array(np.ones(1))
