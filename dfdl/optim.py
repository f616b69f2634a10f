"""Optimizers, learning-rate schedules and gradient clipping, emitted as IR.

``SGD``, ``Adam`` and ``AdamW`` follow ``torch.optim`` exactly (see
:mod:`dfdl.training.optimizers`); :mod:`dfdl.training.schedules` holds the learning-rate
schedules; :func:`emit_clip` is ``torch.nn.utils.clip_grad_norm_``.

Example:
    >>> from dfdl.optim import SGD, schedules
    >>> opt = SGD(lr=0.1, momentum=0.9, schedule=schedules.step(10, 0.5), clip_norm=1.0)
    >>> opt.lr_at(11)
    0.05
"""

from __future__ import annotations

from dfdl.training import schedules
from dfdl.training.optimizers import SGD, Adam, AdamW, Optimizer, emit_clip, scope

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "emit_clip", "schedules", "scope"]
