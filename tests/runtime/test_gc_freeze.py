"""Frozen heaps while training (``dfdl.runtime.gc_freeze``): every process's objects
leave the garbage collector's walks for the run, and come back after it."""

from __future__ import annotations

import contextlib
import gc
import sys

from dfdl.runtime import gc_freeze
from tests.runtime.test_trainer import train_tiny_mlp


def _counts(client) -> tuple[int, list[int], int]:
    """Frozen objects here, on each worker and on the scheduler."""
    workers = sorted(client.run(gc.get_freeze_count).values())
    return gc.get_freeze_count(), workers, client.run_on_scheduler(gc.get_freeze_count)


def test_freeze_moves_every_live_object_to_the_permanent_generation():
    alive = [[i] for i in range(1000)]
    try:
        gc_freeze.freeze()
        assert gc.get_freeze_count() >= len(alive)
    finally:
        gc_freeze.unfreeze()
    assert gc.get_freeze_count() == 0


def test_frozen_heaps_freeze_this_process_the_workers_and_the_scheduler(client):
    assert _counts(client) == (0, [0, 0], 0)
    with gc_freeze.frozen_heaps(client):
        here, workers, scheduler = _counts(client)
        assert here > 0 and all(n > 0 for n in workers) and scheduler > 0
    assert _counts(client) == (0, [0, 0], 0)


def test_no_freeze_when_switched_off(client):
    with gc_freeze.frozen_heaps(client, enabled=False):
        assert _counts(client) == (0, [0, 0], 0)


def test_an_unreachable_process_does_not_stop_training(client):
    class Unreachable:
        def run(self, *args, **kwargs):
            raise OSError("connection closed")

        run_on_scheduler = run

    with gc_freeze.frozen_heaps(Unreachable()):
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_train_runs_with_frozen_heaps_and_unfreezes_them(client, monkeypatch):
    seen = []
    real = gc_freeze.frozen_heaps

    @contextlib.contextmanager
    def watched(c, enabled=True, owned=False):
        with real(c, enabled, owned=owned):
            seen.append(_counts(c))
            yield

    monkeypatch.setattr(sys.modules["dfdl.runtime.session"], "frozen_heaps", watched)
    result = train_tiny_mlp(client)
    assert len(result.history["loss"]) == 2
    ((here, workers, scheduler),) = seen
    assert here > 0 and all(n > 0 for n in workers) and scheduler > 0
    assert _counts(client) == (0, [0, 0], 0)
