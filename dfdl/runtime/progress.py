"""What a training run shows while it runs: a progress bar and every step's loss.

:class:`Progress` keeps the losses of a run by step as they arrive, sends them to the
dashboard page (:class:`dfdl.runtime.monitor.Reporter`), and shows them on a tqdm bar
(steps, loss, samples/s, bytes spilled) when asked to and stderr is a terminal; a
rollback moves the bar back. :class:`Throughput` counts samples per second. Showing
progress never changes a loss or a step.

Example:
    >>> t = Throughput()
    >>> t.add(64) > 0
    True
"""

from __future__ import annotations

import sys
import time

from dask.utils import format_bytes
from tqdm.auto import tqdm

from dfdl.runtime.monitor import Reporter


class Throughput:
    """Samples per second since the start, for the progress bar."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.samples = 0

    def add(self, n: int) -> float:
        """Count ``n`` more samples; the rate so far."""
        self.samples += n
        return self.samples / max(time.perf_counter() - self.t0, 1e-9)


class Progress:
    """The losses of a run as they arrive: kept by step, sent to the dashboard, and shown
    on a tqdm bar (steps, loss, samples/s, bytes spilled) when ``show`` and stderr is a
    terminal.

    Example:
        >>> p = Progress(reporter, show=True, total=100, start=0, batch_size=64)  # doctest: +SKIP
        >>> p.loss(0, 2.31, spilled=0)                                            # doctest: +SKIP
    """

    def __init__(self, reporter: Reporter, *, show: bool, total: int, start: int, batch_size: int):
        self.reporter = reporter
        self.batch_size = batch_size
        self.losses: dict[int, float] = {}
        self.speed = Throughput()
        self.bar = None
        if show and sys.stderr.isatty():
            self.bar = tqdm(total=total, initial=start, unit="step", desc="dfdl.train")

    def loss(self, step: int, value: float, spilled: int) -> None:
        """Step ``step`` ended with loss ``value``; ``spilled``: bytes spilled so far."""
        self.losses[step] = value
        self.reporter.step(step, value)
        if self.bar is not None:
            self.bar.update(1)
            shown = {"loss": f"{value:.4g}", "samples_s": f"{self.speed.add(self.batch_size):.0f}"}
            if spilled:
                shown["spilled"] = format_bytes(spilled)
            self.bar.set_postfix(shown)

    def rollback(self, step: int) -> None:
        """Training goes back to ``step`` (a lost worker's data is replayed)."""
        self.reporter.rollback(step)
        if self.bar is not None:
            self.bar.n = step
            self.bar.refresh()

    def close(self) -> None:
        """Close the bar."""
        if self.bar is not None:
            self.bar.close()
