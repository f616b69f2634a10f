"""Benchmark: dfdl.tune against the same configurations trained one after another.

    python bench/tune_digits.py [--trials 24] [--epochs 20] [--concurrency N] [--json out.json]

Tunes examples/digits.py's CNN as examples/tune_digits.py does (SGD's learning rate,
momentum and weight decay and the batch size; ASHA; the embedded cluster, started before
either clock starts) and retrains the best configuration on all the training images;
then trains every configuration the study tried, one after another, to the last epoch
with ``dfdl.train`` (the trial's seed: the same losses, as far as the trial went), in the
same process. Prints and writes: both wall times (the tuning side with its retraining)
and their ratio (issue 42's target: at most 0.5), the retrained best's test accuracy in
onnxruntime (target: at least 0.985) and the best trial's own, the trials by state, and
whether each trial's losses equal the start of its sequential run's, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--concurrency", type=int, default=None, help="default: dfdl.tune's")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()

    from digits import small_cnn
    from tune_digits import SPACE, digits_splits, retrain, test_accuracy

    import dfdl
    from dfdl.runtime.cluster import embedded_client, total_threads

    train, val, test = digits_splits()
    client = embedded_client()  # started before either clock
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        result = dfdl.tune(
            small_cnn(), data=train, validation=val, space=SPACE, trials=args.trials,
            epochs=args.epochs, pruner="asha", storage=f"sqlite:///{tmp}/study.db",
            trials_dir=f"{tmp}/trials", progress=False, concurrency=args.concurrency,
        )  # fmt: skip
        search_s = time.perf_counter() - t0
        model = retrain(result.best_params, train, val, args.epochs)
        tune_s = time.perf_counter() - t0
    accuracy, engine = test_accuracy(model, test)
    trial_accuracy = test_accuracy(result.model, test)[0]
    print(f"dfdl.tune: {len(result.trials)} trials in {search_s:.1f} s, {result.counts()}")
    print(
        f"best trial {result.best_trial} {result.best_params}: test accuracy {trial_accuracy:.4f}"
    )
    print(f"retrained on all training images: test accuracy ({engine}) {accuracy:.4f}")

    rows, same = [], 0
    t0 = time.perf_counter()
    for t in result.trials:
        p = t.params
        full = dfdl.train(
            small_cnn(), data=train, validation=val, epochs=args.epochs, seed=t.seed,
            batch_size=p["batch_size"], progress=False,
            optimizer=dfdl.optim.SGD(lr=p["lr"], momentum=p["momentum"],
                                     weight_decay=p["weight_decay"]),
        )  # fmt: skip
        losses = full.history["loss"]
        equal = losses[: len(t.history["loss"])] == t.history["loss"]
        same += equal
        rows.append(
            {
                "trial": t.number,
                "state": t.state,
                "params": p,
                "epochs_tuned": len(t.history.get("val_loss", [])),
                "val_loss_tuned": t.value,
                "val_loss_full": full.history["val_loss"][-1],
                "test_accuracy_full": test_accuracy(full.model, test)[0],
                "losses_equal_prefix": equal,
            }
        )
    sequential_s = time.perf_counter() - t0
    ratio = tune_s / sequential_s
    best_full = max(r["test_accuracy_full"] for r in rows)
    print(f"sequential: {len(rows)} configurations to epoch {args.epochs} in {sequential_s:.1f} s")
    print(f"wall time ratio tune / sequential: {ratio:.3f} (target <= 0.5)")
    print(f"test accuracy of the retrained best: {accuracy:.4f} (target >= 0.985); best of the "
          f"sequential runs (four fifths): {best_full:.4f}")  # fmt: skip
    print(f"trials whose losses equal their sequential run's start: {same}/{len(rows)}")
    figures = {
        "benchmark": "tune_digits",
        "trials": args.trials,
        "epochs": args.epochs,
        "pruner": "asha",
        "concurrency": args.concurrency or "auto",
        "cores": os.cpu_count(),
        "threads": total_threads(client),
        "load_before": load0,
        "load_after": os.getloadavg()[0],
        "search_s": round(search_s, 1),
        "tune_s": round(tune_s, 1),
        "sequential_s": round(sequential_s, 1),
        "ratio": round(ratio, 3),
        "test_accuracy": accuracy,
        "test_engine": engine,
        "best_trial_test_accuracy": trial_accuracy,
        "best_trial": result.best_trial,
        "best_params": result.best_params,
        "best_val_loss": result.best_value,
        "counts": result.counts(),
        "sequential_best_test_accuracy": best_full,
        "losses_equal_prefix": same,
        "rows": rows,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
