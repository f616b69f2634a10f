"""Task bodies pickled once when built (``dfdl.taskgraph.pack``): same values and
dependencies, arrays kept out of the pickle."""

from __future__ import annotations

import operator
import pickle

import numpy as np
from dask.local import get_sync
from dask.task_spec import DataNode, Task, TaskRef

from dfdl.taskgraph.pack import pack_bodies, run_packed


def _graph(data):
    return {
        "x": DataNode("x", 2.0),
        "small": Task("small", abs, TaskRef("x")),
        # a body with nested tasks, as fusion and step tasks build them
        "big": Task(
            "big",
            operator.add,
            Task("inner", np.multiply, data, TaskRef("x")),
            Task("other", np.sum, TaskRef("small")),
        ),
    }


def test_large_bodies_are_packed_with_the_same_values_and_dependencies():
    data = np.arange(50_000, dtype=np.float32)
    dsk = _graph(data)
    out = pack_bodies(dsk, min_bytes=256)
    assert out["big"].func is run_packed
    assert out["small"] is dsk["small"]  # below min_bytes: as it was
    assert out["x"] is dsk["x"]  # data stays data
    assert out["big"].dependencies == dsk["big"].dependencies == {"x", "small"}
    np.testing.assert_array_equal(get_sync(out, "big"), get_sync(dsk, "big"))


def test_arrays_travel_beside_the_pickle_not_inside_it():
    data = np.arange(50_000, dtype=np.float32)
    out = pack_bodies(_graph(data), min_bytes=256)
    blob, buffers = out["big"].args[:2]
    assert len(blob) < 4096 < data.nbytes
    assert [b.nbytes for b in buffers] == [data.nbytes]
    # the packed task itself pickles the way Dask sends it, and still runs
    again = pickle.loads(pickle.dumps(out["big"], protocol=5))
    np.testing.assert_array_equal(again({"x": 2.0, "small": 2.0}), data * 2.0 + 2.0)


def test_a_body_that_pickle_cannot_take_stays_as_dask_sends_it():
    local = lambda v: v + 1  # noqa: E731  (cloudpickle, not pickle, sends a lambda)
    dsk = {"y": Task("y", local, 2)}
    out = pack_bodies(dsk, min_bytes=0)
    assert out["y"] is dsk["y"]
    assert get_sync(out, "y") == 3
