"""A step's tiles shared out over several worker processes (``dfdl.taskgraph.partition``
and ``group_steps`` with ``place``): the same values, each worker's share of a step as
one task per stage, each task on its worker."""

from __future__ import annotations

import operator
from collections import Counter

import dask.threaded
import numpy as np
import pytest
from dask.local import get_sync
from dask.task_spec import DataNode, Task, TaskRef
from dask.utils import key_split
from distributed import get_task_stream

import dfdl
import dfdl.models
from dfdl.ir.onnx_io import to_ir
from dfdl.ops.registry import TensorType
from dfdl.plan.compile import Workers, compile_step
from dfdl.runtime.session import EngineOptions
from dfdl.taskgraph import exchange, step_tasks
from dfdl.taskgraph.fuse import fused
from dfdl.taskgraph.lower import lower, split_tiles
from dfdl.taskgraph.optimize import GraphOptions, worker_restrictions
from dfdl.taskgraph.partition import replicate_merges, stripped, tile_parts
from dfdl.taskgraph.step_tasks import group_steps, run_exchange, run_local, run_serial
from dfdl.taskgraph.tile_exec import Outputs, assemble_task, run_tile
from tests.taskgraph.test_fuse import _train


def _t(key, fn, *args):
    return Task(key, fn, *(TaskRef(a) if isinstance(a, tuple) else a for a in args))


def _batchnorm_like():
    """One step on two batch tiles: a layer, a merge of both tiles' sums (what
    BatchNormalization's moments are), a second layer reading the merge, a loss."""
    dsk = {("w", 0): DataNode(("w", 0), 3.0)}
    for i in (0, 1):
        dsk[("x", 0, i)] = DataNode(("x", 0, i), float(i + 2))
        dsk[("a", 0, i)] = _t(("a", 0, i), operator.mul, ("x", 0, i), ("w", 0))
    dsk[("m", 0)] = _t(("m", 0), operator.add, ("a", 0, 0), ("a", 0, 1))
    for i in (0, 1):
        dsk[("c", 0, i)] = _t(("c", 0, i), operator.sub, ("a", 0, i), ("m", 0))
    dsk[("loss", 0)] = _t(("loss", 0), operator.add, ("c", 0, 0), ("c", 0, 1))
    return dsk


def _place(key):
    return key[2] if key[0] in ("a", "c") else None


KEEP = [("loss", 0)]


def _grouped(dsk, place=_place):
    return group_steps(dsk, keep=KEEP, name=lambda s: ("step", s), place=place, parts=2, strip=str)


def _members(out):
    """Each per-worker task's key with the keys of the tasks it runs."""
    return {
        k: [t.key for t in v.args[0]]
        for k, v in out.items()
        if getattr(v, "func", None) in (run_local, run_serial)
    }


def test_each_worker_s_share_runs_as_its_own_tasks_with_the_same_values():
    dsk = _batchnorm_like()
    out = _grouped(dsk)
    assert get_sync(out, KEEP) == get_sync(dsk, KEEP)
    groups = _members(out)
    for (_, _, part, _), members in groups.items():
        assert {_place(m) for m in members} - {None} <= {part}
    # the merge waits for both tiles: the second layer is a later stage on each worker
    stage = {m: g[3] for g, ms in groups.items() for m in ms}
    for i in (0, 1):
        assert stage[("c", 0, i)] > stage[("a", 0, i)]


def test_a_member_another_worker_reads_ends_its_task():
    dsk = _batchnorm_like()
    groups = _members(_grouped(dsk))
    (merge_group,) = [g for g, ms in groups.items() if ("m", 0) in ms]
    part = merge_group[2]
    # the reader on the merge's own worker starts a new task: the other worker gets the
    # merge when that task ends, not after the reader too
    reader = ("c", 0, part)
    assert not any(("m", 0) in ms and reader in ms for ms in groups.values())


