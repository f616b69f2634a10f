"""Trials report each epoch in the order of their numbers, whatever the threads do."""

from __future__ import annotations

import random
import threading
import time

from dfdl.tuning.order import RungGate


def test_reports_follow_trial_numbers_at_every_epoch():
    numbers, epochs = [3, 4, 5, 6], 3
    gate = RungGate(numbers)
    order: list[tuple[int, int]] = []
    rng = random.Random(0)
    delays = {(n, e): rng.random() * 0.01 for n in numbers for e in range(1, epochs + 1)}

    def trial(n: int) -> None:
        last = 1 if n == 4 else epochs  # trial 4 ends (is pruned) after epoch 1
        for e in range(1, last + 1):
            time.sleep(delays[n, e])
            with gate.turn(n, e):
                order.append((n, e))
        gate.end(n)

    threads = [threading.Thread(target=trial, args=(n,)) for n in reversed(numbers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    for e in range(1, epochs + 1):
        assert [n for n, k in order if k == e] == [n for n in numbers if e == 1 or n != 4]


def test_a_resumed_trial_that_decided_an_epoch_does_not_hold_the_others():
    gate = RungGate([0, 1], decided={0: 2})
    done = threading.Event()

    def later():
        with gate.turn(1, 2):
            done.set()

    t = threading.Thread(target=later)
    t.start()
    t.join(5)
    assert done.is_set()
