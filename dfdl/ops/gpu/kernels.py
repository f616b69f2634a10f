"""cupy kernels of the ops a training step spends its time in: GEMMs (cuBLAS), the
activations and their gradients, elementwise arithmetic, sums, layout views and the
optimizer updates (one fused kernel per tensor).

Each accepts float32/float64 tiles of one dtype (else the op's CPU function runs on the
host, :class:`~dfdl.ops.gpu.device.GpuDispatch`). Element-wise kernels are compiled
without fused multiply-adds, so they round as the numpy forwards do; cupy's reductions
sum in a fixed order, so a GPU run repeats bit for bit.

Example:
    >>> import numpy as np
    >>> floats(np.ones(2, np.float32), np.ones(2, np.float32))
    True
"""

from __future__ import annotations

import functools

import numpy as np

from dfdl.ops.gpu.device import cupy, scalar, to_device
from dfdl.ops.registry import DFDL_DOMAIN, kernel, lookup

_FLOAT = (np.dtype(np.float32), np.dtype(np.float64))
#: compile element-wise kernels without contracting a * b + c into one rounding
NO_FMA = ("--fmad=false",)


def floats(*xs, **attrs) -> bool:
    """Whether every array given is float32 or float64, all of one dtype."""
    arrays = [x for x in xs if x is not None]
    return (
        bool(arrays)
        and all(getattr(x, "dtype", None) == arrays[0].dtype for x in arrays)
        and (arrays[0].dtype in _FLOAT)
    )


def _first_two_floats(A, B, *rest, **attrs) -> bool:
    return floats(A, B)


# ------------------------------------------------------------------------------ GEMMs


def _gemm_floats(A, B, C=None, **attrs) -> bool:
    return floats(A, B, C)


@kernel("Gemm", "gpu", accepts=_gemm_floats)
def gemm(A, B, C=None, *, alpha, beta, trans_a, trans_b):
    """ONNX Gemm on cuBLAS: ``alpha * A' @ B' + beta * C``."""
    a, b = to_device(A), to_device(B)
    y = cupy().matmul(a.T if trans_a else a, b.T if trans_b else b)
    if alpha != 1.0:
        y *= y.dtype.type(alpha)
    if C is not None and beta != 0.0:
        c = to_device(C)
        y += c * c.dtype.type(beta) if beta != 1.0 else c
    return y


@kernel("MatMul", "gpu", accepts=_first_two_floats)
def matmul(A, B):
    """numpy/ONNX matmul (batched, broadcast) on cuBLAS."""
    return cupy().matmul(to_device(A), to_device(B))


@kernel("MatMulT", "gpu", accepts=_first_two_floats, domain=DFDL_DOMAIN)
def matmul_t(A, B, *, trans_a, trans_b):
    """``A' @ B'``, a transposed operand read in place (cuBLAS's transpose flags)."""
    cp = cupy()
    a, b = to_device(A), to_device(B)
    a = cp.swapaxes(a, -1, -2) if trans_a else a
    return cp.matmul(a, cp.swapaxes(b, -1, -2) if trans_b else b)


@kernel("MatMulGradB", "gpu", accepts=_first_two_floats, domain=DFDL_DOMAIN)
def matmul_grad_b(A, dY):
    """``A^T dY`` summed over the leading axes, as one GEMM."""
    a, dy = to_device(A), to_device(dY)
    return cupy().matmul(a.reshape(-1, a.shape[-1]).T, dy.reshape(-1, dy.shape[-1]))


# ------------------------------------------------------------------------ elementwise


@functools.cache
def elementwise(name: str, params: str, out: str, body: str, preamble: str = ""):
    """A cupy ``ElementwiseKernel`` compiled once per process, without fused
    multiply-adds (:data:`NO_FMA`)."""
    return cupy().ElementwiseKernel(
        params, out, body, f"dfdl_{name}", preamble=preamble, options=NO_FMA
    )


@kernel("Relu", "gpu", accepts=floats)
def relu(X):
    """max(x, 0) (NaN stays NaN, as numpy's maximum)."""
    x = to_device(X)
    return elementwise("relu", "T x", "T y", "y = x > (T)0 || x != x ? x : (T)0")(x)


def _same_shape_pair(dY, X, **attrs) -> bool:
    return floats(dY, X) and dY.shape == X.shape


@kernel("ReluGrad", "gpu", accepts=_same_shape_pair, domain=DFDL_DOMAIN)
def relu_grad(dY, X, *, alpha):
    """dY where X > 0, else alpha * dY."""
    dy, x = to_device(dY), to_device(X)
    body = "out = x > (T)0 ? dy : dy * alpha"
    k = elementwise("relu_grad", "T dy, T x, T alpha", "T out", body)
    return k(dy, x, dy.dtype.type(alpha))


@kernel("Add", "gpu", accepts=floats)
def add(A, B):
    return cupy().add(to_device(A), to_device(B))


@kernel("Sub", "gpu", accepts=floats)
def sub(A, B):
    return cupy().subtract(to_device(A), to_device(B))


@kernel("Mul", "gpu", accepts=floats)
def mul(A, B):
    return cupy().multiply(to_device(A), to_device(B))


@kernel("Div", "gpu", accepts=floats)
def div(A, B):
    return cupy().divide(to_device(A), to_device(B))


# ------------------------------------------------------------------- sums and layout


