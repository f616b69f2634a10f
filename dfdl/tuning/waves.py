"""The study's loop: trials asked in waves, each wave run ``n`` trials at a time.

A wave's trials are asked together once the previous wave has ended, each with a sampler
seeded from the study's seed and the trial's number (:func:`dfdl.tuning.study.
sampler_for`); they then run in threads, in the order of their numbers, reporting each
epoch through a :class:`~dfdl.tuning.order.RungGate`. Trials a killed tuner left running
are the first wave of a resumed one; a wave whose asking was cut short is completed first.

Example:
    >>> run_waves(context, "tpe", trials=24, wave=8, n=4, bar=progress)  # doctest: +SKIP
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from dfdl.tuning import study as studies
from dfdl.tuning.order import RungGate
from dfdl.tuning.trial import TrialContext, decided_rungs, run_trial


def run_waves(ctx: TrialContext, sampler: str, trials: int, wave: int, n: int, bar) -> None:
    """Ask and run trials until the study has ``trials`` trials, all ended."""
    from optuna.trial import TrialState

    study = ctx.study
    startup = wave  # TPE models the results from the second wave on
    while True:
        have = study.get_trials(deepcopy=False)
        count = len(have)
        if count < trials and count % wave:  # a killed tuner was asking a wave
            _ask(ctx, sampler, startup, min(trials, count + wave - count % wave) - count)
            continue
        running = [t for t in have if t.state == TrialState.RUNNING]
        if not running:
            if count >= trials:
                return
            _ask(ctx, sampler, startup, min(wave, trials - count))
            continue
        _run_wave(ctx, sorted(running, key=lambda t: t.number), n, bar)


def _run_wave(ctx: TrialContext, running: list, n: int, bar) -> None:
    """Run a wave's trials, ``n`` at a time, in the order of their numbers."""
    gate = RungGate(
        [t.number for t in running],
        {t.number: max(decided_rungs(t), default=0) for t in running},
    )
    errors: list[BaseException] = []
    stop = threading.Event()

    def one(frozen) -> None:
        if stop.is_set():
            return
        bar.started(frozen.number)
        try:
            run_trial(ctx, frozen, gate)
        except BaseException as e:  # an interrupt or a tuner's error: no more trials start
            errors.append(e)
            stop.set()
            gate.end(frozen.number)

    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="dfdl-trial") as pool:
        try:
            list(pool.map(one, running))
        except BaseException:
            stop.set()
            raise
    if errors:
        raise errors[0]


def _ask(ctx: TrialContext, sampler: str, startup: int, k: int) -> None:
    study = ctx.study
    for _ in range(k):
        number = len(study.get_trials(deepcopy=False))
        study.sampler = studies.sampler_for(sampler, ctx.seed, number, startup)
        study.ask(ctx.space.searched)