def test_with_peers_each_worker_s_share_is_one_task_passing_values_directly():
    dsk = _batchnorm_like()
    out = group_steps(
        dsk, keep=KEEP, name=lambda s: ("step", s), place=_place, parts=2, strip=str,
        peers=("w0", "w1"),
    )  # fmt: skip
    groups = {k: v for k, v in out.items() if getattr(v, "func", None) is run_exchange}
    assert sorted(groups) == [("step", 0, 0, 0), ("step", 0, 1, 0)]
    # no dependency between the two: what crosses is sent; the worker that only sends
    # is waited for by the requested loss, so Dask keeps it and its errors surface
    for g, node in groups.items():
        assert not node.dependencies & set(groups), g
    assert {("step", 0, 0, 0), ("step", 0, 1, 0)} <= out[("loss", 0)].dependencies
    # both run at once (threads stand in for workers: values go to this process's mailbox)
    assert dask.threaded.get(out, KEEP, num_workers=2) == get_sync(dsk, KEEP)


def _two_steps():
    """Two steps of :func:`_batchnorm_like`: worker 1 updates the weight after step 0
    (from the merge), and both workers' step-1 tiles read the update."""
    dsk = _batchnorm_like()
    dsk[("u", 0, 1)] = _t(("u", 0, 1), operator.add, ("w", 0), ("m", 0))
    for i in (0, 1):
        dsk[("x", 1, i)] = DataNode(("x", 1, i), float(i + 5))
        dsk[("a", 1, i)] = _t(("a", 1, i), operator.mul, ("x", 1, i), ("u", 0, 1))
    dsk[("loss", 1)] = _t(("loss", 1), operator.add, ("a", 1, 0), ("a", 1, 1))
    return dsk


def test_steps_named_alike_run_as_one_share_per_worker_passing_updates_directly():
    dsk = _two_steps()
    keep = [("loss", 0), ("loss", 1)]
    out = group_steps(
        dsk, keep=keep, name=lambda s: ("step", s - s % 2),
        place=lambda k: k[2] if k[0] in ("a", "c", "u") else None,
        parts=2, strip=str, peers=("w0", "w1"),
    )  # fmt: skip
    groups = {k: v for k, v in out.items() if getattr(v, "func", None) is run_exchange}
    assert sorted(groups) == [("step", 0, 0, 0), ("step", 0, 1, 0)]
    members = {g: {t.key for t in v.args[0]} for g, v in groups.items()}
    # worker 0 runs its tiles of both steps, and takes worker 1's update as a value sent
    assert {("a", 0, 0), ("a", 1, 0)} <= members[("step", 0, 0, 0)]
    assert ("u", 0, 1) in members[("step", 0, 0, 0)] & members[("step", 0, 1, 0)]
    for g, node in groups.items():
        assert not node.dependencies & set(groups), g
    assert dask.threaded.get(out, keep, num_workers=2) == get_sync(dsk, keep)


def _two_outputs(x):
    return Outputs((np.full(1000, x), x + 1.0))


def _exchanged(dsk, monkeypatch):
    """``dsk`` grouped for two workers exchanging directly (the key's last index is the
    worker) and run: worker 0's share's ``owed`` entries ``(key, workers, parts)``, the
    loss, and the one packed value (``Outputs``) it sent."""
    out = group_steps(
        dsk, keep=KEEP, name=lambda s: ("step", s), place=lambda k: k[2] if len(k) > 2 else None,
        parts=2, strip=str, peers=("w0", "w1"),
    )  # fmt: skip
    (share,) = [v for k, v in out.items() if k[:3] == ("step", 0, 0)]
    tasks, owed = share.args[0], share.args[3]
    sent = []
    deliver = exchange.deliver
    monkeypatch.setattr(exchange, "deliver", lambda k, v: sent.append(v) or deliver(k, v))
    got = dask.threaded.get(out, KEEP, num_workers=2)
    (packed,) = [v for v in sent if isinstance(v, Outputs)]  # (and r's value, for the loss)
    return [(tasks[i].key, ps, parts) for i, ps, parts in owed], got, packed


