"""Step programs (dfdl.taskgraph.program): a group of steps compiled once into one task
and run again on later groups' inputs trains to the same bits as graphs built step by
step, Dropout seeds and BatchNorm buffers included, on a real one-worker cluster."""

from __future__ import annotations

import numpy as np
import pytest
from distributed import Client

import dfdl
import dfdl.runtime.trainer as trainer
import dfdl.taskgraph.program as program
from dfdl.models import ZOO
from dfdl.runtime.session import EngineOptions
from dfdl.taskgraph.optimize import GraphOptions
from dfdl.taskgraph.program import ResolveStep, StepValue
from dfdl.taskgraph.step_tasks import STEP_VALUES

PROGRAMS = EngineOptions(graph=GraphOptions(programs=True, steps_per_task=4))

MODELS = {
    "mlp": (dict(sizes=(12, 16, 4)), lambda: dfdl.optim.SGD(lr=0.1, momentum=0.9)),
    "transformer": (
        dict(vocab=11, d_model=8, heads=2, ff=16, layers=1, seq=5, num_classes=3, dropout=0.2),
        lambda: dfdl.optim.AdamW(lr=0.01, weight_decay=0.01),
    ),
    "resnet": (
        dict(in_channels=1, image_size=8, stem=4, stages=(4,), blocks_per_stage=1, num_classes=3),
        lambda: dfdl.optim.SGD(lr=0.05, momentum=0.9),
    ),
}


@pytest.fixture(scope="module")
def one_worker():
    with dfdl.LocalCluster(1, threads_per_worker=2) as cluster, Client(cluster) as client:
        yield client


def _data(name: str, kw: dict, n: int):
    (X,) = dfdl.models.example_inputs(name, batch=n, seed=1, **kw).values()
    classes = kw["sizes"][-1] if name == "mlp" else kw["num_classes"]
    return X, np.random.default_rng(2).integers(0, classes, size=(n,), dtype=np.int64)


@pytest.mark.parametrize("serial", [False, True], ids=["threads", "serial"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_programs_train_to_the_same_bits_and_compile_once(name, serial, one_worker, monkeypatch):
    kw, optimizer = MODELS[name]
    if serial:  # as a GPU worker runs them: the tiles one after another on the task's thread
        real = program.compile_group
        monkeypatch.setattr(
            program, "compile_group", lambda *a, **k: real(*a, **{**k, "serial": True})
        )
    X, y = _data(name, kw, 40)  # 10 steps of 4: groups of 4, 4 and 2
    common = dict(data=(X, y), batch_size=4, epochs=1, shuffle=False, client=one_worker)
    plain = dfdl.train(ZOO[name](**kw), optimizer=optimizer(), **common)
    compiled = []
    original = trainer._compile_program
    monkeypatch.setattr(
        trainer, "_compile_program", lambda *a, **k: compiled.append(1) or original(*a, **k)
    )
    fast = dfdl.train(ZOO[name](**kw), optimizer=optimizer(), engine=PROGRAMS, **common)
    assert fast.history["loss"] == plain.history["loss"]
    for k, v in plain.params.items():
        np.testing.assert_array_equal(fast.params[k], v, err_msg=k)
    assert len(compiled) == 2  # the groups of 4 steps share one program; the last has its own


def test_a_step_value_is_read_from_the_running_step_task():
    fn = ResolveStep(lambda **attrs: attrs)
    STEP_VALUES.values = {("seed", 3): 11}
    assert fn(seed=StepValue(("seed", 3)), ratio=0.5) == {"seed": 11, "ratio": 0.5}
