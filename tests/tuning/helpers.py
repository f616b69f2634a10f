"""The small study the dfdl.tune tests share: an MLP on 64 separable samples, 6 trials
of 3 epochs in waves of 3, on a given cluster; also run by a killed subprocess."""

from __future__ import annotations

import sys

import numpy as np

import dfdl
import dfdl.models
from dfdl.space import choice, loguniform, uniform

SIZES = (8, 16, 3)
TRIALS, WAVE, EPOCHS = 6, 3, 3


def data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, SIZES[0])).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0.5)
    return X, y


SPACE = {
    "lr": loguniform(0.01, 1.0),
    "momentum": uniform(0.0, 0.9),
    "batch_size": choice([8, 16]),
}


def study(client, storage: str, trials_dir, concurrency: int, **kw) -> dfdl.TuneResult:
    """Run (or with ``resume=True`` finish) the shared study on ``client``."""
    return dfdl.tune(
        dfdl.models.mlp(SIZES, seed=1),
        data=data(64, 0),
        validation=data(32, 1),
        space=SPACE,
        trials=TRIALS,
        wave=WAVE,
        epochs=EPOCHS,
        concurrency=concurrency,
        storage=storage,
        trials_dir=trials_dir,
        client=client,
        progress=False,
        **kw,
    )


if __name__ == "__main__":  # python -m tests.tuning.helpers ADDRESS STORAGE TRIALS_DIR
    from distributed import Client

    with Client(sys.argv[1]) as c:
        study(c, sys.argv[2], sys.argv[3], concurrency=2)
