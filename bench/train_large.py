"""Train a model past protobuf's 2 GiB limit on the embedded cluster, save it with its
weights in external data, and run the saved model in onnxruntime.

The model is :func:`save_large.build`'s chain of float32 Gemms (``--gib`` GiB of
weights, a symbolic batch axis), trained with plain SGD and the mean squared error on
random data in order (``shuffle=False``). Every figure is checked against numpy in
float64 arithmetic on the same weights: the loss of each step, and the trained weights (one SGD
step per batch, computed layer by layer, the backward as outer products). The saved
model's output in onnxruntime is compared with numpy's forward on the trained weights.

Needs about 4x ``--gib`` of memory at its peak (the model, the workers' weights and
their update, the gathered result, numpy's reference weights) and ``--gib`` of disk.

With ``--weights-dir`` the model is written to a file with external data by a child
process, and trained from that file with ``dfdl.train(..., weights_dir=...)`` on a
``dfdl.LocalCluster`` of ``--workers`` workers with ``--worker-memory`` each (small
enough to make them spill): the workers read the weights from the file and write the
trained ones, so this process (the client, and the local cluster's scheduler) should
never hold them. Its peak resident memory is the figure (``client_peak_rss_bytes``);
the numpy reference and onnxruntime's check run in another child process afterwards.
Needs 3x ``--gib`` of disk beside the workers' spill.

Example:
    python bench/train_large.py --gib 2.5 --json large.json
    python bench/train_large.py --gib 4 --weights-dir --worker-memory 3GiB --json w.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from save_large import WIDTH, build, peak_rss  # noqa: E402

import dfdl  # noqa: E402
from dfdl.ir.onnx_io import tensor_bytes  # noqa: E402
from dfdl.plan.estimate import format_bytes  # noqa: E402
from dfdl.runtime.output import save_model  # noqa: E402


def weights(model: onnx.ModelProto) -> list[np.ndarray]:
    """The Gemms' weights, in order (copies)."""
    by_name = {t.name: t for t in model.graph.initializer}
    return [numpy_helper.to_array(by_name[f"w{i}"]).copy() for i in range(len(model.graph.node))]


def saved_weights(path: str) -> dict[str, np.ndarray]:
    """The initializers of the saved model at ``path``; those in its external data file
    are mapped from it (read-only, not loaded)."""
    model = onnx.load(path, load_external_data=False)
    out = {}
    for t in model.graph.initializer:
        where = {e.key: e.value for e in t.external_data}
        if not where:  # small enough to be inside the model
            out[t.name] = numpy_helper.to_array(t)
            continue
        assert t.data_type == onnx.TensorProto.FLOAT, t.name
        out[t.name] = np.memmap(
            os.path.join(os.path.dirname(path), where["location"]),
            dtype=np.float32,
            mode="r",
            offset=int(where.get("offset", 0)),
            shape=tuple(t.dims),
        )
    return out


def reference(
    ws: list[np.ndarray], X: np.ndarray, Y: np.ndarray, batch: int, lr: float
) -> list[float]:
    """The losses of SGD on ``X``, ``Y`` in order, updating the float32 ``ws`` in place;
    activations, gradients and each update are float64, rounded once into the weights."""
    losses = []
    for b0 in range(0, len(X), batch):
        hs = [X[b0 : b0 + batch].astype(np.float64)]
        for w in ws:
            hs.append(hs[-1] @ w)
        d = hs[-1] - Y[b0 : b0 + batch]
        losses.append(float(np.mean(d * d)))
        g = 2.0 * d / d.size
        for i in range(len(ws) - 1, -1, -1):
            g_in = g @ ws[i].T if i else None
            for r0 in range(0, ws[i].shape[0], 1024):  # the outer product a slab at a time
                rows = slice(r0, r0 + 1024)
                ws[i][rows] = ws[i][rows] - lr * (hs[i][:, rows].T @ g)
            g = g_in
    return losses


def _write_model(gib: float, path: str) -> int:
    """Build the chain and save it with external data (in a child process, so that the
    parent never holds the weights); its bytes of weights."""
    model, _, _ = build(gib, batch="N")
    size = tensor_bytes(model)
    save_model(model, path, external_threshold=0)
    return size