def test_a_worker_is_sent_only_the_parts_of_a_packed_value_it_reads(monkeypatch):
    """A fused task's packed value (its output and what it carries): the other worker's
    members take one part of it, and only that part travels."""
    dsk = {("x", 0, 0): DataNode(("x", 0, 0), 2.0)}
    dsk[("p", 0, 0)] = _t(("p", 0, 0), _two_outputs, ("x", 0, 0))
    dsk[("q", 0, 0)] = Task(
        ("q", 0, 0), np.sum, Task("t", operator.getitem, TaskRef(("p", 0, 0)), 0)
    )
    dsk[("r", 0, 1)] = Task(("r", 0, 1), abs, Task("u", operator.getitem, TaskRef(("p", 0, 0)), 1))
    dsk[("loss", 0)] = _t(("loss", 0), operator.add, ("q", 0, 0), ("r", 0, 1))
    owed, got, packed = _exchanged(dsk, monkeypatch)
    assert owed == [(("p", 0, 0), (1,), ((1,),))]
    assert got == get_sync(dsk, KEEP) == (2003.0,)
    assert packed[0] is None and packed[1] == 3.0


def _two_arrays(x):
    return Outputs((np.full(1000, x), np.array([x + 1.0])))


def _picks(i):
    """A tile task's meta that takes output ``i`` of its first input (None: all of it)."""
    spec = ("value", 0) if i is None else ("pick", 0, i)
    return (np.negative, {}, [spec], [None], "r")


@pytest.mark.parametrize(
    "reader, parts",
    [
        ("tile", (1,)),
        ("fused", (1,)),
        ("fused-getitem", (1,)),
        ("assemble", (1,)),
        ("whole", None),
    ],
)
def test_parts_read_through_tile_specs_and_fused_tasks(reader, parts, monkeypatch):
    """What the other worker's members take of a packed value is read from the tile
    tasks' input specs (``pick``), inside fused tasks too, whether a fused task reads the
    value whole and its member picks or it reads the part; a tile task that reads the
    value whole (``value``) is sent all of it."""
    dsk = {("x", 0, 0): DataNode(("x", 0, 0), 2.0)}
    dsk[("p", 0, 0)] = _t(("p", 0, 0), _two_arrays, ("x", 0, 0))
    dsk[("q", 0, 0)] = Task(
        ("q", 0, 0), np.sum, Task("t", operator.getitem, TaskRef(("p", 0, 0)), 0)
    )
    r, p = ("r", 0, 1), TaskRef(("p", 0, 0))
    if reader == "tile":
        dsk[r] = Task(r, run_tile, _picks(1), p)
    elif reader == "fused":
        dsk[r] = fused(Task("in", run_tile, _picks(1), p), Task(r, abs, TaskRef("in")), key=r)
    elif reader == "fused-getitem":
        inner = fused(Task("in", abs, TaskRef("v")), Task(r, np.negative, TaskRef("in")), key=r)
        dsk[r] = inner.substitute({"v": Task("v", operator.getitem, p, 1)})
    elif reader == "assemble":
        dsk[r] = Task(r, assemble_task, (1,), [(0, 1, slice(None), slice(0, 1))], p)
    else:
        dsk[r] = Task(r, run_tile, (operator.itemgetter(1), {}, [("value", 0)], [None], "r"), p)
    dsk[("loss", 0)] = Task(
        ("loss", 0), np.add, TaskRef(("q", 0, 0)), Task("s", np.sum, TaskRef(r))
    )
    owed, got, packed = _exchanged(dsk, monkeypatch)
    assert [(key, parts_) for key, _, parts_ in owed] == [(("p", 0, 0), (parts,))]
    assert got == get_sync(dsk, KEEP)
    assert (packed[0] is None) == (parts is not None) and packed[1] == 3.0


