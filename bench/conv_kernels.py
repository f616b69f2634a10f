"""Convolution kernel benchmark: dfdl's CPU kernels against PyTorch, one thread each.

For the convolution shapes of the zoo's ResNet and 3-D U-Net tiles, times (best of
``--repeat`` calls) dfdl's CPU kernels for Conv, ConvGradWeight and ConvGradInput in
each layout (``channels_first``: im2col over image rows; ``channels_last``: the path
:mod:`dfdl.ops.cpu.conv` takes for small images; ``direct``: the stencil kernels of
:mod:`dfdl.ops.cpu.conv_direct`, on the shapes they can run whatever their channel
limits; ``winograd``: the F(2x2, 3x3) kernels of :mod:`dfdl.ops.cpu.winograd`, on
the shapes they take; each of these named to :func:`dfdl.ops.cpu.conv.run_conv` and its
gradient siblings; ``auto``: what the registered CPU kernels pick) and, when
torch is installed, ``torch.nn.functional.conv{2,3}d`` and its input and weight
gradients (``torch.nn.grad``, timed in a process of its own, so that PyTorch's MKL and
dfdl's do not share one), all on one thread (numpy's BLAS limited with
threadpoolctl, ``torch.set_num_threads(1)``): the per-task rate of a worker thread.
GFLOP/s count 2 per multiply-add of the forward convolution (the gradients have the
same count). Prints a table and writes JSON. A benchmark, not a test.

Usage:
    python bench/conv_kernels.py [--repeat R] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from threadpoolctl import threadpool_limits

from dfdl.ops import REGISTRY
from dfdl.ops.cpu import blas, conv, conv_direct, winograd

#: (name, X shape, W shape, stride): ResNet tiles (batch 128 in 2 tiles) and U-Net tiles
SHAPES = [
    ("resnet stem", (64, 3, 32, 32), (64, 3, 3, 3), 1),
    ("resnet stage 1", (64, 64, 16, 16), (64, 64, 3, 3), 1),
    ("resnet stage 2", (64, 128, 8, 8), (128, 128, 3, 3), 1),
    ("resnet stage 3", (64, 256, 4, 4), (256, 256, 3, 3), 1),
    ("resnet down 1->2", (64, 64, 16, 16), (128, 64, 3, 3), 2),
    ("unet3d input", (1, 1, 64, 64, 64), (16, 1, 3, 3, 3), 1),
    ("unet3d level 1", (1, 16, 64, 64, 64), (16, 16, 3, 3, 3), 1),
    ("unet3d up 1", (1, 32, 64, 64, 64), (16, 32, 3, 3, 3), 1),
    ("unet3d level 2", (1, 32, 32, 32, 32), (32, 32, 3, 3, 3), 1),
    ("unet3d up 2", (1, 64, 32, 32, 32), (32, 64, 3, 3, 3), 1),
    ("unet3d level 3", (1, 64, 16, 16, 16), (64, 64, 3, 3, 3), 1),
]

LAYOUTS = ("channels_first", "channels_last", "direct", "winograd", "auto")
#: the params of a Conv that winograd.applies takes, in its order
GEOMETRY = ("strides", "dilations", "group", "pads_begin", "pads_end")


def best_of(fn, repeat: int) -> float:
    fn()
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


#: the implementation each arm but ``auto`` names (:data:`dfdl.ops.cpu.conv.ALGORITHMS`)
ALGORITHM = {
    "channels_first": "im2col",
    "channels_last": "im2col",
    "direct": "direct",
    "winograd": "winograd",
}


def _direct_runs(x, w, params) -> bool:
    """Whether the direct kernels can run this geometry, whatever their channel, size and
    border limits."""
    names = ("MIN_CHANNELS", "MAX_CHANNEL_PRODUCT", "MAX_GRID_WASTE", "MIN_POSITIONS")
    limits = {k: getattr(conv_direct, k) for k in names}
    conv_direct.MIN_CHANNELS, conv_direct.MAX_CHANNEL_PRODUCT = 1, 1 << 62
    conv_direct.MAX_GRID_WASTE, conv_direct.MIN_POSITIONS = float("inf"), 1
    try:
        return conv.algorithm(x.shape, w.shape, x.dtype, **params) == "direct"
    finally:
        for k, v in limits.items():
            setattr(conv_direct, k, v)


def dfdl_rates(x, w, attrs, layout: str, repeat: int) -> dict[str, float] | None:
    """Seconds per call of the three kernels in ``layout`` (None: the layout cannot run
    this shape)."""
    fwd_op, dx_op, dw_op = (
        REGISTRY[k] for k in ("Conv", "dfdl.ConvGradInput", "dfdl.ConvGradWeight")
    )
    params = fwd_op.params(x, w, **attrs)
    y = fwd_op.kernel("cpu")(x, w, **attrs)
    dx_attrs = {**attrs, "input_shape": list(x.shape)}
    dw_attrs = {**attrs, "weight_shape": list(w.shape)}
    if layout == "auto":
        calls = {
            "fwd": lambda: fwd_op.kernel("cpu")(x, w, **attrs),
            "dW": lambda: dw_op.kernel("cpu")(x, y, **dw_attrs),
            "dX": lambda: dx_op.kernel("cpu")(y, w, **dx_attrs),
        }
        return {k: best_of(fn, repeat) for k, fn in calls.items()}
    algo = ALGORITHM[layout]
    if algo == "winograd" and not winograd.applies(
        x.shape, w.shape, *(params[k] for k in GEOMETRY), x.dtype
    ):
        return None
    if algo == "direct" and not _direct_runs(x, w, params):
        return None
    dx_params = dx_op.params(y, w, **dx_attrs)
    dw_params = dw_op.params(x, y, **dw_attrs)
    calls = {
        "fwd": lambda: conv.run_conv(algo, x, w, **params),
        "dW": lambda: conv.run_grad_weight(algo, x, y, **dw_params),
        "dX": lambda: conv.run_grad_input(algo, y, w, **dx_params),
    }
    real_cl = conv._cl_samples
    if layout == "channels_first":
        conv._cl_samples = lambda *a: 0
    elif layout == "channels_last":
        conv._cl_samples = lambda npos, kk, channels, itemsize: max(
            1, conv.COLS_BYTES // max(1, npos * kk * itemsize)
        )
    try:
        return {k: best_of(fn, repeat) for k, fn in calls.items()}
    finally:
        conv._cl_samples = real_cl


def torch_rates(x, w, stride: int, repeat: int) -> dict[str, float] | None:
    """Seconds per call of PyTorch's convolution and its two gradients (None without
    torch). Call it in a process of its own (:func:`torch_rates_apart`)."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    f = torch.nn.functional.conv3d if x.ndim == 5 else torch.nn.functional.conv2d
    gx = torch.nn.grad.conv3d_input if x.ndim == 5 else torch.nn.grad.conv2d_input
    gw = torch.nn.grad.conv3d_weight if x.ndim == 5 else torch.nn.grad.conv2d_weight
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    with torch.no_grad():
        ty = f(tx, tw, padding=1, stride=stride)
        return {
            "fwd": best_of(lambda: f(tx, tw, padding=1, stride=stride), repeat),
            "dW": best_of(lambda: gw(tx, tw.shape, ty, padding=1, stride=stride), repeat),
            "dX": best_of(lambda: gx(tx.shape, tw, ty, padding=1, stride=stride), repeat),
        }


