"""A real single-node SLURM for tests: Debian's slurm-wlm and munge, started and stopped here.

Everything lives in one folder: a munge key, munged's socket, ``slurm.conf`` (the node
line from ``slurmd -C``, no systemd or cgroups), state, spool and logs. The daemons run
in the foreground as children of this process, so they are stopped by pid, and nothing
outside the folder is touched.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge")
BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sinfo", "sbatch")
#: set by .ci/run: the test may install the Debian packages it needs (as root)
INSTALL_ENV = "DFDL_INSTALL_TEST_DEPS"


def missing() -> str | None:
    """Why SLURM cannot run here (None: it can), installing it first where allowed."""
    if os.geteuid() != 0:
        return "the single-node SLURM runs its daemons as root"
    absent = [b for b in BINARIES if shutil.which(b) is None]
    if absent and os.environ.get(INSTALL_ENV) == "1" and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
        if subprocess.run(install, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
            subprocess.run(install, env=env, capture_output=True)
        absent = [b for b in BINARIES if shutil.which(b) is None]
    if absent:
        return (
            f"{', '.join(absent)} not installed: apt-get install {' '.join(PACKAGES)}, or "
            f"set {INSTALL_ENV}=1 (as .ci/run does) to let the test install them"
        )
    return None


class SingleNodeSlurm:
    """munged, slurmctld and slurmd for this host, configured under ``root``."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = self.root / "slurm.conf"
        self.host = socket.gethostname().split(".")[0]

    @property
    def env(self) -> dict[str, str]:
        """Environment for SLURM's client commands (sbatch, squeue, scancel, sinfo)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.out", "wb")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def _node_line(self) -> str:
        out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
        line = next(ln for ln in out.splitlines() if ln.startswith("NodeName="))
        return line.replace(f"NodeName={line.split()[0].split('=')[1]}", f"NodeName={self.host}")

    def start(self, timeout: float = 60.0) -> None:
        """Start the daemons and wait until ``sinfo`` reports the node idle."""
        r = self.root
        for d in ("state", "spool", "jobs"):
            (r / d).mkdir(parents=True, exist_ok=True)
        key, sock = r / "munge.key", r / "munge.sock"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True)
        self._start(
            "munged",
            [
                "munged", "--foreground", "--force", f"--key-file={key}",
                f"--socket={sock}", f"--pid-file={r / 'munged.pid'}",
                f"--log-file={r / 'munged.log'}", f"--seed-file={r / 'munged.seed'}",
            ],
        )  # fmt: skip
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=dfdltest",
                    f"SlurmctldHost={self.host}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={sock}",
                    f"StateSaveLocation={r / 'state'}",
                    f"SlurmdSpoolDir={r / 'spool'}",
                    f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'slurmd.pid'}",
                    f"SlurmctldLogFile={r / 'slurmctld.log'}",
                    f"SlurmdLogFile={r / 'slurmd.log'}",
                    "SlurmctldPort=16817",
                    "SlurmdPort=16818",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "SchedulerType=sched/backfill",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "ReturnToService=2",
                    "MpiDefault=none",
                    "SwitchType=switch/none",
                    self._node_line(),
                    "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        self._wait_for(sock.exists, timeout, "munged's socket")
        self._start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._start("slurmd", ["slurmd", "-D", "-f", str(self.conf)])
        self._wait_for(self._idle, timeout, f"sinfo to report node {self.host} idle")

    def _idle(self) -> bool:
        r = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True, text=True
        )
        return r.returncode == 0 and f"{self.host} idle" in r.stdout

    def _wait_for(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
            if dead or time.monotonic() > deadline:
                raise RuntimeError(
                    f"waiting for {what}: exited {dead}; logs:\n{self.logs()}"
                    if dead
                    else f"timed out waiting for {what}; logs:\n{self.logs()}"
                )
            time.sleep(0.2)

    def logs(self) -> str:
        """The tail of every daemon's log, for failure messages."""
        out = []
        for path in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            out.append(f"--- {path.name}\n" + "\n".join(path.read_text().splitlines()[-15:]))
        return "\n".join(out)

    def stop(self) -> list[int]:
        """Stop every daemon this object started (SIGTERM, then SIGKILL); their pids."""
        for p in reversed(list(self.procs.values())):
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=15)
        return [p.pid for p in self.procs.values()]
