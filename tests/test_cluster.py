"""``dfdl.cluster.slurm`` and ``dfdl train --slurm`` against a real SLURM.

The module's fixture starts a single-node SLURM (Debian's slurm-wlm and munge; see
``tests/slurm_node.py``), trains a zoo model on 2 SLURM jobs whose workers have memory
limits small enough to spill, checks the losses against a LocalCluster run of the same
plan, and stops every daemon it started. Where SLURM cannot run (not root, packages
absent and not allowed to install them) those cases skip with the reason.
"""

from __future__ import annotations

import os
import subprocess
import sys

import dask
import numpy as np
import onnx
import pytest
from distributed import Client

import dfdl
import dfdl.models
from dfdl.cluster import parse_slurm
from dfdl.errors import ConfigError
from tests.slurm_node import SingleNodeSlurm, missing
from tests.test_train_spill import BATCH, SIZES, STEPS
from tests.test_train_spill import _train as train_spilling

JOB_MEMORY = "4MiB"  # one worker per job
#: Dask's process-memory checks off: the limit is far below a Python process's footprint,
#: and the bytes Dask manages (tiles) are what it bounds
MANAGED_ONLY = {
    "DASK_DISTRIBUTED__WORKER__MEMORY__TARGET": "0.6",
    "DASK_DISTRIBUTED__WORKER__MEMORY__SPILL": "False",
    "DASK_DISTRIBUTED__WORKER__MEMORY__PAUSE": "False",
    "DASK_DISTRIBUTED__WORKER__MEMORY__TERMINATE": "False",
}


