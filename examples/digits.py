"""Train a small CNN on scikit-learn's bundled digits (8x8 images, 10 classes) with dfdl.

    python examples/digits.py [--epochs 12] [--batch 32]

No download: the data ship with scikit-learn. The model is built with onnx.helper (through
dfdl's model-building helpers), trained by ``dfdl.train`` on an embedded local Dask
cluster, saved as ONNX, and its test accuracy is measured with onnxruntime when that is
installed (with dfdl otherwise).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import dfdl
import dfdl.optim
from dfdl.models._build import Builder, float_input


def small_cnn(seed: int = 0):
    """Conv(1->16)-Relu-MaxPool-Conv(16->32)-Relu-MaxPool-Flatten-Gemm(128->10)."""
    b = Builder("digits_cnn", seed, 21)
    y = b.conv("x", "conv1", 1, 16, (3, 3), pad=1, bias=True)
    y = b.op("Relu", [y], "relu1")
    y = b.op("MaxPool", [y], "pool1", kernel_shape=[2, 2], strides=[2, 2])
    y = b.conv(y, "conv2", 16, 32, (3, 3), pad=1, bias=True)
    y = b.op("Relu", [y], "relu2")
    y = b.op("MaxPool", [y], "pool2", kernel_shape=[2, 2], strides=[2, 2])
    y = b.op("Flatten", [y], "flatten", axis=1)
    y = b.gemm(y, "fc", 32 * 2 * 2, 10)
    b.rename(y, "logits")
    return b.model([float_input("x", ["batch", 1, 8, 8])], [float_input("logits", ["batch", 10])])


def main() -> None:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()

    digits = load_digits()
    X = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.2, random_state=0, stratify=y
    )
    t0 = time.perf_counter()
    result = dfdl.train(
        small_cnn(),
        data=(X_train, y_train),
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=args.lr, momentum=0.9),
        batch_size=args.batch,
        epochs=args.epochs,
        seed=0,
    )
    dt = time.perf_counter() - t0
    losses = result.history["loss"]
    print(f"trained {len(losses)} steps in {dt:.1f} s; loss {losses[0]:.3f} -> {losses[-1]:.3f}")

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "digits-cnn.onnx"
        result.save(path)
        try:
            import onnxruntime as ort

            logits = ort.InferenceSession(str(path)).run(None, {"x": X_test})[0]
            engine = "onnxruntime"
        except ImportError:
            logits = dfdl.run(path, {"x": X_test})["logits"]
            engine = "dfdl"
    accuracy = float((logits.argmax(axis=1) == y_test).mean())
    print(f"test accuracy ({engine} on the saved model): {accuracy:.4f} on {len(y_test)} images")


if __name__ == "__main__":
    main()
