"""Host sampling with psutil against real processes and real files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from agent_support import wait_for
from eaglewatch.pipeline.telemetry import HostSampler, OutputDiskWatch, pid_state
from eaglewatch.pipeline.telemetry.host import folder_size, rate, visible_pids

# A job: a parent with one sleeping child and one child that exits unreaped (a zombie).
JOB = textwrap.dedent(
    """
    import os, subprocess, sys, time
    zombie = os.fork()
    if zombie == 0:
        os._exit(0)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print(zombie, sleeper.pid, flush=True)
    time.sleep(120)
    """
)


@pytest.fixture
def job():
    proc = subprocess.Popen([sys.executable, "-c", JOB], stdout=subprocess.PIPE, text=True)
    zombie, sleeper = (int(tok) for tok in proc.stdout.readline().split())
    wait_for(lambda: pid_state(zombie) == "zombie", what="the job's zombie")
    yield proc, zombie, sleeper
    for pid in (sleeper, proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def test_job_tree_rows_and_real_zombie(job) -> None:
    proc, zombie, sleeper = job
    sampler = HostSampler()
    host, tree = sampler.sample([proc.pid])
    assert tree == {proc.pid, zombie, sleeper}
    rows = {row["pid"]: row for row in host["procs"]}
    assert rows[zombie]["zombie"] is True and rows[zombie]["state"] == "zombie"
    assert rows[zombie]["rss"] is None
    assert rows[sleeper]["zombie"] is False and rows[sleeper]["ppid"] == proc.pid
    assert rows[sleeper]["rss"] > 1_000_000 and rows[proc.pid]["rss"] > 1_000_000
    assert host["zombies"] == 1
    # psutil's first per-process CPU reading has no baseline: n/a, then a real figure.
    assert rows[sleeper]["cpu_percent"] is None
    time.sleep(0.1)  # not a wait for anything: the host's CPU figure needs 0.1 s between two samples
    host, _ = sampler.sample([proc.pid])
    rows = {row["pid"]: row for row in host["procs"]}
    assert rows[sleeper]["cpu_percent"] is not None and rows[sleeper]["cpu_percent"] >= 0
    assert 0 <= host["cpu_percent"] <= 100 * os.cpu_count()
    assert host["ram_used"] + host["ram_available"] == host["ram_total"]
    assert host["net"] is not None and host["disk_io"] is not None
    # Given every pid of the job (as the agent does) rather than its root: the same tree.
    _, same = HostSampler().sample([sleeper, zombie, proc.pid])
    assert same == tree


def test_a_process_that_leaves_the_tree_drops_out() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
         "print(c.pid, flush=True)\n"
         "c.wait()\n"  # reaps the child once it is killed
         "time.sleep(120)\n"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        child = int(parent.stdout.readline())
        sampler = HostSampler(tree_rescan_s=3600, tree_budget=0)
        _, tree = sampler.sample([parent.pid])
        assert tree == {parent.pid, child}
        os.kill(child, signal.SIGKILL)
        wait_for(lambda: pid_state(child) is None, what="the killed child gone")
        host, tree = sampler.sample([parent.pid])  # the cached tree: the dead child is left out
        assert tree == {parent.pid} and [row["pid"] for row in host["procs"]] == [parent.pid]
        assert sampler._tree_dirty  # and the tree will be rediscovered without waiting an hour
        host, tree = sampler.sample([parent.pid])
        assert tree == {parent.pid} and not sampler._tree_dirty
    finally:
        parent.kill()
        parent.wait()


def test_new_children_are_found_at_the_next_rescan(tmp_path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         "input()\n"
         "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
         "print(c.pid, flush=True)\n"
         "time.sleep(60)\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        sampler = HostSampler(tree_rescan_s=0.0, tree_budget=0)
        _, tree = sampler.sample([parent.pid])
        assert tree == {parent.pid}
        parent.stdin.write("\n")
        parent.stdin.flush()
        child = int(parent.stdout.readline())
        _, tree = sampler.sample([parent.pid])
        assert tree == {parent.pid, child}
    finally:
        for p in psutil.Process(parent.pid).children(recursive=True):
            p.kill()
        parent.kill()
        parent.wait()


def test_gone_and_zombie_pid_states() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_for(lambda: pid_state(child.pid) == "zombie", what="the child exited, not yet reaped by us")
    assert child.pid in visible_pids([child.pid])
    child.wait()
    assert pid_state(child.pid) is None
    assert pid_state(os.getpid()) == "running"
    assert visible_pids([os.getpid(), 4_194_305]) == {os.getpid()}


def write(path: Path, nbytes: int) -> None:
    with open(path, "wb") as fh:
        fh.write(os.urandom(nbytes))
        fh.flush()
        os.fsync(fh.fileno())


def test_output_growth_from_real_writes(tmp_path) -> None:
    watch = OutputDiskWatch(str(tmp_path), scan_min_interval_s=0)
    first = watch.sample(now=100.0)
    assert first["output_bytes"] == 0 and first["output_files"] == 0 and first["growth_bytes_per_s"] is None
    for i in range(3):
        write(tmp_path / f"hs_{i}.safetensors", 1 << 20)
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub" / "events.jsonl", 4096)
    second = watch.sample(now=102.0)
    written = 3 * (1 << 20) + 4096
    assert second["output_bytes"] == written and second["output_files"] == 4
    assert second["growth_bytes_per_s"] == pytest.approx(written / 2.0)
    assert second["free"] > 0 and second["total"] >= second["free"]
    assert second["full_in_s"] == pytest.approx(second["free"] / (written / 2.0), rel=1e-3)
    # Deleting output is not growth.
    (tmp_path / "hs_0.safetensors").unlink()
    third = watch.sample(now=104.0)
    assert third["output_bytes"] == written - (1 << 20) and third["growth_bytes_per_s"] == 0.0


def test_output_walks_are_spaced_out(tmp_path) -> None:
    watch = OutputDiskWatch(str(tmp_path), scan_min_interval_s=10.0)
    watch.sample(now=0.0)
    write(tmp_path / "a.bin", 65536)
    assert watch.sample(now=1.0)["output_bytes"] == 0  # not walked again yet
    later = watch.sample(now=10.0)
    assert later["output_bytes"] == 65536
    assert later["growth_bytes_per_s"] == pytest.approx(6553.6)


def test_missing_output_folder_uses_the_filesystem_that_will_hold_it(tmp_path) -> None:
    target = tmp_path / "not" / "yet"
    sample = OutputDiskWatch(str(target)).sample(now=0.0)
    assert sample["fs_path"] == str(tmp_path) and sample["output_bytes"] is None and sample["free"] > 0


def test_folder_size_counts_regular_files_only(tmp_path) -> None:
    write(tmp_path / "a", 100)
    (tmp_path / "link").symlink_to(tmp_path / "a")
    assert folder_size(str(tmp_path)) == (100, 1)


def test_rate_refuses_counter_resets() -> None:
    assert rate(100, 300, 2.0) == 100.0
    assert rate(300, 100, 2.0) is None
    assert rate(None, 100, 1.0) is None
    assert rate(1, 2, 0.0) is None