def _torch_all(repeat: int) -> dict[str, dict[str, float] | None]:
    rng = np.random.default_rng(0)
    out = {}
    for name, xs, ws, stride in SHAPES:
        x = rng.standard_normal(xs, dtype=np.float32)
        w = rng.standard_normal(ws, dtype=np.float32)
        out[name] = torch_rates(x, w, stride, repeat)
    return out


def torch_rates_apart(repeat: int) -> dict[str, dict[str, float] | None]:
    """:func:`torch_rates` of every shape, in a fresh process: PyTorch links its own MKL,
    and with both in one process dfdl's MKL products ran on numpy instead
    (``DFDL_BLAS=auto``) or the two libraries took each other's symbols."""
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(_torch_all, repeat).result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch_results = torch_rates_apart(args.repeat)
    rng = np.random.default_rng(0)
    rows = []
    print(f"{'shape':<18} {'backend':<15} {'fwd':>6} {'dW':>6} {'dX':>6}  GFLOP/s, one thread")
    for name, xs, ws, stride in SHAPES:
        x = rng.standard_normal(xs, dtype=np.float32)
        w = rng.standard_normal(ws, dtype=np.float32)
        nd = x.ndim - 2
        attrs = {"pads": [1] * 2 * nd, "strides": [stride] * nd}
        out_positions = math.prod((d + 2 - 3) // stride + 1 for d in xs[2:])
        flops = 2 * xs[0] * ws[0] * math.prod(ws[1:]) * out_positions
        with threadpool_limits(1):
            results = {lay: dfdl_rates(x, w, attrs, lay, args.repeat) for lay in LAYOUTS}
        results["torch"] = torch_results[name]
        for backend, secs in results.items():
            if secs is None:
                continue
            rate = {k: flops / v / 1e9 for k, v in secs.items()}
            cells = " ".join(f"{rate[k]:>6.0f}" for k in ("fwd", "dW", "dX"))
            print(f"{name:<18} {backend:<15} {cells}")
            rows.append({"shape": name, "x": xs, "w": ws, "stride": stride, "backend": backend,
                         "seconds": secs, "gflop_per_s": rate})  # fmt: skip
    print(f"dfdl's BLAS: {blas.backend()}; PyTorch timed in a process of its own")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"repeat": args.repeat, "blas": blas.backend(), "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
