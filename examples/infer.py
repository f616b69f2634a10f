"""Run a ResNet-style CNN from dfdl's model zoo on the embedded Dask cluster.

    python examples/infer.py [--batch 64] [--tiles uneven]

Builds the model as an ONNX file, runs inference with ``dfdl.run`` (which starts a local
Dask cluster with one worker process per core and shuts it down afterwards), prints the
plan, the time taken and, when onnxruntime is installed, the largest difference from it.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

import dfdl
import dfdl.models


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tiles", default=None, help="'uneven', or omit for automatic")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resnet.onnx"
        onnx.save(dfdl.models.resnet(stem=32, stages=(32, 64, 128)), path)
        x = np.random.default_rng(0).standard_normal((args.batch, 3, 32, 32), dtype=np.float32)

        plan = dfdl.plan(path, batch_size=args.batch, tiles=args.tiles)
        print(plan.summary().splitlines()[0])
        print(plan.summary().splitlines()[1])

        t0 = time.perf_counter()
        out = dfdl.run(path, {"x": x}, tiles=args.tiles)["logits"]
        dt = time.perf_counter() - t0
        print(f"dfdl.run: logits {out.shape} in {dt:.2f} s (including cluster start-up)")
        print("predicted classes of the first 8 images:", out[:8].argmax(axis=1).tolist())

        try:
            import onnxruntime as ort
        except ImportError:
            return
        ref = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
        err = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
        print(f"largest difference from onnxruntime: {err:.2e} (relative to max |logit|)")
        if err > 1e-4:
            raise SystemExit("dfdl and onnxruntime disagree")


if __name__ == "__main__":
    main()
