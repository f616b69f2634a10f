"""What :func:`dfdl.tune` returns: :class:`TuneResult`, and each trial's :class:`Trial`.

Example:
    >>> result = dfdl.tune(model, data=(X, y), validation=(Xv, yv), space=space)  # doctest: +SKIP
    >>> result.best_params, result.save("best.onnx")                              # doctest: +SKIP
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx


@dataclass
class Trial:
    """One trial of a study.

    Attributes:
        number: the trial's number in the study (from 0).
        state: ``"complete"``, ``"pruned"``, ``"failed"`` or ``"running"``.
        params: the searched values it trained with (decoded: a choice's value itself).
        value: its final validation metric (the last epoch's; for a pruned trial, the
            epoch it was stopped at), None if it failed.
        history: ``"loss"``: every step's training loss; ``"val_loss"`` (and
            ``"val_accuracy"``): one value per epoch trained.
        seed: its training seed (from the study's seed and ``number``).
        reason: why it failed ("" otherwise).
    """

    number: int
    state: str
    params: dict[str, Any]
    value: float | None
    history: dict[str, list]
    seed: int
    reason: str = ""


@dataclass
class TuneResult:
    """What :func:`dfdl.tune` returns.

    Attributes:
        best_params: the best trial's searched values.
        best_value: its validation metric.
        best_trial: its number.
        model: the best trial's trained model (ONNX, onnxruntime runs it).
        trials: every trial, by number.
        study: the Optuna study (its storage keeps everything above).
        metric: the metric compared (``"val_loss"`` or ``"val_accuracy"``).

    Example:
        >>> result.save("best.onnx")  # doctest: +SKIP
        [PosixPath('best.onnx')]
    """

    best_params: dict[str, Any]
    best_value: float
    best_trial: int
    model: onnx.ModelProto
    trials: list[Trial] = field(default_factory=list)
    study: Any = None
    metric: str = "val_loss"

    def counts(self) -> dict[str, int]:
        """Trials per state.

        Example:
            >>> result.counts()  # doctest: +SKIP
            {'complete': 5, 'pruned': 18, 'failed': 1, 'running': 0}
        """
        out = dict.fromkeys(("complete", "pruned", "failed", "running"), 0)
        for t in self.trials:
            out[t.state] += 1
        return out

    def save(self, path: str | os.PathLike) -> list[Path]:
        """Write the best trial's trained model as an ONNX file, as
        :meth:`dfdl.TrainResult.save` does.

        Example:
            >>> result.save("best.onnx")  # doctest: +SKIP
            [PosixPath('best.onnx')]
        """
        from dfdl.runtime.output import save_model

        return save_model(self.model, path)
