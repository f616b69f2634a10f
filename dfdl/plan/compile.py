"""Compile a training step: the training graph, its tiling and its variant, in one place.

Every caller that plans a training step (``dfdl.train``, ``dfdl plan --training``, the
benchmarks) goes through :func:`compile_step` (or its two halves, :func:`training_plan`
and :func:`choose_variant`); inference passes are planned by :func:`inference_plan`.

1. :func:`dfdl.training.graph.build_training_graph`: forward, loss, backward, update;
2. :func:`plan_training`: the tiling for the workers' cores and memory limit, with
   BatchNormalization whole (fused with its Relu) or split over batch and space
   (:func:`plan_norms`), and small parameters' updates grouped;
3. :func:`choose_variant`: the activations kept for the backward pass spilled or
   recomputed (``memory=``), and whether the plan's estimate fits the workers' memory
   (``StepPlan.fits``: the task-graph optimizer groups tasks only then).

Guarantees: planning is deterministic: the same model with the same arguments and
:class:`Workers` always gets the same plan, so a run repeated on the same cluster
computes the same values bit for bit.

Example:
    >>> import dfdl.models, numpy as np
    >>> from dfdl.ir.onnx_io import load_model, to_ir
    >>> from dfdl.ops.registry import TensorType
    >>> graph = to_ir(load_model(dfdl.models.mlp((4, 8, 3))))
    >>> sp = compile_step(graph, {"x": TensorType((2, 4), np.float32)}, loss="cross_entropy",
    ...                   optimizer=dfdl.optim.SGD(lr=0.1), labels=TensorType((2,), np.int64))
    >>> sp.plan.n_tasks() > 0 and sp.fits
    True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dfdl.errors import ConfigError, MemoryPlanError, PlanError
from dfdl.ir.bind import bind
from dfdl.ir.graph import Graph
from dfdl.ops.registry import TensorType
from dfdl.plan.estimate import DASK_TARGET, MemoryEstimate, estimate_memory
from dfdl.plan.scoped_config import config_get, scoped_config
from dfdl.plan.tiling import Plan, make_plan
from dfdl.training.graph import TrainingGraph, build_training_graph
from dfdl.training.passes.recompute import MODES, choose
from dfdl.training.passes.split_norm import splittable

#: the ``tiles=`` key that asks for split BatchNormalizations (see :func:`plan_norms`)
SPLIT_NORMS = "split_norms"
#: the split graph's plan is taken when it needs at most this share of the tasks
SPLIT_NORMS_GAIN = 0.5


@dataclass(frozen=True)
class Workers:
    """The workers a step is planned for.

    Attributes:
        cores: worker threads in all (the automatic tiling makes work for each).
        processes: worker processes.
        threads: threads of the largest worker process.
        memory_limit: the smallest worker memory limit in bytes (None: no limit).
        thresholds: the workers' Dask memory thresholds as dask config
            (``{"distributed.worker.memory.spill": 0.7, ...}``); planning reads them.
        device: where the tile kernels run: ``"cpu"``, or ``"gpu"`` on GPU workers
            (:func:`dfdl.runtime.cluster.workers_device`).
    """

    cores: int = 1
    processes: int = 1
    threads: int = 1
    memory_limit: int | None = None
    thresholds: Mapping[str, Any] = field(default_factory=dict)
    device: str = "cpu"


@dataclass
class StepPlan:
    """A training graph and its tiling, for one batch size.

    Attributes:
        tg: the training graph (with the rewrites its plan chose).
        plan: its tiling plan.
        fits: whether the plan's memory estimate fits the workers without spilling and
            nothing is recomputed: the task-graph optimizer may then group tasks (a
            grouped task holds its members' inputs until it runs, which a plan sized to
            a per-task budget does not count).
    """

    tg: TrainingGraph
    plan: Plan
    fits: bool = False


def plan_graph(
    tg: TrainingGraph, tiles=None, *, cores: int = 1, memory_limit: int | None = None
) -> Plan:
    """The tiling plan of a training graph; carried tensors are weights, not batch data.

    With ``memory_limit`` (bytes per worker) every task fits a share of it or
    :class:`~dfdl.errors.MemoryPlanError` is raised.

    Example:
        >>> plan = plan_graph(tg, {"batch": 2})  # doctest: +SKIP
    """
    return make_plan(
        tg.graph, tiles, cores=cores, weights=tg.carried(), memory_limit=memory_limit, carry=tg.new
    )


def _refined_for_norms(plan: Plan) -> bool:
    """Whether the memory bound split the model axis and a BatchNormalization (or its
    gradient) is among the largest tasks, so whole channels drove the refinement."""
    if not isinstance(plan.tiles, dict) or plan.tiles.get("model", 1) <= 1:
        return False
    top = sorted(plan.task_memory, key=plan.task_memory.get, reverse=True)[:3]
    return any(splittable(plan.graph, name) for name in top)


def _regathers_for_norms(plan: Plan) -> bool:
    """Whether an automatic plan of whole BatchNormalizations tiles the batch or space
    axes (so each whole-channel task gathers its channels from every batch and space
    tile, and the next layer gathers them back) and has a training BatchNormalization."""
    if not isinstance(plan.tiles, dict):
        return False
    if plan.tiles.get("batch", 1) <= 1 and plan.tiles.get("space", 1) <= 1:
        return False
    return any(splittable(plan.graph, n.name) for n in plan.graph.nodes)


def plan_training(
    tg: TrainingGraph, tiles=None, *, cores: int = 1, memory_limit: int | None = None
) -> tuple[TrainingGraph, Plan]:
    """The plan of :func:`plan_norms` (tiling, and whether BatchNormalizations split),
    decided on ``tg``, for the graph with small parameters' updates grouped
    (:mod:`dfdl.training.passes.group_updates`) in groups of at most 1/64 of the memory
    limit (a group's task holds about ten times its parameters' bytes, within the task
    budget of about a quarter of the limit); ``tg``'s own plan where a group still does
    not fit. The decisions are taken on the ungrouped graph because a group is one
    whole task: it changes the task counts they compare, not the tiles anything else
    needs.

    Example:
        >>> tg, plan = plan_training(tg, memory_limit=2**28)  # doctest: +SKIP
    """
    planned = plan_norms(tg, tiles, cores=cores, memory_limit=memory_limit)
    grouped = tg.group_small_updates(None if memory_limit is None else int(memory_limit) // 64)
    if len(grouped.graph.nodes) == len(tg.graph.nodes):
        return planned
    try:
        return plan_norms(grouped, planned[1].tiles, cores=cores, memory_limit=memory_limit)
    except MemoryPlanError as e:
        node = next((n for n in grouped.graph.nodes if n.name == e.node), None)
        if node is None or node.op_type != "UpdateGroup":
            raise
    return planned


def plan_norms(
    tg: TrainingGraph, tiles=None, *, cores: int = 1, memory_limit: int | None = None
) -> tuple[TrainingGraph, Plan]:
    """``(tg, plan)`` with each BatchNormalization -> Relu pair fused
    (:mod:`dfdl.training.passes.fuse_norm_relu`), or the training graph with split
    BatchNormalizations (:mod:`dfdl.training.passes.split_norm`) and its plan.

    The split form is taken when ``tiles`` has ``"split_norms": 1``, when the plan fails
    on a BatchNormalization's whole-channel tasks, when automatic tiles split the batch
    or space axes (whole-channel tasks would re-tile every normalized activation from
    batch tiles to channel tiles and back), or when whole-channel tasks made the
    automatic plan split channels and the split graph's plan needs at most
    :data:`SPLIT_NORMS_GAIN` of its tasks (measurements: ``docs/design/split-norm.md``).
    The plan's ``tiles`` then carry ``"split_norms": 1``, so passing them back repeats
    the graph.

    Example:
        >>> tg, plan = plan_norms(tg, memory_limit=2**28)  # doctest: +SKIP
    """
    split = False
    if isinstance(tiles, Mapping) and SPLIT_NORMS in tiles:
        split = tiles[SPLIT_NORMS]
        if split not in (0, 1):
            raise PlanError(f"tiles[{SPLIT_NORMS!r}] must be 0 or 1, not {split!r}")
        tiles = {k: v for k, v in tiles.items() if k != SPLIT_NORMS}
    if not split:
        # whole BatchNormalizations run fused with their Relu (the split form fuses
        # them itself, dfdl.training.passes.split_norm)
        fused = tg.fuse_batch_norm_relu()
        try:
            plan = plan_graph(fused, tiles, cores=cores, memory_limit=memory_limit)
        except MemoryPlanError as e:
            if not splittable(fused.graph, e.node or ""):
                raise
        else:
            regathers = tiles is None and _regathers_for_norms(plan)
            refined = tiles is None and memory_limit is not None and _refined_for_norms(plan)
            if not (regathers or refined):
                return fused, plan
            split_tg = tg.split_batch_norms()
            try:
                split_plan = plan_graph(split_tg, None, cores=cores, memory_limit=memory_limit)
            except MemoryPlanError:
                return fused, plan
            if not regathers and split_plan.n_tasks() > SPLIT_NORMS_GAIN * plan.n_tasks():
                return fused, plan
            return _mark_split(split_tg, split_plan)
    tg = tg.split_batch_norms()
    return _mark_split(tg, plan_graph(tg, tiles, cores=cores, memory_limit=memory_limit))


def _mark_split(tg: TrainingGraph, plan: Plan) -> tuple[TrainingGraph, Plan]:
    """``(tg, plan)`` with ``"split_norms": 1`` in the plan's tiles, so passing them back
    repeats the split graph."""
    if isinstance(plan.tiles, dict):
        plan.tiles = {**plan.tiles, SPLIT_NORMS: 1}
    return tg, plan


def training_plan(tg: TrainingGraph, tiles, workers: Workers) -> StepPlan:
    """The spilling plan of ``tg`` for ``workers`` (:func:`plan_training`, under the
    workers' memory thresholds): every activation kept, nothing decided about fitting.

    Example:
        >>> sp = training_plan(tg, None, Workers(cores=2))  # doctest: +SKIP
    """
    with scoped_config(workers.thresholds):
        tg, plan = plan_training(tg, tiles, cores=workers.cores, memory_limit=workers.memory_limit)
    return StepPlan(tg, plan)


def estimate(sp: StepPlan, workers: Workers) -> MemoryEstimate:
    """The plan's memory estimate on ``workers``, at their spill target."""
    with scoped_config(workers.thresholds):
        target = config_get("distributed.worker.memory.target", None)
    return estimate_memory(
        sp.plan,
        workers=workers.processes,
        threads_per_worker=workers.threads,
        target=target if isinstance(target, float) else DASK_TARGET,
    )


def choose_variant(
    sp: StepPlan, memory: str, workers: Workers, speeds: Callable[[], Any] | None = None
) -> StepPlan:
    """The step plan with the segments ``memory`` recomputes, and whether it fits.

    Args:
        sp: the spilling plan (:func:`training_plan`).
        memory: ``"spill"`` keeps every activation (spilled beyond the limit),
            ``"recompute"`` rebuilds every segment of about √n forward nodes in the
            backward pass, ``"auto"`` spills unless the estimate spills, then recomputes
            the segments that are faster to recompute than to spill.
        workers: the workers the plan is for.
        speeds: called (once, only when ``"auto"`` must choose) for the workers' measured
            rates: an object with ``flops_per_s`` and ``disk_bytes_per_s``.

    Returns:
        A :class:`StepPlan`; the same numbers bit for bit whichever variant.
    """
    if memory not in MODES:
        raise ConfigError(f"memory must be one of {', '.join(map(repr, MODES))}, not {memory!r}")
    with scoped_config(workers.thresholds):
        sp = _memory_mode(sp, memory, workers, speeds)
    if sp.tg.recomputed:
        return sp
    fits = sp.plan.memory_limit is None or estimate(sp, workers).spilled_per_step <= 0
    return replace(sp, fits=fits)


def _memory_mode(sp: StepPlan, memory: str, workers: Workers, speeds) -> StepPlan:
    if memory == "spill":
        return sp
    segs = sp.tg.segments()
    if memory == "auto":
        est = estimate(sp, workers)
        if est.spilled_per_step <= 0:
            return sp
        if speeds is None:
            raise ConfigError('memory="auto" needs the workers\' speeds to choose')
        rates = speeds()
        segs = choose(segs, est.spilled_per_step, rates.flops_per_s, rates.disk_bytes_per_s)
    if not segs:
        return sp
    tg = sp.tg.recompute(segs)
    # the same tiling: a clone computes the bits of the node it rebuilds
    return StepPlan(*plan_training(tg, sp.plan.tiles, memory_limit=sp.plan.memory_limit))


def compile_step(
    graph: Graph,
    input_types: Mapping[str, TensorType],
    *,
    loss: str,
    optimizer,
    labels: TensorType | None = None,
    frozen: Iterable[str] = (),
    seed: int = 0,
    loss_options: Mapping | None = None,
    tiles=None,
    memory: str = "spill",
    workers: Workers | None = None,
    speeds: Callable[[], Any] | None = None,
) -> StepPlan:
    """Build, tile and choose the variant of a model's training step (module docstring).

    Args:
        graph: the model's IR (:func:`dfdl.ir.onnx_io.to_ir`, unbound).
        input_types: the type of each data input for one batch.
        loss, optimizer, labels, frozen, seed, loss_options: as for
            :func:`dfdl.training.graph.build_training_graph`.
        tiles: None (automatic), ``"uneven"``, or ``{"batch": b, "model": m, ...}``.
        memory: ``"spill"``, ``"recompute"`` or ``"auto"`` (:func:`choose_variant`).
        workers: the workers to plan for (default: one thread, no memory limit).
        speeds: the workers' measured rates, for ``memory="auto"``.

    Returns:
        The :class:`StepPlan`.
    """
    workers = workers or Workers()
    tg = build_training_graph(
        graph,
        input_types,
        loss=loss,
        optimizer=optimizer,
        labels=labels,
        frozen=frozen,
        seed=seed,
        loss_options=loss_options,
    )
    return choose_variant(training_plan(tg, tiles, workers), memory, workers, speeds)


def inference_plan(
    graph: Graph,
    input_types: Mapping[str, TensorType],
    tiles=None,
    workers: Workers | None = None,
    *,
    values: Mapping[str, Any] | None = None,
) -> Plan:
    """The plan of one inference pass of ``graph`` (``dfdl.run``, ``dfdl.plan``,
    validation): bound to ``input_types`` (and constant ``values``), tiled for
    ``workers`` under their memory thresholds.

    Example:
        >>> plan = inference_plan(graph, {"x": TensorType((8, 4), "float32")})  # doctest: +SKIP
    """
    workers = workers or Workers()
    bound = bind(graph, input_types, values=values)
    with scoped_config(workers.thresholds):
        return make_plan(bound, tiles, cores=workers.cores, memory_limit=workers.memory_limit)
