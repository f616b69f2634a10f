"""Keeps each worker's share of a training step on its worker: Dask's work stealing
leaves them alone.

A share (:func:`dfdl.taskgraph.step_tasks.run_exchange`) exchanges values with the other
workers' shares by address, so it can run on its own worker only. Its restriction to
that worker is loose, so that a lost worker's share still runs somewhere (and raises at
once, and the trainer replays); but Dask's work stealing also moves tasks with loose
restrictions, from a worker with tasks queued to an idle one. :class:`PinnedShares`, a
scheduler plugin, takes every share off the stealing extension's list as it is placed.
Without it (a scheduler that cannot import dfdl), a stolen share asks to go back
(:func:`dfdl.taskgraph.exchange.reschedule`): the same result, one round trip later.

Example:
    >>> install(Client("tcp://scheduler:8786"))  # doctest: +SKIP
"""

from __future__ import annotations

import logging

from distributed.diagnostics.plugin import SchedulerPlugin

from dfdl.taskgraph.step_tasks import STEP_NAME

logger = logging.getLogger("dfdl")

_PREFIX = f"{STEP_NAME}-"


def is_share(key) -> bool:
    """Whether ``key`` is one worker's share of a step: ``(f"train-step-{token}", step,
    part, stage)``.

    Example:
        >>> is_share(("train-step-ab12cd34", 3, 1, 0)), is_share(("conv-fwd-ab12cd34", 3, 0))
        (True, False)
    """
    return (
        isinstance(key, tuple)
        and len(key) == 4
        and isinstance(key[0], str)
        and key[0].startswith(_PREFIX)
    )


class PinnedShares(SchedulerPlugin):
    """Scheduler plugin: a share placed on a worker is never offered to work stealing.

    It runs after the stealing extension's own transition hook (which the scheduler
    registers at start), and undoes what that hook did for shares.
    """

    name = "dfdl-pinned-shares"
    idempotent = True

    def __init__(self) -> None:
        self.stealing = None

    async def start(self, scheduler) -> None:
        self.stealing = getattr(scheduler, "extensions", {}).get("stealing")

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if finish != "processing" or self.stealing is None or not is_share(key):
            return
        ts = self.stealing.scheduler.tasks.get(key)
        if ts is not None:
            self.stealing.remove_key_from_stealable(ts)


def install(client) -> None:
    """Register :class:`PinnedShares` on ``client``'s scheduler (once; later calls leave
    it). A scheduler that cannot load it is logged at debug level and left as it is.

    Example:
        >>> install(Client("tcp://scheduler:8786"))  # doctest: +SKIP
    """
    try:
        client.register_plugin(PinnedShares(), name=PinnedShares.name)
    except Exception as e:  # noqa: BLE001 - e.g. no dfdl on the scheduler's machine
        logger.debug("dfdl: shares left to work stealing (%s)", e)
