"""Progress when stderr is not a terminal (:mod:`dfdl.runtime.progress`): a line every
``LOG_EVERY_S`` seconds with the step, the loss and samples/s, and nothing with
``show=False``."""

from __future__ import annotations

import pytest

from dfdl.runtime import progress
from dfdl.runtime.monitor import Reporter


def _run(show: bool, steps: int = 3, spilled: int = 0) -> progress.Progress:
    p = progress.Progress(Reporter(None, "r"), show=show, total=10, start=0, batch_size=8)
    for step in range(steps):
        p.loss(step, 2.0 / (step + 1), spilled=spilled)
    p.close()
    return p


def test_lines_on_a_non_terminal_stderr(monkeypatch, capsys):
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    p = _run(show=True, spilled=3 << 20)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("dfdl.train: step 1/10, loss 2, ")
    assert lines[2].startswith("dfdl.train: step 3/10, loss 0.6667, ")
    assert lines[2].endswith("samples/s, 3.00 MiB spilled")
    assert p.losses == pytest.approx({0: 2.0, 1: 1.0, 2: 2 / 3})


def test_no_line_before_the_interval_or_without_show(capsys):
    _run(show=True)  # LOG_EVERY_S (30 s) has not passed
    _run(show=False)
    assert capsys.readouterr().err == ""
