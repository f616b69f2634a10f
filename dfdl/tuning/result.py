"""What :func:`dfdl.tune` returns: :class:`TuneResult`, and each trial's :class:`Trial`.

Example:
    >>> result = dfdl.tune(model, data=(X, y), validation=(Xv, yv), space=space)  # doctest: +SKIP
    >>> result.best_params, result.save("best.onnx")                              # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from dfdl.errors import DfdlError, TrainingError
from dfdl.tuning.params import SearchSpace
from dfdl.tuning.study import trial_seed
from dfdl.tuning.trial import MODEL_FILE


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


def _history(frozen) -> dict[str, list]:
    attrs = frozen.user_attrs
    epochs = sorted(int(k[7:]) for k in attrs if k.startswith("losses_"))
    history: dict[str, list] = {"loss": [v for e in epochs for v in attrs[f"losses_{e}"]]}
    for e in sorted(int(k[4:]) for k in attrs if k.startswith("val_")):
        for name, v in attrs[f"val_{e}"].items():
            history.setdefault(f"val_{name}", []).append(v)
    return history


STATES = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running"}


def trial_records(study, space: SearchSpace, seed: int) -> list[Trial]:
    """Every trial of ``study`` as a :class:`~dfdl.tuning.result.Trial`."""
    out = []
    for t in study.get_trials(deepcopy=False):
        state = STATES.get(t.state.name, t.state.name.lower())
        value = t.value if state == "complete" else None
        if state == "pruned" and t.intermediate_values:
            value = t.intermediate_values[max(t.intermediate_values)]
        out.append(
            Trial(
                t.number,
                state,
                space.decode(t.params),
                value,
                _history(t),
                trial_seed(seed, t.number),
                t.user_attrs.get("fail_reason", ""),
            )
        )
    return out


def study_result(study, space: SearchSpace, seed: int, metric: str, folder: Path) -> TuneResult:
    """The :class:`TuneResult` of an ended study (the best trial's model read from its
    folder).

    Raises:
        TrainingError: no trial completed (the failures' reasons are named).
    """
    records = trial_records(study, space, seed)
    complete = [t for t in records if t.state == "complete"]
    if not complete:
        reasons = sorted({t.reason for t in records if t.reason})
        raise TrainingError(
            "no trial of the study completed"
            + (f" (failures: {'; '.join(reasons[:3])})" if reasons else "")
            + ": widen or move the space (a lower learning rate), or train longer"
        )
    best = study.best_trial
    path = folder / f"trial-{best.number}" / MODEL_FILE
    if not path.exists():
        raise DfdlError(f"the best trial's model {path} is missing: was trials_dir emptied?")
    if not all(math.isfinite(t.value) for t in complete):
        raise TrainingError("a completed trial has a non-finite value")
    return TuneResult(
        space.decode(best.params),
        float(best.value),
        best.number,
        onnx.load(str(path)),
        records,
        study,
        metric,
    )