def _train(client, tiles=None) -> dfdl.TrainResult:
    """The spill test's model, data and optimizer (``tests/test_train_spill.py``)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH * STEPS, SIZES[0]), dtype=np.float32)
    return train_spilling(client, (x, rng.integers(0, SIZES[-1], BATCH * STEPS)), tiles)


def _daemons_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        alive.append(pid)
    return alive


@pytest.fixture(scope="module")
def slurm_node(tmp_path_factory):
    why = missing()
    if why:
        pytest.skip(why)
    node = SingleNodeSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        node.start()
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("SLURM_CONF", str(node.conf))
            yield node
    finally:
        pids = node.stop()
    assert not _daemons_alive(pids), f"daemons still running: {_daemons_alive(pids)}"
    stray = subprocess.run(["pgrep", "-f", str(node.root)], capture_output=True, text=True)
    assert not stray.stdout.strip(), f"processes still running from {node.root}: {stray.stdout}"


def _slurm_cluster(tmp_path, **kwargs):
    return dfdl.cluster.slurm(
        cores=1,
        memory=JOB_MEMORY,
        walltime="00:10:00",
        env=MANAGED_ONLY,
        local_directory=str(tmp_path / "spill"),
        log_directory=str(tmp_path / "logs"),
        **kwargs,
    )


def test_trains_on_two_slurm_jobs_spilling_with_the_local_numbers(slurm_node, tmp_path):
    with _slurm_cluster(tmp_path, jobs=2) as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=120)
        workers = client.scheduler_info()["workers"].values()
        assert sorted(w["memory_limit"] for w in workers) == [4 * 2**20] * 2
        queued = subprocess.run(
            ["squeue", "-h", "-o", "%i %T"], env=slurm_node.env, capture_output=True, text=True
        ).stdout.split("\n")
        assert sum("RUNNING" in line for line in queued) == 2, queued
        on_slurm = _train(client)
    assert sum(on_slurm.history["spilled_bytes"]) > 0  # the workers spilled to disk
    # the same numbers as the same plan on one worker process, and on two on this node:
    # each job's worker runs its share of every step and exchanges values with the other
    for processes in (1, 2):
        with dfdl.LocalCluster(processes) as local, Client(local) as client:
            at_home = _train(client, tiles=on_slurm.tiles)
        assert on_slurm.history["loss"] == at_home.history["loss"], processes
        for k in at_home.params:
            np.testing.assert_array_equal(on_slurm.params[k], at_home.params[k], err_msg=k)
    left = subprocess.run(["squeue", "-h"], env=slurm_node.env, capture_output=True, text=True)
    assert "RUNNING" not in left.stdout  # closing the cluster cancelled the jobs


def test_slurm_jobs_over_tls_with_temporary_credentials(slurm_node, tmp_path):
    """security=True: the scheduler and the jobs' workers speak tls:// with throwaway
    credentials written where the jobs read them; a client without them is refused."""
    from distributed.security import Security

    from dfdl.runtime.cluster import open_client

    with (
        _slurm_cluster(tmp_path, jobs=1, security=True, shared_temp_directory=str(tmp_path)) as cl,
        Client(cl) as client,
    ):
        client.wait_for_workers(1, timeout=120)
        assert cl.scheduler_address.startswith("tls://")
        assert all(a.startswith("tls://") for a in client.scheduler_info()["workers"])
        result = _train(client)
        assert len(result.history["loss"]) == STEPS
        with pytest.raises(ConfigError, match="cannot connect"):
            open_client(cl.scheduler_address, Security.temporary(), timeout=5)


def test_command_line_trains_on_slurm(slurm_node, tmp_path):
    onnx.save(dfdl.models.mlp((16, 32, 4)), str(tmp_path / "mlp.onnx"))
    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "d.npz",
        X=rng.standard_normal((64, 16), dtype=np.float32),
        y=rng.integers(0, 4, 64),
    )
    r = subprocess.run(
        [
            sys.executable, "-m", "dfdl", "train", "mlp.onnx", "--data", "d.npz",
            "--batch-size", "16", "--slurm", "jobs=2,cores=1,memory=512MiB,walltime=00:05:00",
            "-o", "out.onnx",
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "waiting for 2 Dask workers from SLURM jobs" in r.stdout
    assert (tmp_path / "out.onnx").is_file()


def test_job_script_asks_for_what_was_given():
    cluster = dfdl.cluster.slurm(
        jobs=0,
        cores=8,
        memory="32GiB",
        processes=2,
        walltime="1-02:00:00",
        queue="gpu",
        account="proj42",
        gpus=2,
        local_directory="$TMPDIR/dfdl",
        job_directives=["--qos=long"],
    )
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    for line in (
        "#SBATCH -p gpu",
        "#SBATCH -A proj42",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH -t 1-02:00:00",
        "#SBATCH --gres=gpu:2",
        "#SBATCH --qos=long",
        "mkdir -p $TMPDIR/dfdl",
        "export DASK_INTERNAL_INHERIT_CONFIG=",
    ):
        assert line in script, (line, script)
    assert "--nworkers 2" in script and "--nthreads 4" in script
    assert "--resources GPU=1" in script
    assert "--preload dfdl.runtime.worker_setup" in script  # heap trimmer, quiet pauses
    config = script.split("DASK_INTERNAL_INHERIT_CONFIG=")[1].split()[0].strip("'")
    inherited = dask.config.deserialize(config)
    # the malloc settings dfdl gives its own workers, scaled to 16 GiB per worker
    assert inherited["distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"] == 2**27
    # and the quieter event loops (profiler, tick) of dfdl's own workers
    assert inherited["distributed.worker.profile.interval"] == "100ms"
    assert inherited["distributed.admin.tick.interval"] == "100ms"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"cores": 0, "memory": "1GiB"}, "cores must be a positive integer"),
        ({"cores": 2, "memory": "lots"}, "memory must be a positive byte count"),
        ({"cores": 2, "memory": "1GiB", "walltime": "2h"}, "walltime must look like"),
        ({"cores": 2, "memory": "1GiB", "processes": 3}, "cannot exceed cores"),
        ({"cores": 2, "memory": "1GiB", "jobs": -1}, "jobs must be a non-negative"),
        ({"cores": 2, "memory": "1GiB", "gpus": -1}, "gpus must be a non-negative"),
    ],
)
def test_bad_arguments_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        dfdl.cluster.slurm(**kwargs)


def test_parse_slurm():
    assert parse_slurm("jobs=4,cores=16,memory=64GiB,walltime=02:00:00") == {
        "jobs": 4,
        "cores": 16,
        "memory": "64GiB",
        "walltime": "02:00:00",
    }
    assert (
        parse_slurm("cores=2,memory=1GiB,partition=gpu,local-directory=/scratch")["local_directory"]
        == "/scratch"
    )
    with pytest.raises(ConfigError, match="'nodes=2' is not KEY=VALUE"):
        parse_slurm("nodes=2,cores=2,memory=1GiB")
    with pytest.raises(ConfigError, match="jobs must be an integer"):
        parse_slurm("jobs=many,cores=2,memory=1GiB")
    with pytest.raises(ConfigError, match="needs memory"):
        parse_slurm("jobs=2,cores=2")


def test_slurm_keeps_the_sigint_handler_dask_jobqueue_replaces():
    """Importing dask-jobqueue installs a SIGINT handler that calls ``sys.exit()`` (a
    Ctrl-C would exit with status 0); dfdl's SLURM support imports it without that."""
    pytest.importorskip("dask_jobqueue")
    check = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); {}; "
        "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    )
    outs = [
        subprocess.run(
            [sys.executable, "-c", check.format(how)], capture_output=True, text=True, timeout=120
        ).stdout.strip()
        for how in (
            "import dask_jobqueue",
            "from dfdl.runtime.slurm import _slurm_cluster_class; _slurm_cluster_class()",
        )
    ]
    assert outs == ["False", "True"]
