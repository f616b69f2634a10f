"""Config scoped to a thread (dfdl.plan.scoped_config): two plans made at once, as the
trials of dfdl.tune make them, leave the process's dask config as it was."""

from __future__ import annotations

import threading

import dask
import distributed  # noqa: F401 - Dask's distributed.* defaults in the config

from dfdl.plan.compile import Workers, inference_plan
from dfdl.plan.estimate import start_line
from dfdl.plan.scoped_config import config_get, scoped_config
from dfdl.runtime.cluster import worker_memory_config

PAUSE = "distributed.worker.memory.pause"


def test_scoped_entries_override_the_global_config_in_their_block_only():
    with dask.config.set({PAUSE: 0.8, "distributed.worker.memory.spill": 0.7}):
        assert start_line() == 0.8
        with scoped_config({PAUSE: 0.75}):
            assert config_get(PAUSE) == 0.75 and start_line() == 0.75
            with scoped_config({PAUSE: False}):  # the inner block wins, False included
                assert config_get(PAUSE) is False and start_line() == 0.7
            assert config_get(PAUSE) == 0.75
        assert start_line() == 0.8
    assert config_get("dfdl.no-such-key", "default") == "default"


def test_blocks_that_overlap_in_two_threads_leave_the_global_config_as_it_was():
    """The interleaving that leaks with dask.config.set: A enters, B enters, A leaves,
    B leaves (B restores the value it found, A's)."""
    before = dask.config.get(PAUSE)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with scoped_config({PAUSE: 0.7}):
            a_in.set()
            b_in.wait(10)
            seen["a"] = config_get(PAUSE)
        a_out.set()

    def b():
        a_in.wait(10)
        with scoped_config({PAUSE: 0.6}):
            b_in.set()
            a_out.wait(10)
            seen["b"] = config_get(PAUSE)

    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert seen == {"a": 0.7, "b": 0.6}  # each thread saw its own value
    assert dask.config.get(PAUSE) == before == config_get(PAUSE)


def test_a_plan_under_the_workers_thresholds_shows_them_to_no_other_thread():
    import dfdl.models
    from dfdl.ir.onnx_io import to_ir
    from dfdl.ops.registry import TensorType

    before = dask.config.get(PAUSE)
    thresholds = {**worker_memory_config(), PAUSE: 0.625}
    workers = Workers(2, 2, 1, memory_limit=2**30, thresholds=thresholds)
    graph = to_ir(dfdl.models.mlp([8, 16, 3]))
    seen, planned, stop = set(), [], threading.Event()

    def plan():
        while not stop.is_set():
            inference_plan(graph, {"x": TensorType((4, 8), "float32")}, workers=workers)
            planned.append(1)

    thread = threading.Thread(target=plan)
    thread.start()
    samples = 0
    try:  # what another thread (another trial) reads while this one plans, many times
        # (both counts: under load the planner may finish 20 plans before the first sample)
        while (len(planned) < 20 or samples < 1000) and thread.is_alive():
            seen.add(dask.config.get(PAUSE))
            samples += 1
    finally:
        stop.set()
        thread.join(30)
    assert len(planned) >= 20, "the planning thread stopped (see its exception above)"
    assert samples >= 1000 and seen == {before}
