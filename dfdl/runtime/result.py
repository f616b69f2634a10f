"""What a training run returns: :class:`TrainResult`.

A :class:`TrainResult` holds the per-step history (loss, spilled bytes, validation
metrics), the trained parameters, the ONNX model with those parameters as its
initializers (:func:`trained_model`, which onnxruntime runs), the tiling the run used
(pass it back as ``tiles=`` to repeat the same plan) and where time went.

Example:
    >>> result = dfdl.train(model, data=(X, y))  # doctest: +SKIP
    >>> result.save("trained.onnx")              # doctest: +SKIP
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper


@dataclass
class TrainResult:
    """What :func:`dfdl.train` returns.

    Attributes:
        history: ``"loss"``: one float per step, in order; ``"spilled_bytes"`` and
            ``"unspilled_bytes"``: bytes the workers wrote to and read back from their
            spill directories, per step (read from the workers at most once a
            second and shared evenly by the steps in between: their tasks overlap); on
            GPU workers, ``"device_spilled_bytes"`` and ``"device_unspilled_bytes"``:
            bytes moved off and back onto their devices (with a device memory limit);
            with validation, ``"val_loss"`` (and ``"val_accuracy"`` for
            classification) per epoch.
        model: the ONNX model with the trained initializers (and BatchNorm statistics).
        params: the trained parameters by name.
        timings: seconds spent on the client: ``setup_s`` (loading, planning, sending
            the initial weights), ``graph_s`` (building step graphs), ``submit_s``
            (handing them to the scheduler), ``wait_s`` (waiting for losses and the
            final weights; the cluster computes meanwhile), ``total_s``.
        tiles: the tiling the steps ran with (``{"batch": b, "model": m}``, or
            "uneven"): the automatic choice, split further where the workers' memory
            limit required it. Pass it as ``tiles=`` to repeat the same plan.
        recomputed: the forward nodes whose outputs the backward pass rebuilt instead
            of keeping (``memory="recompute"``, or what ``"auto"`` chose).
        rollbacks: how often a lost worker took data Dask could not rebuild with it,
            so that training went back to the initial weights or the latest
            checkpoint and replayed the steps since (the result is the same either
            way; see :mod:`dfdl.runtime.recovery`).
        fused: whether the steps ran with tasks grouped by the task-graph optimizer
            (:mod:`dfdl.taskgraph.optimize`: fewer and larger tasks, the same values):
            off where the plan recomputes or its estimate spills.
        stopped_epoch: the epoch (counted from 1) after which ``on_epoch`` stopped
            training; None when it ran to the end.
        weights_dir: with ``weights_dir=`` (:func:`dfdl.train`), the folder where the
            workers wrote the trained weights (one ``.npy`` file per tensor); ``params``
            are then read-only memory maps of those files, and ``model`` refers to
            them as external data with absolute locations (:meth:`save` copies them
            into the saved model's data file a block at a time, never loading them).

    Example:
        >>> result = dfdl.train(model, data=(X, y))  # doctest: +SKIP
        >>> result.save("trained.onnx")              # doctest: +SKIP
    """

    history: dict[str, list] = field(default_factory=dict)
    model: onnx.ModelProto | None = None
    params: dict[str, np.ndarray] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    tiles: dict[str, int] | str | None = None
    recomputed: list[str] = field(default_factory=list)
    rollbacks: int = 0
    fused: bool = False
    stopped_epoch: int | None = None
    weights_dir: Path | None = None

    def save(self, path: str | os.PathLike) -> list[Path]:
        """Write the trained model as an ONNX file (onnxruntime runs it), atomically.

        A model of more than :data:`dfdl.runtime.output.EXTERNAL_DATA_THRESHOLD` bytes
        of tensors (protobuf cannot write 2 GiB) keeps its large initializers in one
        file beside it, ``<name>.data``; see :func:`dfdl.runtime.output.save_model`.

        Returns:
            The files written: the model, then its data file if any.

        Raises:
            OutputError: the file cannot be written (the message names the path and
                the reason, e.g. "No space left on device"); a file already at
                ``path`` is left unchanged and no partial file is left behind.

        Example:
            >>> result.save("trained.onnx")  # doctest: +SKIP
            [PosixPath('/home/me/trained.onnx')]
        """
        from dfdl.runtime.output import save_model

        return save_model(self.model, path)


def trained_model(proto: onnx.ModelProto, params: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``proto`` whose initializers named in ``params`` hold the new values."""
    out = copy.deepcopy(proto)
    for t in out.graph.initializer:
        if t.name in params:
            t.CopyFrom(numpy_helper.from_array(np.asarray(params[t.name]), t.name))
    return out


def stored_model(proto: onnx.ModelProto, stored: Mapping[str, Any]) -> onnx.ModelProto:
    """A copy of ``proto`` whose initializers named in ``stored`` (:class:`~dfdl.runtime.
    stored.Stored` tensors) refer to those files as external data, with absolute
    locations: nothing is read."""
    from dfdl.runtime.output import copy_fields_except

    out = onnx.ModelProto()
    copy_fields_except(proto, out, "graph")
    copy_fields_except(proto.graph, out.graph, "initializer")
    for t in proto.graph.initializer:
        new = out.graph.initializer.add()
        if t.name not in stored:
            new.CopyFrom(t)
            continue
        where = stored[t.name]
        new.name = t.name
        new.data_type = t.data_type
        new.dims.extend(where.shape)
        new.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (
            ("location", os.path.abspath(where.path)),
            ("offset", where.offset),
            ("length", where.nbytes),
        ):
            new.external_data.add(key=key, value=str(value))
    return out
