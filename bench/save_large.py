"""Save a model past protobuf's 2 GiB limit with :func:`dfdl.runtime.output.save_model`,
then load it in onnxruntime (and in dfdl) and run it.

The model is a chain of float32 Gemms of width 16384 (one GiB per full layer) holding
``--gib`` GiB of weights in all. ``save_model`` writes it with its initializers in one
external data file beside it (``big.onnx.data``); ``onnx.save`` of the same model fails
(``--onnx-save`` shows how). The Gemms' output for one random row is computed with numpy
while the model is built, and compared with onnxruntime's.

Needs about 2.5x ``--gib`` of memory at its peak (the model, one layer's bytes copied
while it is written, onnxruntime's copy of the weights) and ``--gib`` of disk.

Example:
    python bench/save_large.py --gib 2.5
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import shutil
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from dfdl.ir.onnx_io import tensor_bytes
from dfdl.plan.estimate import format_bytes
from dfdl.runtime.output import save_model

WIDTH = 16384


def build(
    gib: float, seed: int = 0, batch: int | str = 1
) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """The Gemm chain of ``gib`` GiB of weights (input ``(batch, WIDTH)``; a name makes
    the batch axis symbolic), one input row and numpy's float32 output for it (each
    layer's weights live as a numpy array only while it is added)."""
    rng = np.random.default_rng(seed)
    per_layer = WIDTH * WIDTH * 4
    widths = [WIDTH] * math.floor(gib * 2**30 / per_layer)
    rest = int(gib * 2**30 - len(widths) * per_layer) // (WIDTH * 4)
    if rest:
        widths.append(rest)
    names = ["x", *(f"h{i}" for i in range(len(widths) - 1)), "y"]
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", [names[i], f"w{i}"], [names[i + 1]], name=f"gemm{i}")
            for i in range(len(widths))
        ],
        "big",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [batch, WIDTH])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [batch, widths[-1]])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    x = rng.standard_normal((1, WIDTH), dtype=np.float32)
    h = x
    for i, out in enumerate(widths):
        w = rng.standard_normal((WIDTH, out), dtype=np.float32)
        w *= np.float32(1 / math.sqrt(WIDTH))
        h = h @ w
        t = model.graph.initializer.add(name=f"w{i}", data_type=onnx.TensorProto.FLOAT)
        t.dims.extend(w.shape)
        t.raw_data = w.tobytes()
        del w
    return model, x, h


def peak_rss() -> str:
    return format_bytes(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=2.5, help="GiB of weights (default 2.5)")
    p.add_argument("--dir", help="where to write (default: a new temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the files written")
    p.add_argument("--onnx-save", action="store_true", help="also try onnx.save")
    p.add_argument("--no-dfdl-load", action="store_true", help="skip dfdl's load_model")
    p.add_argument(
        "--threshold-gib",
        type=float,
        help="external data above this many GiB (default: save_model's, 1.8)",
    )
    args = p.parse_args()
    folder = args.dir or tempfile.mkdtemp(prefix="dfdl-save-large-")
    path = os.path.join(folder, "big.onnx")
    try:
        t = time.perf_counter()
        model, x, expected = build(args.gib)
        print(
            f"built: {len(model.graph.node)} Gemms, {format_bytes(tensor_bytes(model))} of "
            f"weights in {time.perf_counter() - t:.1f} s (peak RSS {peak_rss()})"
        )
        if args.onnx_save:
            t = time.perf_counter()
            try:
                onnx.save(model, os.path.join(folder, "plain.onnx"))
                print("onnx.save: wrote it")
            except Exception as e:
                print(f"onnx.save: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
            print(f"  ({time.perf_counter() - t:.1f} s, peak RSS {peak_rss()})")
            with_plain = os.path.join(folder, "plain.onnx")
            if os.path.exists(with_plain):
                os.unlink(with_plain)
        t = time.perf_counter()
        kwargs = {}
        if args.threshold_gib is not None:
            kwargs["external_threshold"] = int(args.threshold_gib * 2**30)
        files = save_model(model, path, **kwargs)
        print(
            f"save_model: {time.perf_counter() - t:.1f} s, "
            + ", ".join(f"{f.name} {format_bytes(os.path.getsize(f))}" for f in files)
            + f" (peak RSS {peak_rss()})"
        )
        del model
        if not args.no_dfdl_load:
            from dfdl.ir.onnx_io import load_model

            t = time.perf_counter()
            loaded = load_model(path)
            print(
                f"dfdl load_model: {time.perf_counter() - t:.1f} s, "
                f"{format_bytes(tensor_bytes(loaded))} of tensors (peak RSS {peak_rss()})"
            )
            del loaded
        options = ort.SessionOptions()
        options.add_session_config_entry("session.disable_prepacking", "1")
        t = time.perf_counter()
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        load_s = time.perf_counter() - t
        t = time.perf_counter()
        (y,) = session.run(None, {"x": x})
        run_s = time.perf_counter() - t
        err = float(np.max(np.abs(y - expected)))
        scale = float(np.max(np.abs(expected)))
        print(
            f"onnxruntime {ort.__version__}: loaded in {load_s:.1f} s, ran in {run_s:.2f} s; "
            f"output {y.shape}, max |ort - numpy| {err:.3g} (max |y| {scale:.3g}) "
            f"(peak RSS {peak_rss()})"
        )
        if not err <= 1e-4 * max(scale, 1.0):
            raise SystemExit("onnxruntime's output differs from numpy's")
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
