"""The order in which trials report to the pruner: the same whatever the concurrency.

A pruner decides on a trial by comparing its value at a rung (an epoch) with the values
other trials reported there. With trials running at once, which of them reported first
depends on timing; :class:`RungGate` removes that: trial ``t`` reports epoch ``e`` only
once every lower-numbered trial of its wave has decided epoch ``e`` or ended. So the
decision on ``t`` at ``e`` sees the earlier waves and exactly the lower trials of its
wave, as when the trials run one after another. A trial only ever waits for trials that
started before it, which never wait for it: no deadlock at any concurrency.

Example:
    >>> gate = RungGate([0, 1])
    >>> with gate.turn(0, 1):
    ...     pass
    >>> gate.decided[0]
    1
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager


class RungGate:
    """Lets the trials of one wave report each epoch in the order of their numbers.

    Args:
        numbers: the wave's trial numbers.
        decided: epochs already decided per trial (a resumed study's), default none.
    """

    def __init__(self, numbers: Iterable[int], decided: Mapping[int, int] | None = None):
        self.numbers = sorted(numbers)
        self.decided = {n: int((decided or {}).get(n, 0)) for n in self.numbers}
        self.ended: set[int] = set()
        self._cond = threading.Condition()

    def _ready(self, number: int, epoch: int) -> bool:
        return all(m in self.ended or self.decided[m] >= epoch for m in self.numbers if m < number)

    @contextmanager
    def turn(self, number: int, epoch: int) -> Iterator[None]:
        """Wait until the lower trials have decided ``epoch`` (or ended); the block then
        reports and decides trial ``number``'s ``epoch``."""
        with self._cond:
            self._cond.wait_for(lambda: self._ready(number, epoch))
        try:
            yield
        finally:
            with self._cond:
                self.decided[number] = max(self.decided[number], epoch)
                self._cond.notify_all()

    def end(self, number: int) -> None:
        """Trial ``number`` ended (finished, pruned or failed): no one waits for it."""
        with self._cond:
            self.ended.add(number)
            self._cond.notify_all()
