"""A worker task counter whose cost per transition does not grow with the task prefixes.

Every Dask worker counts its tasks per ``(prefix, state)`` and integrates those counts
over time (``WorkerState.task_counter``: the Prometheus metrics and
``Worker._to_dict`` read it). Dask's :class:`~distributed.worker_state_machine.TaskCounter`
adds the elapsed time to every pair at every transition, a cost proportional to the
number of pairs, and dfdl's keys, named by ONNX node, make hundreds of them.
:class:`LazyTaskCounter` keeps, per pair, the time its count last changed, and adds
``count * elapsed`` to a pair only when its count changes or when the totals are read.

Guarantees: the counts are identical to Dask's and the integrals equal up to rounding,
at a cost per transition proportional to the tasks that moved.
:mod:`dfdl.runtime.worker_setup` installs it in every dfdl worker (:func:`install`).

Example:
    >>> install(worker)  # doctest: +SKIP
    True

Measurements: ``docs/design/task-counter.md``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from time import monotonic
from typing import Any

from distributed.worker_state_machine import TaskCounter


class LazyTaskCounter(TaskCounter):
    """:class:`~distributed.worker_state_machine.TaskCounter` with the same counts and
    integrals, updated per pair when its count changes (see the module docstring).

    Example:
        >>> worker.state.task_counter = LazyTaskCounter()  # doctest: +SKIP
    """

    __slots__ = ("_since",)

    def __init__(self) -> None:
        super().__init__()
        # per (prefix, state): when its count last changed or was integrated
        self._since: dict[tuple, float] = {}

    def _move(self, pair: tuple, delta: int, now: float) -> None:
        n = self._current_count.get(pair, 0)
        if n:
            self._cumulative_elapsed[pair] += n * (now - self._since[pair])
        self._since[pair] = now
        n += delta
        if n > 0:
            self._current_count[pair] = n
        else:
            assert n == 0, (pair, n)
            self._current_count.pop(pair, None)
            del self._since[pair]

    def transitions(self, prev_states: dict) -> None:
        """Tasks have just moved from ``prev_states[ts]`` to ``ts.state``."""
        if not prev_states and not self._new_tasks:
            return
        now = monotonic()
        self._previous_ts = now
        for ts, prev_state in prev_states.items():
            if ts.state != "forgotten":
                self._move((ts.prefix, ts.state), 1, now)
            if ts in self._new_tasks:
                self._new_tasks.discard(ts)
            else:
                self._move((ts.prefix, prev_state), -1, now)
        for ts in self._new_tasks:
            self._move((ts.prefix, ts.state), 1, now)
        self._new_tasks.clear()

    def cumulative_elapsed(self, by_prefix: bool = True) -> Any:
        """Task-seconds per ``(prefix, state)`` (or per state) up to now, as Dask's."""
        now = monotonic()
        for pair, n in self._current_count.items():
            self._cumulative_elapsed[pair] += n * (now - self._since[pair])
            self._since[pair] = now
        self._previous_ts = now
        if by_prefix:
            return self._cumulative_elapsed
        out: defaultdict = defaultdict(float)
        for (_, state), seconds in self._cumulative_elapsed.items():
            out[state] += seconds
        return out


def install(worker: Any) -> bool:
    """Replace ``worker``'s task counter by a :class:`LazyTaskCounter` carrying its
    counts and totals over; returns False (and changes nothing) where the worker's
    state has no Dask ``TaskCounter`` of the expected shape (another Dask version).

    Example:
        >>> install(worker)  # doctest: +SKIP
        True
    """
    state = getattr(worker, "state", None)
    old = getattr(state, "task_counter", None)
    if type(old) is not TaskCounter:
        return isinstance(old, LazyTaskCounter)
    new = LazyTaskCounter()
    old.cumulative_elapsed()  # brings the old totals up to now
    now = monotonic()
    new._current_count = Counter(old._current_count)
    new._cumulative_elapsed = defaultdict(float, old._cumulative_elapsed)
    new._new_tasks = set(old._new_tasks)
    new._since = dict.fromkeys(new._current_count, now)
    new._previous_ts = now
    state.task_counter = new
    return True
