"""Ctrl-C in ``dfdl.train`` called from Python (a notebook, a script): the
``KeyboardInterrupt`` reaches the caller, and the run's tasks and tiles leave the
cluster although the caller keeps the traceback (as a notebook does in
``sys.last_traceback``); the client stays usable for the next run."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np
import pytest
from distributed import Client

import dfdl
import dfdl.models

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to the process")


def _held(client) -> int:
    """Keys the scheduler holds."""
    return client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))


@pytest.fixture
def default_sigint():
    """Python's own SIGINT handler (KeyboardInterrupt) for the test, whatever an earlier
    import in this process installed."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("default_sigint")
def test_interrupted_train_frees_its_tasks_and_tiles():
    assert threading.current_thread() is threading.main_thread()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((4096, 64), dtype=np.float32)
    y = rng.integers(0, 10, 4096)
    with dfdl.LocalCluster(2, security=False) as cluster, Client(cluster) as client:
        started = threading.Event()
        returned = threading.Event()
        trouble: list[str] = []  # what went wrong in the interrupting thread

        def interrupt():
            try:
                deadline = time.monotonic() + 60
                while _held(client) == 0 and time.monotonic() < deadline:
                    time.sleep(0.05)  # until the run has scattered its tiles
                time.sleep(1.0)  # and runs steps
            except Exception as error:  # noqa: BLE001 - reported by the test below
                trouble.append(f"watching the scheduler raised {error!r}")
            started.set()
            os.kill(os.getpid(), signal.SIGINT)
            # a lost interrupt fails the test instead of training 1000 epochs
            while not returned.wait(60):
                trouble.append("dfdl.train went on 60 s after a SIGINT")
                os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt, daemon=True).start()
        try:
            with pytest.raises(KeyboardInterrupt) as info:
                dfdl.train(
                    dfdl.models.mlp((64, 512, 512, 10)),
                    (X, y),
                    batch_size=64,
                    epochs=1000,
                    client=client,
                    progress=False,
                )
        finally:
            returned.set()
        assert not trouble, trouble
        assert started.is_set(), "training ended before the interrupt"
        kept = info  # the caller keeps the traceback, as a notebook does
        deadline = time.monotonic() + 30
        while (_held(client) or client.futures) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _held(client) == 0, f"{_held(client)} keys of the interrupted run stay"
        assert not client.futures
        assert kept.type is KeyboardInterrupt
        # the same client trains again
        result = dfdl.train(
            dfdl.models.mlp((64, 32, 10)), (X[:256], y[:256]), batch_size=64, client=client,
            progress=False,
        )  # fmt: skip
        assert len(result.history["loss"]) == 4