def test_a_tiny_merge_is_computed_again_on_each_worker_that_reads_it():
    dsk = _batchnorm_like()
    copied, place = replicate_merges(dsk, KEEP, _place, tiny=lambda k: True)
    assert ("m", 0) not in copied
    assert {place(k) for k in copied if k[0] == "m"} == {0, 1}
    assert get_sync(copied, KEEP) == get_sync(dsk, KEEP)
    out = _grouped(copied, place)
    assert get_sync(out, KEEP) == get_sync(dsk, KEEP)
    # each worker merges the sums itself, in the task of the layer that reads them: one
    # task before the exchange and one after (and the loss, another exchange, on one)
    groups = _members(out)
    for i in (0, 1):
        assert any(("m", 0, f"on{i}") in ms and ("c", 0, i) in ms for ms in groups.values())
    assert Counter(g[2] for g in groups) == {0: 3, 1: 2}


def _wide_batchnorm_like(n):
    """:func:`_batchnorm_like` on ``n`` batch tiles, each on its own worker."""
    dsk = {("w", 0): DataNode(("w", 0), 3.0)}
    for i in range(n):
        dsk[("x", 0, i)] = DataNode(("x", 0, i), float(i + 2))
        dsk[("a", 0, i)] = _t(("a", 0, i), operator.mul, ("x", 0, i), ("w", 0))
    dsk[("m", 0)] = _t(("m", 0), _total, *[("a", 0, i) for i in range(n)])
    for i in range(n):
        dsk[("c", 0, i)] = _t(("c", 0, i), operator.sub, ("a", 0, i), ("m", 0))
    dsk[("loss", 0)] = _t(("loss", 0), _total, *[("c", 0, i) for i in range(n)])
    return dsk


def _total(*values):
    return sum(values)


def test_on_many_workers_a_merge_reaches_the_others_down_a_tree():
    n = 21
    dsk = _wide_batchnorm_like(n)
    copied, place = replicate_merges(dsk, KEEP, _place, tiny=lambda k: True)
    assert get_sync(copied, KEEP) == get_sync(dsk, KEEP)
    copies = {k: v for k, v in copied.items() if k[0] == "m"}
    assert {place(k) for k in copies} == set(range(n))
    # four workers merge the sums themselves; each other worker reads one earlier copy
    computing = [k for k, v in copies.items() if ("a", 0, 0) in v.dependencies]
    assert sorted(place(k) for k in computing) == [0, 1, 2, 3]
    sends = Counter()
    for k, v in copies.items():
        if k not in computing:
            (parent,) = v.dependencies
            assert place(parent) < place(k)
            sends[parent] += 1
    assert max(sends.values()) == 4  # no worker sends the merge to more than four
    depth = {k: 0 for k in computing}
    for k in sorted(copies, key=place):
        if k not in depth:
            (parent,) = copies[k].dependencies
            depth[k] = depth[parent] + 1
    assert max(depth.values()) == 2  # 4 + 16 + 1 workers: two hops at most
    # (the shares passing values directly need one mailbox per worker: a cluster's
    # processes, tests/test_train.py::test_bit_identical_on_one_and_six_workers)


def test_a_large_merge_is_not_copied():
    dsk = _batchnorm_like()
    copied, _ = replicate_merges(dsk, KEEP, _place, tiny=lambda k: False)
    assert copied == dsk


def test_the_restrictions_pin_each_task_and_its_outputs_to_its_worker():
    dsk = {
        ("train-step-ab12cd34", 0, 1, 2): Task(("train-step-ab12cd34", 0, 1, 2), tuple, [1]),
        ("w", 1): Task(("w", 1), operator.getitem, TaskRef(("train-step-ab12cd34", 0, 1, 2)), 0),
        ("other", 0): Task(("other", 0), abs, -1),
    }
    pinned = worker_restrictions(dsk, "ab12cd34", ["tcp://a:1", "tcp://b:2"])
    assert pinned == {("train-step-ab12cd34", 0, 1, 2): ["tcp://b:2"], ("w", 1): ["tcp://b:2"]}


def test_stripped_keys_are_the_same_in_every_step():
    assert stripped(("conv-fwd-ab12cd34", 0, 1, 0), "ab12cd34") == stripped(
        ("conv-fwd-ab12cd34", 7, 1, 0), "ab12cd34"
    )


