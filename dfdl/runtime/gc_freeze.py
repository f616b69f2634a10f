"""Python's cyclic garbage collector during training: every process's heap is frozen.

A full (generation 2) collection walks every object the process tracks: in a Dask
worker, the imported modules and numba's compiled kernels (millions of objects); in
the trainer's process, the plans and, for the embedded cluster, the scheduler. Such a
collection holds the GIL for 80-140 ms (measured with ``gc.callbacks`` on the ResNet
benchmark, 2-core development machine), and a training step allocates enough to set
one off every few steps in each process. A pause in the worker stops its event loop;
a pause in the trainer's process stops the embedded scheduler. Either way no task
starts: the ResNet step's two longest gaps with both task threads idle (94 and 141 ms
in a 10-step call) were such pauses.

:func:`frozen_heaps` collects once at the start of training, then moves every object
alive into the collector's permanent generation (``gc.freeze``), in the trainer's
process, on every worker and on the scheduler. Later collections walk only what
training allocates. Objects still die by reference counting as before; only cycles
among the frozen objects wait until :func:`frozen_heaps` unfreezes at the end.

Example:
    >>> from distributed import Client  # doctest: +SKIP
    >>> with frozen_heaps(client):  # doctest: +SKIP
    ...     pass  # train
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)

#: whether :func:`dfdl.train` freezes the processes' heaps while it trains
FREEZE = True


def freeze() -> int:
    """Collects garbage, then moves every object alive into the permanent generation;
    returns how many objects are frozen now.

    Example:
        >>> freeze() > 0
        True
        >>> unfreeze()
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def unfreeze() -> None:
    """Returns the frozen objects to the collector's oldest generation."""
    gc.unfreeze()


def _elsewhere(fn, pid: int) -> None:
    """``fn()`` unless this is process ``pid`` (an embedded scheduler: done already)."""
    if os.getpid() != pid:
        fn()


@contextmanager
def frozen_heaps(client) -> Iterator[None]:
    """Freezes the heaps of this process, of ``client``'s workers and of its scheduler
    (:func:`freeze`) for the duration of the block (not when :data:`FREEZE` is off).

    A process that cannot be reached is left as it is: the freeze only saves time.

    Example:
        >>> with frozen_heaps(client):  # doctest: +SKIP
        ...     pass
    """
    if not FREEZE:
        yield
        return
    freeze()
    remote = (client.run, client.run_on_scheduler)
    for run in remote:
        try:
            run(_elsewhere, freeze, os.getpid())
        except Exception as e:  # noqa: BLE001 - an optimisation: never fail training
            logger.debug("dfdl: could not freeze a heap (%s)", e)
    try:
        yield
    finally:
        gc.unfreeze()
        for run in remote:
            try:
                run(_elsewhere, unfreeze, os.getpid())
            except Exception as e:  # noqa: BLE001
                logger.debug("dfdl: could not unfreeze a heap (%s)", e)
