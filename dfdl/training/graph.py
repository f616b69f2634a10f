"""The training graph: forward (training mode) + loss + backward + optimizer update, as IR.

:func:`build_training_graph` turns a model's IR into one bound graph whose inputs are the
batch (data and labels), the trainable parameters, the optimizer state, the BatchNorm
running statistics and the per-step scalars (learning rate, bias corrections), and
whose outputs are the loss and the new values of everything that carries over to the
next step. The trainer runs it once per step, feeding each step's outputs to the next.

Which initializers train: every floating-point initializer except BatchNormalization
running statistics, those named in ``frozen``, those an op needs as a plan-time
constant (a Resize's scales), those that only feed inputs ONNX's schema marks
non-differentiable (a Clip's bounds: ReLU6 exported as ``Clip(x, 0, 6)`` keeps its 6),
and constants torch's exporter stored as initializers (``Graph.constants``);
an initializer the loss does not depend on is kept as a constant. :class:`TrainingGraph`
offers the graph's rewrites as copies (split or fused BatchNorms, grouped updates,
recomputation: :mod:`dfdl.training.passes`).

Guarantee: the same model, batch types, loss, optimizer and seed give the same graph,
and a random op's seed depends only on ``(seed, node, step)`` (:func:`node_seed`), never
on the tiling or on where a task runs.

Example:
    >>> tg = build_training_graph(graph, {"x": TensorType((8, 4), "float32")},  # doctest: +SKIP
    ...                           loss="cross_entropy", optimizer=dfdl.optim.SGD(lr=0.1))
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx.defs

from dfdl.errors import ConfigError, DfdlError, ModelError, ShapeError
from dfdl.ir.bind import TYPE_ONLY_INPUTS, bind
from dfdl.ir.graph import Graph
from dfdl.ops import lookup
from dfdl.ops.registry import TensorType
from dfdl.training import losses
from dfdl.training.autodiff import GradBuilder, gradients
from dfdl.training.passes.fold_transpose import fold_transposes
from dfdl.training.passes.fuse_norm_relu import fuse_batch_norm_relu
from dfdl.training.passes.group_updates import GROUP_TOTAL_BYTES, group_small_updates
from dfdl.training.passes.recompute import recompute, segments
from dfdl.training.passes.split_norm import split_batch_norms

#: BatchNormalization inputs holding running statistics (never trained)
_BN_STATS = (3, 4)


@dataclass
class TrainingGraph:
    """A bound training graph and the roles of its inputs and outputs.

    Attributes:
        graph: the bound IR graph (inputs: data, labels, params, states, buffers,
            scalars; outputs: loss, new params, new states, new buffers).
        data: the model's data input names.
        labels: the labels input name (None when the model's output is the loss).
        loss: the loss value name.
        params: trainable parameter names, in order.
        states: optimizer state input names per parameter.
        buffers: BatchNorm running statistics carried between steps.
        new: for every carried input (param, state, buffer), the output with its next value.
        scalars: per-step scalar inputs (learning rate first).
        dropout: names of Dropout nodes (their seed changes every step).
        frozen: floating-point initializers kept constant.
        output: the model's (first) output, e.g. the logits.
        step_inputs: the optimizer's per-step scalar inputs by its key ("first"...).
        grad_of: value -> its gradient, for every value the backward pass reaches.
        recomputed: clone node -> forward node it rebuilds in the backward pass
            (:meth:`recompute`).
    """

    graph: Graph
    data: list[str]
    labels: str | None
    loss: str
    params: list[str]
    states: dict[str, list[str]]
    buffers: list[str]
    new: dict[str, str]
    scalars: list[str]
    dropout: list[str] = field(default_factory=list)
    frozen: list[str] = field(default_factory=list)
    output: str = ""
    step_inputs: dict[str, str] = field(default_factory=dict)
    grad_of: dict[str, str] = field(default_factory=dict)
    recomputed: dict[str, str] = field(default_factory=dict)

    def segments(self, size: int | None = None):
        """The forward segments recomputation could rebuild
        (:func:`dfdl.training.passes.recompute.segments`)."""
        return segments(self.graph, self.grad_of, size)

    def recompute(self, chosen) -> TrainingGraph:
        """A copy whose backward pass rebuilds the ``chosen`` segments' activations
        instead of keeping them (:func:`dfdl.training.passes.recompute.recompute`).

        Example:
            >>> tg2 = tg.recompute(tg.segments())  # doctest: +SKIP
        """
        graph = self.graph.copy()
        clones = recompute(graph, chosen)
        return dataclasses.replace(self, graph=graph, recomputed={**self.recomputed, **clones})

    def split_batch_norms(
        self, *, fuse_relu: bool = True, group_running: bool = True
    ) -> TrainingGraph:
        """A copy whose training-mode BatchNormalizations (and gradients) tile over batch
        and space (:mod:`dfdl.training.passes.split_norm`), their running statistics updated in
        groups.

        Example:
            >>> tg.split_batch_norms()  # doctest: +SKIP
        """
        graph = self.graph.copy()
        split_batch_norms(graph, fuse_relu=fuse_relu)
        if group_running:
            group_small_updates(graph, ops=("BatchNormRunning",))
        return dataclasses.replace(self, graph=graph)

    def fuse_batch_norm_relu(self) -> TrainingGraph:
        """A copy whose BatchNormalization -> Relu pairs (and their gradients) run as
        one op each way (:mod:`dfdl.training.passes.fuse_norm_relu`).

        Example:
            >>> tg.fuse_batch_norm_relu()  # doctest: +SKIP
        """
        graph = self.graph.copy()
        fuse_batch_norm_relu(graph)
        return dataclasses.replace(self, graph=graph)

    def group_small_updates(self, max_total: int | None = None) -> TrainingGraph:
        """A copy whose small parameters' optimizer updates run as grouped nodes of at
        most ``max_total`` parameter bytes (:mod:`dfdl.training.passes.group_updates`).

        Example:
            >>> tg.group_small_updates()  # doctest: +SKIP
        """
        graph = self.graph.copy()
        group_small_updates(graph, max_total=max_total or GROUP_TOTAL_BYTES)
        return dataclasses.replace(self, graph=graph)

    def seeds(self, seed: int, step: int) -> dict[str, dict[str, int]]:
        """Per-node attribute overrides of one step: every Dropout's seed (a clone
        rebuilding a Dropout draws the original's mask)."""
        out = {n: {"seed": node_seed(seed, n, step)} for n in self.dropout}
        for clone, node in self.recomputed.items():
            if node in out:
                out[clone] = out[node]
        return out

    def carried(self) -> list[str]:
        """Inputs whose values carry over from step to step."""
        return self.params + [s for p in self.params for s in self.states[p]] + self.buffers


def _const_inputs(graph: Graph) -> set[str]:
    """Values that some op needs as a plan-time constant."""
    out = set()
    for n in graph.nodes:
        op = lookup(n.op_type, n.domain)
        if op is None:
            continue
        idx = range(len(n.inputs)) if op.fold_only else op.const_inputs
        # Shape(w) or CastLike(x, w) reads only w's static type: w may still train
        type_only = TYPE_ONLY_INPUTS.get(n.op_type, ()) if not n.domain else ()
        out.update(
            n.inputs[i] for i in idx if i < len(n.inputs) and n.inputs[i] and i not in type_only
        )
    return out


def _schema_constants(graph: Graph) -> set[str]:
    """Values every reader of which takes them at an input ONNX's schema marks
    non-differentiable (Clip's ``min``/``max``, Pad's ``constant_value``)."""
    differentiable: set[str] = set()
    nondiff: set[str] = set()
    for n in graph.nodes:
        schema = _schema(n.op_type, n.domain)
        for i, name in enumerate(n.inputs):
            if not name:
                continue
            if schema is None or not schema.inputs:
                differentiable.add(name)
                continue
            formal = schema.inputs[min(i, len(schema.inputs) - 1)]
            if formal.differentiation_category == _NON_DIFFERENTIABLE:
                nondiff.add(name)
            else:
                differentiable.add(name)
    return nondiff - differentiable


def _schema(op_type: str, domain: str):
    if domain not in ("", "ai.onnx"):
        return None
    try:
        return onnx.defs.get_schema(op_type)
    except onnx.defs.SchemaError:
        return None


_NON_DIFFERENTIABLE = onnx.defs.OpSchema.DifferentiationCategory.NonDifferentiable


def training_mode(graph: Graph, seed: int) -> tuple[list[str], list[str]]:
    """Switch BatchNormalization and Dropout nodes to training behaviour, in place.

    Returns:
        (running statistics names updated by BatchNorm, Dropout node names).
    """
    buffers: list[str] = []
    dropout: list[str] = []
    for n in graph.nodes:
        if n.op_type == "BatchNormalization" and not n.domain:
            n.attrs["training_mode"] = 1
            mean, var = n.inputs[3], n.inputs[4]
            for stat in (mean, var):
                _check_statistic(n, stat, graph)
            n.outputs = [n.outputs[0], f"{mean}.next", f"{var}.next"]
            buffers += [mean, var]
        elif n.op_type == "Dropout" and not n.domain:
            name = f"{n.name}.training_mode"
            graph.initializers[name] = np.asarray(True)
            while len(n.inputs) < 3:
                n.inputs.append("")
            n.inputs[2] = name
            n.attrs["seed"] = node_seed(seed, n.name, 0)
            dropout.append(n.name)
    return buffers, dropout


def _check_statistic(node, name: str, graph: Graph) -> None:
    """Raise unless BatchNorm ``node``'s running statistic ``name`` is stored in the model
    (training updates it; :func:`dfdl.ir.canonical.untie_running_statistics` has given
    the ones TorchScript's exporter aliased their own copies)."""
    if name not in graph.initializers:
        raise ModelError(
            f"BatchNormalization node {node.name!r}: its running statistic {name!r} is not "
            "stored in the model (a graph input, or computed); to train, the running mean "
            "and variance must be initializers (export in eval mode without constant folding)"
        )


def node_seed(seed: int, node: str, step: int) -> int:
    """A deterministic 63-bit seed from (seed, node name, step) for random ops."""
    h = hashlib.blake2b(f"{seed}/{node}/{step}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 1


def build_training_graph(
    graph: Graph,
    input_types: Mapping[str, TensorType],
    *,
    loss: str,
    optimizer,
    labels: TensorType | None = None,
    frozen: Iterable[str] = (),
    seed: int = 0,
    loss_options: Mapping | None = None,
    fold: bool = True,
) -> TrainingGraph:
    """Assemble and bind the training graph of a model (see the module docstring).

    Args:
        graph: the model's IR (from :func:`dfdl.ir.onnx_io.to_ir`, unbound).
        input_types: the type of each data input for one batch.
        loss: a loss name of :mod:`dfdl.training.losses`, or the name of a model output that
            already is the (scalar) loss.
        optimizer: a :mod:`dfdl.optim` optimizer.
        labels: type of the labels of one batch (None when ``loss`` is a model output).
        frozen: initializer names that must not train.
        seed: seed of the random ops (Dropout).
        loss_options: keyword arguments of the loss (``weight``, ``ignore_index``).
        fold: fold transposes of the last two axes into the matrix products that read
            them (:mod:`dfdl.training.passes.fold_transpose`).

    Raises:
        ConfigError: no trainable parameters, unknown loss, frozen name unknown.
        ShapeError / UnsupportedOpError: as for :func:`dfdl.ir.bind.bind`.
    """
    g = graph.copy()
    frozen = list(frozen)
    unknown = [f for f in frozen if f not in g.initializers]
    if unknown:
        raise ConfigError(f"frozen names {unknown} are not initializers of the model")
    model_loss = loss in g.outputs
    if not model_loss:
        losses.validate_loss(loss)
    buffers, dropout = training_mode(g, seed)
    consts = _const_inputs(g) | _schema_constants(g) | set(g.constants)
    candidates = [
        k
        for k, v in g.initializers.items()
        if v.dtype.kind == "f" and k not in buffers and k not in frozen and k not in consts
    ]
    # trainable parameters and running statistics become inputs: never folded
    for k in candidates + buffers:
        v = g.initializers.pop(k)
        g.inputs.append(k)
        g.declared[k] = (tuple(v.shape), v.dtype)
    types = dict(input_types)
    for k in candidates + buffers:
        types[k] = TensorType(g.declared[k][0], g.declared[k][1])
    label_name = None
    if not model_loss:
        if labels is None:
            raise ShapeError(f"loss {loss!r} needs labels (data=(X, y))")
        label_name = g.fresh_name("labels")
        g.inputs.append(label_name)
        g.declared[label_name] = (tuple(labels.shape), labels.dtype)
        types[label_name] = labels
    g.outputs = [o for o in g.outputs]
    bound = bind(g, types)
    if model_loss:
        loss_name = loss
        lt = bound.types[loss_name]
        if lt.rank and int(np.prod(lt.shape)) != 1:
            raise ShapeError(f"model output {loss!r} used as the loss must be a scalar")
    else:
        b = GradBuilder(bound, phase="loss")
        loss_name = losses.build_loss(
            b, loss, [graph.outputs[0]], label_name, **dict(loss_options or {})
        )
    params_all = [k for k in candidates if k in bound.types and _used(bound, k)]
    grad_of: dict[str, str] = {}
    grads = gradients(bound, loss_name, params_all, record=grad_of)
    params = [p for p in params_all if grads[p] is not None]
    kept_const = [p for p in candidates if p not in params]
    if not params:
        raise ConfigError(
            "the model has no trainable parameters: no floating-point initializer "
            "(other than BatchNorm statistics and frozen ones) affects the loss"
        )
    b = GradBuilder(bound, phase="update")
    lr_name = bound.fresh_name("lr")
    step_inputs = {k: bound.fresh_name(f"optim.{k}") for k in optimizer.step_scalars(1, 0.0)}
    scalars = [lr_name, *step_inputs.values()]
    for s in scalars:
        bound.inputs.append(s)
        bound.types[s] = TensorType((), np.float32)
        bound.declared[s] = ((), np.dtype(np.float32))
    states: dict[str, list[str]] = {}
    for p in params:
        states[p] = optimizer.state_names(p)
        pt = bound.types[p]
        for s in states[p]:
            bound.inputs.append(s)
            bound.types[s] = pt
            bound.declared[s] = (pt.shape, pt.dtype)
    new_params, new_states = optimizer.emit_step(
        b, {p: grads[p] for p in params}, states, lr_name, step_inputs
    )
    new: dict[str, str] = {}
    for p in params:
        new[p] = new_params[p]
        new.update(zip(states[p], new_states[p]))
    for buf in buffers:
        if f"{buf}.next" in bound.types:
            new[buf] = f"{buf}.next"
    bound.outputs = [loss_name] + [new[k] for k in new]
    if fold:
        fold_transposes(bound)
    bound.prune()
    if any(k not in bound.inputs for k in params):
        raise DfdlError("internal: a trainable parameter was pruned")
    return TrainingGraph(
        graph=bound,
        data=[i for i in graph.inputs],
        labels=label_name,
        loss=loss_name,
        params=params,
        states=states,
        buffers=[b_ for b_ in buffers if b_ in new],
        new=new,
        scalars=scalars,
        step_inputs=step_inputs,
        dropout=dropout,
        frozen=frozen + kept_const,
        output=graph.outputs[0],
        grad_of=grad_of,
    )


def _used(graph: Graph, name: str) -> bool:
    return any(name in n.inputs for n in graph.nodes)