@pytest.fixture(scope="module")
def resnet_like():
    return dfdl.models.resnet(
        in_channels=2, image_size=8, stem=4, stages=(4, 8), blocks_per_stage=1, num_classes=3
    )


def test_tile_parts_follow_the_batch_tile_and_leave_reductions_open(resnet_like):
    sp = compile_step(
        to_ir(resnet_like),
        {"x": TensorType((8, 2, 8, 8), np.float32)},
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=0.1, momentum=0.9),
        labels=TensorType((8,), np.int64),
        tiles={"batch": 2, "model": 1, "split_norms": 1},
        workers=Workers(2, 2, 1),
    )
    dsk, _ = lower(sp.plan, _sources(sp), step=3, token="ab12cd34")
    part = tile_parts([sp], "ab12cd34", 2)
    convs = [k for k in dsk if k[0] == "stem.conv-fwd-ab12cd34"]
    assert sorted(convs) == [("stem.conv-fwd-ab12cd34", 3, n, 0, 0, 0) for n in (0, 1)]
    assert [part(k) for k in sorted(convs)] == [0, 1]
    # the moments' partial sums go with their batch tile; the merged moments and the
    # weights' update are no batch tile's: grouping places them
    partials = sorted(k for k in dsk if k[0] == "stem.bn.moments-fwd-partial-ab12cd34")
    assert [part(k) for k in partials] == [0, 1]
    updates = [k for k in dsk if "-update-" in k[0]]
    moments = [k for k in dsk if k[0] == "stem.bn.moments-fwd-ab12cd34"]
    assert updates and moments
    assert {part(k) for k in updates + moments} == {None}
    # three workers: the two batch tiles go to the first and the second
    assert [tile_parts([sp], "ab12cd34", 3)(k) for k in sorted(convs)] == [0, 1]


def _sources(sp):
    """Every input of a step plan as numpy tiles (zeros where not a constant)."""
    graph = sp.plan.graph
    made = {o for n in graph.nodes for o in n.outputs}
    return {
        name: split_tiles(
            np.asarray(graph.initializers[name])
            if name in graph.initializers
            else np.zeros(graph.types[name].shape, graph.types[name].dtype),
            chunks,
        )
        for name, chunks in sp.plan.chunks.items()
        if name not in made
    }


def test_two_workers_train_bit_identically_to_one_with_per_worker_tasks(client, resnet_like):
    from distributed import Client

    tiles = {"batch": 2, "model": 1, "split_norms": 1}
    with (
        dfdl.LocalCluster(1, threads_per_worker=2, memory_limit="1GiB") as cluster,
        Client(cluster) as one,
    ):
        alone, _ = _train(resnet_like, one, EngineOptions(), tiles)
    per_tile, n_tiles = _train(
        resnet_like, client, EngineOptions(graph=GraphOptions(worker_tasks=False)), tiles
    )
    with get_task_stream(client) as ts:
        shared, _ = _train(resnet_like, client, EngineOptions(), tiles)
    for run in (per_tile, shared):
        assert run.history["loss"] == alone.history["loss"]
        for k, v in alone.params.items():
            np.testing.assert_array_equal(run.params[k], v, err_msg=k)
    steps = [r for r in ts.data if key_split(r["key"]) == step_tasks.STEP_NAME]
    assert len(ts.data) < n_tiles, (len(ts.data), n_tiles)
    # each worker ran its own share: a part's tasks all on one worker, the parts apart
    workers = sorted(client.scheduler_info()["workers"])
    by_part = {}
    for r in steps:
        key = eval(r["key"]) if isinstance(r["key"], str) else r["key"]  # noqa: S307
        by_part.setdefault(key[2], set()).add(r["worker"])
    assert by_part == {0: {workers[0]}, 1: {workers[1]}}, by_part


