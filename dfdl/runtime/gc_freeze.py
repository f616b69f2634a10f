"""Python's cyclic garbage collector during training: every process's heap is frozen.

A full collection walks every object a process tracks (a worker's modules and numba's
kernels; the trainer's plans and the embedded scheduler) while holding the GIL, and no
task starts meanwhile. :func:`frozen_heaps` collects once at the start of training,
then moves every object alive into the collector's permanent generation
(``gc.freeze``), in the trainer's process, on every worker and on the scheduler, and
unfreezes them at the end; later collections walk only what training allocates. The
processes of dfdl's own embedded cluster (``owned=True``) are frozen once, at the first
training that uses them, and stay frozen (:func:`freeze_for_good`).

Guarantees: values never change, and objects still die by reference counting as
before; only cycles among the frozen objects wait until the unfreeze. A process that cannot be
reached is left as it is: the freeze only saves time, and never fails a training.
``dfdl.EngineOptions(freeze_heaps=False)`` turns it off.

Example:
    >>> freeze()
    >>> gc.get_freeze_count() > 0
    True
    >>> unfreeze()

Measurements: ``docs/design/gc-freeze.md``.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)


#: whether this process's heap was frozen for good (:func:`freeze_for_good`)
_FROZEN_FOR_GOOD = [False]


def freeze() -> None:
    """Collects garbage, then moves every object alive into the permanent generation.

    Example:
        >>> freeze()
        >>> gc.get_freeze_count() > 0
        True
        >>> unfreeze()
    """
    gc.collect()
    gc.freeze()


def freeze_for_good() -> None:
    """:func:`freeze` the first time it runs in this process; nothing after that. For
    the processes of dfdl's own embedded cluster, which :func:`frozen_heaps` does not
    unfreeze."""
    if not _FROZEN_FOR_GOOD[0]:
        freeze()
        _FROZEN_FOR_GOOD[0] = True


def unfreeze() -> None:
    """Returns the frozen objects to the collector's oldest generation (but those of a
    process frozen for good)."""
    gc.unfreeze()
    if _FROZEN_FOR_GOOD[0]:
        gc.freeze()


def _elsewhere(fn, pid: int) -> None:
    """``fn()`` unless this is process ``pid`` (an embedded scheduler: done already)."""
    if os.getpid() != pid:
        fn()


@contextmanager
def frozen_heaps(client, enabled: bool = True, *, owned: bool = False) -> Iterator[None]:
    """Freezes the heaps of this process, of ``client``'s workers and of its scheduler
    (:func:`freeze`) for the duration of the block; ``enabled=False`` leaves them be.
    With ``owned`` (dfdl's embedded cluster), the workers' and the scheduler's heaps are
    frozen for good the first time (:func:`freeze_for_good`) and stay frozen.

    A process that cannot be reached is left as it is: the freeze only saves time.

    Example:
        >>> with frozen_heaps(client):  # doctest: +SKIP
        ...     pass
    """
    if not enabled:
        yield
        return
    freeze()
    remote = (client.run, client.run_on_scheduler)
    for run in remote:
        try:
            run(_elsewhere, freeze_for_good if owned else freeze, os.getpid())
        except Exception as e:  # noqa: BLE001 - an optimisation: never fail training
            logger.debug("dfdl: could not freeze a heap (%s)", e)
    try:
        yield
    finally:
        unfreeze()
        for run in () if owned else remote:
            try:
                run(_elsewhere, unfreeze, os.getpid())
            except Exception as e:  # noqa: BLE001
                logger.debug("dfdl: could not unfreeze a heap (%s)", e)
