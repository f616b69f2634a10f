"""What a training run shows while it runs: a progress bar and every step's loss.

:class:`Progress` keeps the losses of a run by step as they arrive, sends them to the
dashboard page (:class:`dfdl.runtime.monitor.Reporter`), and shows them on a tqdm bar
(steps, loss, samples/s, bytes spilled) when asked to and stderr is a terminal; a
rollback moves the bar back. When stderr is not a terminal (a SLURM job's log, a file, a
notebook) it writes the same figures as one line every :data:`LOG_EVERY_S` seconds
instead, so a long run's log shows it alive. :class:`Throughput` counts samples per
second. Showing progress never changes a loss or a step.

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

#: seconds between two progress lines when stderr is not a terminal
LOG_EVERY_S = 30.0


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
    terminal, else (with ``show``) as a line on stderr every :data:`LOG_EVERY_S` seconds.

    Example:
        >>> p = Progress(reporter, show=True, total=100, start=0, batch_size=64)  # doctest: +SKIP
        >>> p.loss(0, 2.31, spilled=0)                                            # doctest: +SKIP
    """

    def __init__(self, reporter: Reporter, *, show: bool, total: int, start: int, batch_size: int):
        self.reporter = reporter
        self.batch_size = batch_size
        self.losses: dict[int, float] = {}
        self.speed = Throughput()
        self.total = total
        self.bar = None
        self.next_line = None  # when the next progress line is due (not a terminal)
        if show and sys.stderr.isatty():
            self.bar = tqdm(total=total, initial=start, unit="step", desc="dfdl.train")
        elif show:
            self.next_line = time.monotonic() + LOG_EVERY_S

    def loss(self, step: int, value: float, spilled: int, device_spilled: int = 0) -> None:
        """Step ``step`` ended with loss ``value``; ``spilled``: bytes spilled to disk so
        far; ``device_spilled``: bytes moved off GPU workers' devices so far."""
        self.losses[step] = value
        self.reporter.step(step, value)
        rate = self.speed.add(self.batch_size)
        if self.bar is not None:
            self.bar.update(1)
            shown = {"loss": f"{value:.4g}", "samples_s": f"{rate:.0f}"}
            if spilled:
                shown["spilled"] = format_bytes(spilled)
            if device_spilled:
                shown["device_spilled"] = format_bytes(device_spilled)
            self.bar.set_postfix(shown)
        elif self.next_line is not None and time.monotonic() >= self.next_line:
            line = f"dfdl.train: step {step + 1}/{self.total}, loss {value:.4g}"
            line += f", {rate:.0f} samples/s"
            if spilled:
                line += f", {format_bytes(spilled)} spilled"
            if device_spilled:
                line += f", {format_bytes(device_spilled)} off the GPU"
            print(line, file=sys.stderr, flush=True)
            self.next_line = time.monotonic() + LOG_EVERY_S

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
