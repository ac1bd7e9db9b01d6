"""A private one-node Slurm cluster for the tests: its own munged, slurmctld and slurmd, ports and state.

Everything lives in one folder under TMPDIR: the munge key and socket (munged runs as the invoking user, as root
with ``--force``), ``slurm.conf`` (``AuthInfo=socket=…`` points Slurm at that munged), the controller's state and
the node's spool. The node is this machine, under its host name, with 2 CPUs. Commands reach it through
``SLURM_CONF`` (``cluster.env``). At the end every job is cancelled and exactly the daemons started here are
stopped, by the pids in their pid files.

What the tests cover: docs/slurm.md ("Tests").
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from eaglewatch.pipeline.agent.procs import pid_alive

BINARIES = ("munged", "munge", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
NODE_CPUS = 2
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


@dataclass
class SlurmCluster:
    folder: Path
    conf: Path
    node: str
    cpus: int
    env: dict[str, str] = field(default_factory=dict)

    def run(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.env}, stdin=subprocess.DEVNULL)

    def jobs(self) -> list[dict]:
        """Every job the controller holds, from ``squeue --json``."""
        proc = self.run("squeue", "--json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["jobs"]

    def node_state(self) -> str:
        proc = self.run("sinfo", "--noheader", "--Node", "--format=%T", timeout=10.0)
        return proc.stdout.strip() if proc.returncode == 0 else ""


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None and not os.path.exists(f"/usr/sbin/{name}")]


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def _free_ports(count: int) -> list[int]:
    """Ports nothing listens on now (the daemons bind them a moment later: another cluster's tests may run)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _memory_mb() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                # Below what slurmd measures, or it drains the node ("Low RealMemory").
                return max(256, int(line.split()[1]) // 1024 * 8 // 10)
    return 1024


def _conf_text(folder: Path, node: str, ctld_port: int, d_port: int) -> str:
    return "\n".join([
        "ClusterName=ewtest",
        f"SlurmctldHost={node}",
        f"SlurmUser={_user()}",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={d_port}",
        "AuthType=auth/munge",
        f"AuthInfo=socket={folder / 'munge.socket'}",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "ReturnToService=2",
        # A cancelled task's processes get SIGKILL this soon after SIGTERM (default 30 s).
        "KillWait=5",
        # Finished jobs stay in squeue for the length of a test file; tests of a forgotten job use ids never
        # submitted.
        "MinJobAge=600",
        f"NodeName={node} CPUs={NODE_CPUS} RealMemory={_memory_mb()} State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _wait(predicate, timeout_s: float, what: str, details=lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not met within {timeout_s:g} s. {details()}")
        time.sleep(0.1)


def _start(argv: list[str], env: dict[str, str], what: str, folder: Path) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} did not start ({proc.returncode}): {proc.stderr.strip()[-2000:]}; "
                           f"logs in {folder}")


def _stop(pid_file: Path) -> None:
    """SIGTERM the daemon whose pid the file holds, SIGKILL it if it does not go."""
    pid = _pid(pid_file)
    if pid is None or not pid_alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    try:
        _wait(lambda: not pid_alive(pid), STOP_TIMEOUT_S, f"{pid_file.stem} (pid {pid}) to exit")
    except RuntimeError:
        os.kill(pid, signal.SIGKILL)


def start_cluster(folder: Path) -> SlurmCluster:
    folder.mkdir(parents=True, exist_ok=True)
    # munged refuses a socket folder others cannot traverse and a key others can read.
    folder.chmod(0o755)
    for sub in ("state", "spool"):
        (folder / sub).mkdir(exist_ok=True)
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    node = socket.gethostname()
    conf = folder / "slurm.conf"
    conf.write_text(_conf_text(folder, node, *_free_ports(2)))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = SlurmCluster(folder=folder, conf=conf, node=node, cpus=NODE_CPUS, env={"SLURM_CONF": str(conf)})
    _start([_binary("munged"), "--force", f"--key-file={key}", f"--socket={folder / 'munge.socket'}",
            f"--pid-file={folder / 'munged.pid'}", f"--log-file={folder / 'munged.log'}",
            f"--seed-file={folder / 'munged.seed'}"], env, "munged", folder)
    _start([_binary("slurmctld"), "-f", str(conf)], env, "slurmctld", folder)
    _start([_binary("slurmd"), "-f", str(conf)], env, "slurmd", folder)

    def logs() -> str:
        tails = []
        for name in ("slurmctld.log", "slurmd.log"):
            try:
                tails.append(f"{name}: " + " | ".join((folder / name).read_text().splitlines()[-5:]))
            except OSError:
                pass
        return "; ".join(tails)

    _wait(lambda: cluster.node_state() == "idle", START_TIMEOUT_S, f"sinfo showing node {node} idle",
          lambda: f"node state {cluster.node_state()!r}; {logs()}")
    return cluster


def stop_cluster(cluster: SlurmCluster) -> None:
    """Cancel what still runs (slurmstepd outlives slurmd), wait for the node to be idle, stop our daemons."""
    try:
        cluster.run("scancel", f"--user={_user()}")
        _wait(lambda: cluster.node_state() in ("idle", ""), STOP_TIMEOUT_S, "the node to drain its jobs")
    except (RuntimeError, OSError, subprocess.TimeoutExpired):
        pass
    for daemon in ("slurmd", "slurmctld", "munged"):
        _stop(cluster.folder / f"{daemon}.pid")


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running one-node cluster (``SlurmCluster``): pass ``cluster.env`` to Slurm commands and agents."""
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm is not installed here (no {', '.join(missing)}): "
                    "apt-get install slurm-wlm munge, or ./run setup")
    folder = Path(tempfile.mkdtemp(prefix="slurm-cluster-"))
    cluster = None
    try:
        cluster = start_cluster(folder)
        yield cluster
    finally:
        if cluster is not None:
            stop_cluster(cluster)
        else:
            for daemon in ("slurmd", "slurmctld", "munged"):
                _stop(folder / f"{daemon}.pid")
        shutil.rmtree(folder, ignore_errors=True)
