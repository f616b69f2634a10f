"""Step programs: a group of training steps lowered and optimized once, then run again for
every later group of the same shape with new inputs.

On a GPU worker a training step takes milliseconds, while building its task graph
(lowering every tile, fusing, grouping into a step task, pickling) takes the trainer
milliseconds to tens of milliseconds per step: the trainer, not the GPU, set the pace. A
group of ``k`` steps on one worker process becomes one task
(:mod:`dfdl.taskgraph.step_tasks`) whose body does not depend on which steps it runs
once every per-step input is a named input of the task: the batch tiles and scalars of
step ``j`` of the group, the carried tiles at the group's start, and each Dropout's seed
(a :class:`StepValue` attribute, resolved as the tile runs). :func:`compile_group` builds
that body once from placeholders; :func:`instantiate` makes a group's graph from it: one
task over the group's inputs, plus a small task per loss.

Guarantees: the same tile functions run on the same tiles in the same order as in the
graph built step by step, so the values are the same bits; a group that does not compile
to a single task (several workers, no step tasks, file-backed data) gives None, and the
caller builds its graph as before.

Example:
    >>> resolved = ResolveStep(dict)
    >>> STEP_VALUES.values = {("seed", 0): 7}
    >>> resolved(seed=StepValue(("seed", 0)), ratio=0.1)
    {'seed': 7, 'ratio': 0.1}
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from dask.task_spec import DataNode, Task, TaskRef

from dfdl.taskgraph.pack import pack_bodies, run_cached
from dfdl.taskgraph.step_tasks import STEP_VALUES, run_local, run_serial


@dataclass(frozen=True)
class StepValue:
    """An attribute whose value comes with each run of a step program (a Dropout's seed):
    ``key`` names the input that holds it."""

    key: Any


class ResolveStep:
    """A tile function whose :class:`StepValue` attributes are looked up, as it runs, in
    the inputs of the step task running it (:data:`STEP_VALUES`)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, *inputs, **attrs):
        values = STEP_VALUES.values
        return self.fn(
            *inputs,
            **{k: values[v.key] if isinstance(v, StepValue) else v for k, v in attrs.items()},
        )

    def __reduce__(self):
        return ResolveStep, (self.fn,)


@dataclass(frozen=True)
class Program:
    """A compiled group (:func:`compile_group`).

    Attributes:
        body: ``(run_cached, token, blob, buffers, names)``: the group task's function
            and leading arguments, pickled once (:mod:`dfdl.taskgraph.pack`), the same
            for every group, and unpickled once per worker process (``token``).
        names: the inputs the body reads, in order: placeholders of the group's inputs
            (:func:`placeholder`), or keys of constants.
        constants: the constants' graph nodes the body reads (sent with each group).
        exports: output position in the task's value of each requested placeholder key
            (the carried tiles at the group's end, each step's loss).
        fixed: inputs that are the same Futures in every group (scattered constants).
    """

    body: tuple
    names: tuple
    constants: Mapping[Any, Any]
    exports: Mapping[Any, int]
    fixed: Mapping[Any, Any]


def placeholder(token: str, kind: str, *parts) -> tuple:
    """The key that stands for one input of a group in its program: ``kind`` is
    ``"batch"`` (``parts``: input name, step in group, tile), ``"scalar"`` (name, step),
    ``"carried"`` (name, tile) or ``"seed"`` (node, step)."""
    return (f"{kind}-{token}", *parts)


def compile_group(
    lowered: dict,
    wanted: list,
    optimize: Callable,
    step_values: tuple = (),
    fixed: Mapping[Any, Any] | None = None,
    serial: bool = False,
) -> Program | None:
    """The program of one group: ``lowered`` is its graph built from placeholders (every
    per-step value a :func:`placeholder` TaskRef or, for ``step_values``, a
    :class:`StepValue` attribute), ``wanted`` the placeholder keys it must give out,
    ``optimize`` the task-graph optimizer (with step tasks spanning the group, and
    without packing); ``fixed``: Futures the graph reads in every group; ``serial``: the
    group's tiles run one after another on the task's thread
    (:func:`~dfdl.taskgraph.step_tasks.run_serial`: a GPU worker's). None when the group
    does not become one task."""
    dsk = optimize(lowered, wanted)
    groups = [k for k, v in dsk.items() if type(v) is Task and v.func is run_local]
    if len(groups) != 1:
        return None
    (g,) = groups
    exports: dict = {}
    constants: dict = {}
    for key, node in dsk.items():
        if key == g:
            continue
        if type(node) is DataNode:
            constants[key] = node
        elif type(node) is Task and node.func is operator.getitem and key in wanted:
            src, pos = node.args
            if not (isinstance(src, TaskRef) and src.key == g):
                return None
            exports[key] = pos
        else:
            return None  # a task outside the group: no single-task program
    if set(exports) != set(wanted):
        return None
    task = dsk[g]
    tasks, deps, outs, outside, *values = task.args
    # per-run values no member reads as an input: they only need to be in the task's values
    task = Task(
        g,
        run_serial if serial else run_local,
        tasks,
        deps,
        outs,
        (*outside, *step_values),
        *values,
        *(TaskRef(k) for k in step_values),
    )
    packed = pack_bodies({g: task}, min_bytes=0)[g]
    if packed.func is task.func:  # the standard pickle cannot take it: no program
        return None
    blob, buffers, names = packed.args[:3]
    body = (run_cached, uuid.uuid4().hex, blob, buffers, names)
    return Program(body, tuple(names), constants, exports, dict(fixed or {}))


def instantiate(
    program: Program, key: Any, inputs: Mapping[Any, Any]
) -> tuple[dict, Callable[[Any], Any]]:
    """One group's graph from ``program``: its task under ``key`` reading ``inputs``
    (placeholder key -> a value, a Future, or a ``(Future, position)`` pair of a
    multi-output task's value); returns the graph and ``export(placeholder) ->
    position`` of each requested value in the task's value."""
    args = []
    for name in program.names:
        if name in program.constants:
            args.append(TaskRef(name))
        elif name in program.fixed:
            args.append(program.fixed[name])
        else:
            v = inputs[name]
            # an output of a multi-output task: picked inside this task, not by another
            picked = isinstance(v, tuple) and len(v) == 2 and isinstance(v[1], int)
            args.append(Task(None, operator.getitem, *v) if picked else v)
    dsk: dict = dict(program.constants)
    func, *lead = program.body
    dsk[key] = Task(key, func, *lead, *args)
    return dsk, program.exports.__getitem__


def group_options(options, steps: int):
    """``options`` (:class:`dfdl.taskgraph.optimize.GraphOptions`) for compiling a
    group of ``steps`` steps: one step task for all of them, bodies not packed (the
    program packs its own)."""
    return replace(options, steps_per_task=max(1, steps), pack=False)