def _data_floats(data, *rest, **attrs) -> bool:
    return floats(data)


def _reduce(how: str, data, red, keepdims):
    """``cupy.sum``/``cupy.mean`` over ``red`` (None: the data itself), in its dtype."""
    x = to_device(data)
    if red is None:
        return x.copy()
    return getattr(cupy(), how)(x, axis=red, keepdims=keepdims, dtype=x.dtype)


@kernel("ReduceSum", "gpu", accepts=_data_floats)
def reduce_sum(data, axes=None, *, red, keepdims):
    """Sum over the reduced axes ``red``."""
    return _reduce("sum", data, red, keepdims)


@kernel("ReduceMean", "gpu", accepts=_data_floats)
def reduce_mean(data, axes=None, *, red, keepdims):
    """Mean over the reduced axes ``red``."""
    return _reduce("mean", data, red, keepdims)


@kernel("Reshape", "gpu")
def reshape(data, shape, *, target):
    """A view of the tile with the shape ``target`` (a copy where cupy needs one)."""
    return to_device(data).reshape(target)


@kernel("Expand", "gpu")
def expand(input, shape, *, target):
    """``input`` broadcast to ``target``, as a new array."""
    return cupy().broadcast_to(to_device(input), target).copy()


# ----------------------------------------------------------------- optimizer updates

_SGD = """
T g = g0;
if (flags & 1) g = g + wd * p;
T b = b0;
if (flags & 2) {
    b = (flags & 8) ? g : b0 * mom + damp_c * g;
    g = (flags & 4) ? g + mom * b : b;
}
new_p = p + neg_lr * g;
new_b = b;
"""


def _same_shape_floats(param, grad, *rest, **attrs) -> bool:
    state = [x for x in rest if getattr(x, "ndim", 0) > 0]  # buffers, not 0-d scalars
    return floats(param, grad, *state) and all(x.shape == param.shape for x in (grad, *state))


@kernel("SGDUpdate", "gpu", accepts=_same_shape_floats, domain=DFDL_DOMAIN)
def sgd_update(param, grad, lr, momentum_buffer=None, first=None, *, momentum, dampening,
               nesterov, weight_decay):  # fmt: skip
    """One ``torch.optim.SGD`` step, one kernel per tensor."""
    p, g = to_device(param), to_device(grad)
    dt = p.dtype.type
    use_mom = momentum != 0
    first_step = use_mom and (momentum_buffer is None or scalar(first) != 0)
    b = to_device(momentum_buffer) if use_mom and momentum_buffer is not None else p
    flags = (weight_decay != 0) | use_mom << 1 | bool(nesterov) << 2 | first_step << 3
    k = elementwise(
        "sgd",
        "T p, T g0, T b0, T neg_lr, T wd, T mom, T damp_c, int32 flags",
        "T new_p, T new_b",
        _SGD,
    )
    new_p, new_b = k(
        p, g, b, -dt(scalar(lr)), dt(weight_decay), dt(momentum), dt(1.0 - dampening), flags
    )
    return (new_p, new_b) if use_mom else new_p


_ADAM = """
T q = use_decay ? p * decay : p;
T gg = use_wd ? g + wd * q : g;
T d = gg - m0;
new_m = small_w1 ? m0 + w1 * d : gg - d * one_minus_w1;
new_v = v0 * b2 + c2 * gg * gg;
T denom = sqrt(new_v) / bc2 + eps;
new_p = q + neg_step * new_m / denom;
"""


@kernel("AdamUpdate", "gpu", accepts=_same_shape_floats, domain=DFDL_DOMAIN)
def adam_update(param, grad, exp_avg, exp_avg_sq, step_size, bias_correction2_sqrt,
                decay=None, *, beta1, beta2, eps, weight_decay):  # fmt: skip
    """One ``torch.optim.Adam``/``AdamW`` step, one kernel per tensor (the numpy
    forward's operation order, torch's lerp for the first moment)."""
    p, g = to_device(param), to_device(grad)
    dt = p.dtype.type
    w1 = 1.0 - beta1
    k = elementwise(
        "adam",
        "T p, T g, T m0, T v0, T decay, bool use_decay, T wd, bool use_wd, T w1, "
        "bool small_w1, T one_minus_w1, T b2, T c2, T bc2, T eps, T neg_step",
        "T new_p, T new_m, T new_v",
        _ADAM,
    )
    return k(
        p, g, to_device(exp_avg), to_device(exp_avg_sq),
        dt(1.0 if decay is None else scalar(decay)), decay is not None,
        dt(weight_decay), weight_decay != 0, dt(w1), abs(w1) < 0.5, dt(1.0) - dt(w1),
        dt(beta2), dt(1.0 - beta2), dt(scalar(bias_correction2_sqrt)), dt(eps),
        -dt(scalar(step_size)),
    )  # fmt: skip


@kernel("UpdateGroup", "gpu", domain=DFDL_DOMAIN)
def update_group(*inputs, update, members, member_attrs):
    """Each member update (its inputs at the positions ``members`` gives) with the
    member op's GPU tile function; their outputs, in order."""
    fn = lookup(update, DFDL_DOMAIN).kernel("gpu")
    out: list = []
    for positions in members:
        r = fn(*(inputs[i] for i in positions), **member_attrs)
        out += list(r) if isinstance(r, tuple) else [r]
    return tuple(out)