def _mlp_split_by_the_model():
    return compile_step(
        to_ir(dfdl.models.mlp((32, 512, 512, 4))),
        {"x": TensorType((4, 32), np.float32)},
        loss="cross_entropy",
        optimizer=dfdl.optim.SGD(lr=0.1, momentum=0.9),
        labels=TensorType((4,), np.int64),
        tiles={"batch": 1, "model": 2, "min_weight_tile": 1024},
        workers=Workers(2, 2, 1),
    )


def test_split_by_the_model_a_weight_tile_is_read_on_one_worker():
    """The forward's partial products and the input gradient's read the same weight
    tiles: both run on the worker of the tile's rows (where its gradient and update
    run), so the partial sums travel between the workers and the weights never do."""
    sp = _mlp_split_by_the_model()
    sources = _sources(sp)
    for name in sp.tg.params:
        if len(sources[name]) > 1:
            sources[name] = {idx: TaskRef(("w", name, *idx)) for idx in sources[name]}
    dsk, _ = lower(sp.plan, sources, step=3, token="ab12cd34")
    part = tile_parts([sp], "ab12cd34", 2)
    workers: dict = {}
    for k, node in dsk.items():
        for d in getattr(node, "dependencies", ()):
            if d[0] == "w" and part(k) is not None:
                workers.setdefault(d, set()).add(part(k))
    # the input gradient's partial products (dX = dY @ W, summed over W's rows) are there
    assert any(k[0] == "layers.1.Gemm-bwd-partial-ab12cd34" for k in dsk)
    assert len(workers) == 4 and all(len(w) == 1 for w in workers.values()), workers
    assert {next(iter(w)) for w in workers.values()} == {0, 1}
    # the last layer's input gradient (4 classes x 512 features): its weight and dY
    # tiles are small, its partial sums 4 x 256 floats: it runs where its sum does
    last = [k for k in dsk if k[0] == "layers.2.Gemm-bwd-partial-ab12cd34"]
    assert last
    for k in last:
        readers = {part(r) for r, node in dsk.items() if k in getattr(node, "dependencies", ())}
        assert readers == {part(k)}, (k, part(k), readers)


def _fetched(dask_worker) -> list:
    """The keys this worker fetched from other workers through Dask since the last call."""
    keys = [k for entry in dask_worker.transfer_incoming_log for k in entry["keys"]]
    dask_worker.transfer_incoming_log.clear()
    return keys


def test_two_workers_split_by_the_model_fetch_no_weight_nor_batch_tile(client):
    """Between groups of steps nothing large crosses through Dask: each worker updates
    and reads its own weight tiles, and the batch reaches each worker that reads it
    from the client (trainer._send_batches); the same bits as one worker."""
    from distributed import Client

    model = dfdl.models.mlp((512, 512, 512, 10))
    rng = np.random.default_rng(3)
    # a batch of 128 KiB, read whole by both workers (above fuse.TINY_BYTES: not inlined)
    x, y = rng.standard_normal((512, 512), dtype=np.float32), rng.integers(0, 10, 512)
    kw = dict(
        data=(x, y),
        optimizer=dfdl.optim.SGD(lr=0.01, momentum=0.9),
        batch_size=64,
        steps=8,
        shuffle=False,
        tiles={"batch": 1, "model": 2, "min_weight_tile": 4096},
        progress=False,
    )
    client.run(_fetched)
    two = dfdl.train(model, client=client, **kw)
    fetched = [k for ks in client.run(_fetched).values() for k in ks]
    names = [key_split(k) for k in fetched]
    assert not [n for n in names if n.endswith("-input")], names
    assert not [n for n in names if ".weight" in n and not n.endswith("-init")], names
    with (
        dfdl.LocalCluster(1, threads_per_worker=2, memory_limit="1GiB") as cluster,
        Client(cluster) as one_client,
    ):
        one = dfdl.train(model, client=one_client, **kw)
    assert two.history["loss"] == one.history["loss"]
    for k, v in one.params.items():
        np.testing.assert_array_equal(two.params[k], v, err_msg=k)
