"""GPU convolution kernels: dfdl's cupy Conv, ConvGradInput and ConvGradWeight
(:mod:`dfdl.ops.gpu.conv`, im2col + cuBLAS) against PyTorch/cuDNN on the same shapes,
fp32 with TF32 off, in one run: the shapes of ``bench/run.py --full``'s ResNet and 3-D
U-Net. Each figure is the median of ``--repeat`` timed calls (CUDA events around each,
after two warm-up calls); the largest difference from torch's result is reported beside.

Usage:
    python bench/gpu_conv.py [--repeat 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

#: (name, batch, channels in, channels out, spatial, kernel, stride)
SHAPES = [
    ("resnet-stem 3x3 64ch 32^2", 128, 64, 64, (32, 32), 3, 1),
    ("resnet 3x3 128ch 16^2", 128, 128, 128, (16, 16), 3, 1),
    ("resnet 3x3 256ch 8^2", 128, 256, 256, (8, 8), 3, 1),
    ("resnet 3x3/2 64->128ch 32^2", 128, 64, 128, (32, 32), 3, 2),
    ("resnet 1x1/2 64->128ch 32^2", 128, 64, 128, (32, 32), 1, 2),
    ("unet3d 3x3x3 16ch 64^3", 2, 16, 16, (64, 64, 64), 3, 1),
    ("unet3d 3x3x3 32ch 32^3", 2, 32, 32, (32, 32, 32), 3, 1),
]


def _time(fn, repeat: int) -> float:
    """Median seconds of ``fn()`` over ``repeat`` calls, CUDA events around each."""
    import cupy as cp

    fn()
    fn()
    times = []
    for _ in range(repeat):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    return statistics.median(times)


def bench_shape(shape, repeat: int) -> dict:
    """dfdl's three conv kernels and torch's on one shape: seconds and max differences."""
    import cupy as cp
    import numpy as np
    import torch

    from dfdl.ops import REGISTRY

    name, n, c, m, sp, k, s = shape
    nd = len(sp)
    pad = k // 2
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, *sp), dtype=np.float32)
    w = rng.standard_normal((m, c, *(k,) * nd), dtype=np.float32) / np.sqrt(c * k**nd)
    attrs = dict(pads=[pad] * 2 * nd, strides=[s] * nd, kernel_shape=[k] * nd)
    xc, wc = cp.asarray(x), cp.asarray(w)
    conv = REGISTRY["Conv"].kernel("gpu")
    y = conv(xc, wc, **attrs)
    dy = cp.asarray(rng.standard_normal(y.shape, dtype=np.float32))
    gi = REGISTRY["dfdl.ConvGradInput"].kernel("gpu")
    gw = REGISTRY["dfdl.ConvGradWeight"].kernel("gpu")
    ours = {
        "forward": lambda: conv(xc, wc, **attrs),
        "grad_input": lambda: gi(dy, wc, input_shape=list(x.shape), **attrs),
        "grad_weight": lambda: gw(xc, dy, weight_shape=list(w.shape), **attrs),
    }
    f = {2: torch.nn.functional.conv2d, 3: torch.nn.functional.conv3d}[nd]
    gin = {2: torch.nn.grad.conv2d_input, 3: torch.nn.grad.conv3d_input}[nd]
    gwt = {2: torch.nn.grad.conv2d_weight, 3: torch.nn.grad.conv3d_weight}[nd]
    xt, wt = torch.as_tensor(xc, device="cuda"), torch.as_tensor(wc, device="cuda")
    dyt = torch.as_tensor(dy, device="cuda")
    theirs = {
        "forward": lambda: f(xt, wt, stride=s, padding=pad),
        "grad_input": lambda: gin(xt.shape, wt, dyt, stride=s, padding=pad),
        "grad_weight": lambda: gwt(xt, wt.shape, dyt, stride=s, padding=pad),
    }
    flops = 2 * n * m * c * k**nd * int(np.prod(y.shape[2:]))
    out = {"shape": name, "gflop": flops / 1e9}
    for part in ours:
        a = cp.asnumpy(ours[part]())
        b = theirs[part]().cpu().numpy()
        t_ours, t_torch = _time(ours[part], repeat), _time(theirs[part], repeat)
        out[part] = {
            "dfdl_ms": t_ours * 1e3,
            "torch_ms": t_torch * 1e3,
            "dfdl_over_torch_time": t_ours / t_torch,
            "max_abs_diff": float(np.abs(a - b).max()),
            "max_abs_torch": float(np.abs(b).max()),
        }
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    rows = []
    t0 = time.perf_counter()
    for shape in SHAPES:
        r = bench_shape(shape, args.repeat)
        rows.append(r)
        print(f"{r['shape']:32s} ({r['gflop']:.1f} GFLOP)", flush=True)
        for part in ("forward", "grad_input", "grad_weight"):
            q = r[part]
            print(
                f"  {part:12s} dfdl {q['dfdl_ms']:7.3f} ms  torch {q['torch_ms']:7.3f} ms  "
                f"ratio {q['dfdl_over_torch_time']:5.2f}  max|diff| {q['max_abs_diff']:.2e} "
                f"(max|torch| {q['max_abs_torch']:.2e})",
                flush=True,
            )
    result = {
        "device": torch.cuda.get_device_name(),
        "rows": rows,
        "seconds": time.perf_counter() - t0,
        "command": "python bench/gpu_conv.py",
    }
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