def _check(model_path: str, trained: dict, saved_path: str, X, Y, batch: int, lr: float):
    """numpy's float64 reference from the model file's initial weights, against the
    trained weights (``.npy`` files) and the saved model in onnxruntime (a child
    process: it holds the weights)."""
    initial = saved_weights(model_path)
    ws = [np.array(initial[f"w{i}"]) for i in range(len(initial))]
    del initial
    want = reference(ws, X, Y, batch, lr)
    w_err = max(
        float(np.max(np.abs(np.load(trained[f"w{i}"], mmap_mode="r") - w)) / np.max(np.abs(w)))
        for i, w in enumerate(ws)
    )
    saved = saved_weights(saved_path)
    moved = max(
        float(np.max(np.abs(np.load(trained[k], mmap_mode="r") - v))) for k, v in saved.items()
    )
    del saved
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_prepacking", "1")
    session = ort.InferenceSession(saved_path, options, providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": X[:2]})
    h = X[:2].astype(np.float64)
    for w in ws:
        h = h @ w
    ort_err = float(np.max(np.abs(y - h)) / np.max(np.abs(h)))
    return {
        "reference_losses": want,
        "weight_rel_err": w_err,
        "saved_vs_result": moved,
        "ort_rel_err": ort_err,
        "check_peak_rss": peak_rss(),
    }


def on_workers(args, folder: str, figures: dict) -> bool:
    """``--weights-dir``: train from the file, the weights never in this process."""
    import multiprocessing

    from distributed import Client

    spawn = multiprocessing.get_context("spawn")
    model_path = os.path.join(folder, "model.onnx")
    t = time.perf_counter()
    with spawn.Pool(1) as pool:
        figures["weights_bytes"] = pool.apply(_write_model, (args.gib, model_path))
    print(f"model written by a child process in {time.perf_counter() - t:.1f} s: {model_path}")
    n_out = onnx.load(model_path, load_external_data=False).graph.output[0]
    n_out = n_out.type.tensor_type.shape.dim[1].dim_value
    X, Y = _data(args.samples, n_out)
    figures["client_rss_before_bytes"] = _rss_bytes()
    with (
        dfdl.LocalCluster(args.workers, memory_limit=args.worker_memory) as cluster,
        Client(cluster) as client,
    ):
        t = time.perf_counter()
        result = _train(
            model_path, X, Y, args, client=client, weights_dir=os.path.join(folder, "weights")
        )
        figures["train_s"] = time.perf_counter() - t
        figures["client_peak_after_train_bytes"] = _peak_bytes()
        t = time.perf_counter()
        saved_path = os.path.join(folder, "trained.onnx")
        files = result.save(saved_path)
        figures["save_s"] = time.perf_counter() - t
    figures["client_peak_rss_bytes"] = _peak_bytes()
    losses = [float(v) for v in result.history["loss"]]
    figures.update(
        losses=losses,
        spilled_bytes=int(sum(result.history["spilled_bytes"])),
        files={f.name: os.path.getsize(f) for f in files},
        worker_memory=args.worker_memory,
        workers=args.workers,
    )
    print(
        f"dfdl.train (weights_dir): {figures['train_s']:.1f} s, losses {losses}; workers "
        f"spilled {format_bytes(figures['spilled_bytes'])}; result.save "
        f"{figures['save_s']:.1f} s; client peak RSS "
        f"{format_bytes(figures['client_peak_rss_bytes'])}"
        f" for {format_bytes(figures['weights_bytes'])} of weights"
    )
    trained = {k: v.filename for k, v in result.params.items() if isinstance(v, np.memmap)}
    del result
    t = time.perf_counter()
    with spawn.Pool(1) as pool:
        check = pool.apply(
            _check, (model_path, trained, saved_path, X, Y, args.batch_size, args.lr)
        )
    figures["reference_s"] = time.perf_counter() - t
    figures.update(check)
    want = check["reference_losses"]
    figures["loss_rel_err"] = max(abs(a - b) / abs(b) for a, b in zip(losses, want, strict=True))
    print(
        f"numpy reference (child process, {figures['reference_s']:.0f} s): losses {want}; "
        f"largest relative loss error {figures['loss_rel_err']:.2e}, weight error "
        f"{check['weight_rel_err']:.2e}; saved vs trained {check['saved_vs_result']}; "
        f"onnxruntime {check['ort_rel_err']:.2e}"
    )
    return (
        figures["loss_rel_err"] < 1e-4
        and check["weight_rel_err"] < 1e-5
        and check["ort_rel_err"] < 1e-4
        and check["saved_vs_result"] == 0.0
        and figures["client_peak_rss_bytes"] <= 2**30
    )


def _data(samples: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    X = rng.standard_normal((samples, WIDTH), dtype=np.float32)
    return X, rng.standard_normal((samples, n_out), dtype=np.float32)


def _train(model, X, Y, args, **kw) -> dfdl.TrainResult:
    """Plain SGD on the MSE over the samples in order, one epoch."""
    return dfdl.train(
        model,
        (X, Y),
        loss="mse",
        optimizer=dfdl.optim.SGD(lr=args.lr),
        batch_size=args.batch_size,
        epochs=1,
        shuffle=False,
        progress=False,
        **kw,
    )


def _finish(figures: dict, ok: bool, path: str | None, failure: str) -> None:
    """Write the figures (with ``ok``) to ``path``, then fail with ``failure`` if not ok."""
    figures["ok"] = ok
    if path:
        with open(path, "w") as f:
            json.dump(figures, f, indent=1)
    if not ok:
        raise SystemExit(failure)


def _peak_bytes() -> int:
    """This process's peak resident memory (``VmHWM``: ``ru_maxrss`` would also count the
    memory of the process that started this one, which Linux carries across ``exec``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=2.5, help="GiB of weights (default 2.5)")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--json", help="write the figures here")
    p.add_argument(
        "--weights-dir",
        action="store_true",
        help="train from the file with weights_dir: the weights never in this process",
    )
    p.add_argument("--workers", type=int, default=2, help="with --weights-dir (default 2)")
    p.add_argument("--worker-memory", default="3GiB", help="each worker's limit with --weights-dir")
    args = p.parse_args()
    if args.weights_dir:
        folder = tempfile.mkdtemp(prefix="dfdl-train-large-")
        figures = {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "gib": args.gib,
            "mode": "weights_dir",
        }
        try:
            began = time.perf_counter()
            ok = on_workers(args, folder, figures)
            figures["total_s"] = time.perf_counter() - began
            _finish(figures, ok, args.json, "training, saving, memory or onnxruntime off the mark")
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    folder = tempfile.mkdtemp(prefix="dfdl-train-large-")
    figures: dict = {"machine": platform.machine(), "cpus": os.cpu_count(), "gib": args.gib}
    try:
        began = t = time.perf_counter()
        model, _, _ = build(args.gib, batch="N")
        n_out = model.graph.output[0].type.tensor_type.shape.dim[1].dim_value
        figures["weights_bytes"] = tensor_bytes(model)
        X, Y = _data(args.samples, n_out)
        print(
            f"built: {len(model.graph.node)} Gemms, {format_bytes(tensor_bytes(model))} of "
            f"weights in {time.perf_counter() - t:.1f} s"
        )
        t = time.perf_counter()
        result = _train(model, X, Y, args)
        figures["train_s"] = time.perf_counter() - t
        losses = [float(v) for v in result.history["loss"]]
        print(f"dfdl.train: {figures['train_s']:.1f} s, losses {losses} (peak {peak_rss()})")

        t = time.perf_counter()
        path = os.path.join(folder, "trained.onnx")
        files = result.save(path)
        figures["save_s"] = time.perf_counter() - t
        figures["files"] = {f.name: os.path.getsize(f) for f in files}
        print(
            f"result.save: {figures['save_s']:.1f} s, "
            + ", ".join(f"{f.name} {format_bytes(os.path.getsize(f))}" for f in files)
        )

        t = time.perf_counter()
        ws = weights(model)
        del model
        want = reference(ws, X, Y, args.batch_size, args.lr)
        figures["reference_s"] = time.perf_counter() - t
        loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, want, strict=True))
        w_err = max(
            float(np.max(np.abs(result.params[f"w{i}"] - w)) / np.max(np.abs(w)))
            for i, w in enumerate(ws)
        )
        saved = saved_weights(path)
        moved = max(float(np.max(np.abs(result.params[k] - v))) for k, v in saved.items())
        del saved, result
        print(
            f"numpy reference: losses {want}; largest relative loss error {loss_err:.2e}, "
            f"largest weight error {w_err:.2e} (of max |w|); saved vs trained weights {moved}"
        )
        figures.update(
            losses=losses, reference_losses=want, loss_rel_err=loss_err, weight_rel_err=w_err
        )

        options = ort.SessionOptions()
        options.add_session_config_entry("session.disable_prepacking", "1")
        t = time.perf_counter()
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        (y,) = session.run(None, {"x": X[:2]})
        figures["ort_s"] = time.perf_counter() - t
        h = X[:2].astype(np.float64)
        for w in ws:
            h = h @ w
        ort_err = float(np.max(np.abs(y - h)) / np.max(np.abs(h)))
        figures.update(ort_rel_err=ort_err, saved_vs_result=moved, peak_rss=peak_rss())
        figures["total_s"] = time.perf_counter() - began
        print(
            f"onnxruntime {ort.__version__} ran the saved model in {figures['ort_s']:.1f} s: "
            f"max |ort - numpy| / max |y| {ort_err:.2e}; peak RSS {peak_rss()}; "
            f"{figures['total_s']:.0f} s in all"
        )
        ok = loss_err < 1e-4 and w_err < 1e-5 and ort_err < 1e-4 and moved == 0.0
        _finish(figures, ok, args.json, "training, saving or onnxruntime disagrees with numpy")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
