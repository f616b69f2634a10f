"""dfdl's exceptions: each names what is wrong (node, op, input) and what to do.

All derive from :class:`DfdlError` (and from the built-in exception they refine, such
as ``ValueError``), so ``except dfdl.errors.DfdlError`` catches every error dfdl raises
on purpose. Model, shape, plan and configuration errors are raised while a model is
loaded or planned, before any task reaches a Dask scheduler; :class:`TrainingError`
(and a failed tile task's :class:`dfdl.taskgraph.tile_exec.TileError`) while it runs.

Example:
    >>> import dfdl
    >>> try:
    ...     dfdl.run(b"not a model", {})
    ... except dfdl.errors.ModelError as e:
    ...     print(type(e).__name__)
    ModelError
"""

from __future__ import annotations


class DfdlError(Exception):
    """Base class of every error dfdl raises on purpose."""


class ModelError(DfdlError, ValueError):
    """The model cannot be read or is not valid ONNX (truncated file, checker failure,
    unsafe external data location, inconsistent graph)."""


class UnsupportedOpError(DfdlError, NotImplementedError):
    """An op type, domain, opset, attribute value or dtype dfdl does not support.

    Attributes:
        op_type: the ONNX op type (the first one, where several are unsupported).
        node: the node's name (the first node of that op).
        domain: the op's domain ("" for the default ONNX domain).
        opset: the opset version the model imports for that domain.
        ops: where ops are missing from dfdl: each of the model's unsupported ops
            (``"Det"``, ``"com.example.Frob"`` outside the default domain) -> the names
            of all the nodes that use it, in graph order; empty otherwise.
    """

    def __init__(
        self,
        message: str,
        *,
        op_type: str = "",
        node: str = "",
        domain: str = "",
        opset: int | None = None,
        ops: dict[str, list[str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.op_type = op_type
        self.node = node
        self.domain = domain
        self.opset = opset
        self.ops = dict(ops or {})


class ShapeError(DfdlError, ValueError):
    """A tensor's shape or dtype does not match what the model or an op expects.

    Attributes:
        name: the input (or value) concerned.
        expected: what the model declares.
        given: what was supplied or inferred.
    """

    def __init__(self, message: str, *, name: str = "", expected=None, given=None) -> None:
        super().__init__(message)
        self.name = name
        self.expected = expected
        self.given = given


class PlanError(DfdlError, ValueError):
    """The requested tiling or cluster setup cannot be planned (bad ``tiles=``)."""


class MemoryPlanError(PlanError):
    """No tiling keeps every task within its share of the workers' memory limit.

    Raised at plan time, before anything runs, instead of a worker running out of
    memory later.

    Attributes:
        node: the node whose tasks are too large.
        task_bytes: its estimated memory per task at the finest tiling tried.
        memory_limit: the worker memory limit planned for (bytes).
        smallest_limit: the smallest worker memory limit this plan fits in (bytes).
    """

    def __init__(
        self,
        message: str,
        *,
        node: str = "",
        task_bytes: int = 0,
        memory_limit: int = 0,
        smallest_limit: int = 0,
    ) -> None:
        super().__init__(message)
        self.node = node
        self.task_bytes = task_bytes
        self.memory_limit = memory_limit
        self.smallest_limit = smallest_limit


class ConfigError(DfdlError, ValueError):
    """A training setting is invalid: an unknown loss name, an optimizer or schedule
    hyperparameter out of range (the message names the argument and its allowed range),
    no trainable parameters, an unknown frozen name."""


class DataError(DfdlError, ValueError):
    """Training data do not fit the model: label values out of range, too few samples,
    unreadable data files."""


class CheckpointError(DfdlError, ValueError):
    """A checkpoint folder or file cannot be used: the folder cannot be written, the
    ``latest`` pointer is bad, a checkpoint is unreadable, or it was written by another
    run (another model, optimizer, loss, batch size, seed or data), or ``resume=True``
    finds none. Raised before any cluster starts; the message names the file.

    Attributes:
        path: the folder or file concerned.
    """

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class OutputError(DfdlError, OSError):
    """An output file cannot be written: its path is empty, a folder, or in a folder that
    does not exist or cannot be written to, the disk is full, or the model is too large
    for the file format. Checked before training starts where possible
    (:func:`dfdl.runtime.output.check_output_path`); a failed write leaves the previous
    file untouched and no partial file behind (:func:`dfdl.runtime.output.save_model`)."""


class TrainingError(DfdlError, RuntimeError):
    """Training stopped: the loss became NaN or infinite (the step is named)."""


class DfdlWarning(UserWarning):
    """Base class of the warnings dfdl gives: the run goes on, but probably not as the
    user meant it."""


class FoldedParametersWarning(DfdlWarning):
    """The model was written by torch's optimizing exporter (``optimize=True``, the
    default), which stores copies of parameters it folded (transposed, expanded to the
    example's batch, merged): training trains the copies, not the network PyTorch
    trains. Export with ``torch.onnx.export(..., optimize=False)`` to train."""


class TiedParametersWarning(DfdlWarning):
    """Float initializers of the model are read through ``Identity`` nodes under other
    names: dfdl trains each such group as one tensor, as the file says. TorchScript's
    exporter in eval mode writes this for parameters that were merely equal (a fresh
    network's BatchNorm scales and shifts); export in ``TrainingMode.TRAINING`` or with
    dynamo to keep them apart. Parameters tied on purpose need nothing."""


class ClientMemoryWarning(DfdlWarning):
    """The model's weights are a large share of the client's free memory: without
    ``weights_dir`` the client loads, sends and gathers them all (several copies at its
    peak). Train with ``weights_dir`` (a folder the workers share) to keep them off it."""
