"""What a study shows while it runs: trials running, pruned, finished and failed, and
the best value so far, on a tqdm bar (a line per ended trial where stderr is not a
terminal).

Example:
    >>> p = TuneProgress(show=False, total=4, done=0, metric="val_loss", maximize=False)
    >>> p.ended(0, "complete", 0.5); p.best
    0.5
"""

from __future__ import annotations

import sys
import threading

from tqdm.auto import tqdm


class TuneProgress:
    """Counts of a study's trials by state, and its best value, shown as they change."""

    def __init__(self, *, show: bool, total: int, done: int, metric: str, maximize: bool):
        self.counts = {"running": 0, "complete": 0, "pruned": 0, "failed": 0}
        self.best: float | None = None
        self.metric, self.maximize, self.total = metric, maximize, total
        self.show = show
        self._lock = threading.Lock()
        self.bar = None
        if show and sys.stderr.isatty():
            self.bar = tqdm(total=total, initial=done, unit="trial", desc="dfdl.tune")

    def started(self, number: int) -> None:
        """Trial ``number`` started (or restarted)."""
        with self._lock:
            self.counts["running"] += 1
            self._show()

    def ended(self, number: int, state: str, value: float | None) -> None:
        """Trial ``number`` ended in ``state`` with ``value`` (None: failed or pruned)."""
        with self._lock:
            self.counts["running"] = max(0, self.counts["running"] - 1)
            self.counts[state] += 1
            if value is not None and (
                self.best is None or (value > self.best if self.maximize else value < self.best)
            ):
                self.best = value
            if self.bar is not None:
                self.bar.update(1)
            elif self.show:
                print(f"dfdl.tune: trial {number} {state}; {self.line()}", file=sys.stderr)
            self._show()

    def line(self) -> str:
        """The counts and the best value, as one line."""
        c = self.counts
        best = "" if self.best is None else f", best {self.metric} {self.best:.4g}"
        return (
            f"{c['running']} running, {c['complete']} finished, {c['pruned']} pruned, "
            f"{c['failed']} failed{best}"
        )

    def _show(self) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(self.line())

    def close(self) -> None:
        """Close the bar."""
        if self.bar is not None:
            self.bar.close()
