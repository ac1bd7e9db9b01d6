"""One writer per output folder: a second extract is refused at once, naming the first; kill -9 leaves no stale
lock; --force-new respects it; the ranks of a data-parallel run share a folder."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import EAGLEWATCH, read_events, run_cli
from eaglewatch.pipeline.output_lock import FOLDER_LOCK, FolderBusy, OutputLock, describe_writers, read_holder
from eaglewatch.pipeline.verify import verify


def wait_for(condition, what: str, proc: subprocess.Popen | None = None, timeout_s: float = 300):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended (code {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def held_by(lock_file: Path, pid: int) -> bool:
    holder = read_holder(lock_file)
    return holder is not None and holder.pid == pid


# ---------------------------------------------------------------- the lock itself, in this process

def test_a_second_writer_is_refused_naming_the_first(tmp_path):
    first = OutputLock(tmp_path)
    first.acquire()
    try:
        with pytest.raises(FolderBusy) as busy:
            OutputLock(tmp_path).acquire()
        message = str(busy.value)
        assert message.startswith(f"{tmp_path} is being written by pid {os.getpid()} on {socket.gethostname()} since ")
        assert message.endswith("; wait for it or stop it") and "(command: eaglewatch" in message
        assert describe_writers(tmp_path) and describe_writers(tmp_path)[0].startswith(f"pid {os.getpid()} ")
    finally:
        first.release()
    assert describe_writers(tmp_path) == []
    with OutputLock(tmp_path) as again:
        assert again.held


def test_the_ranks_of_one_run_share_a_folder(tmp_path):
    rank0, rank1 = OutputLock(tmp_path, 0, 2), OutputLock(tmp_path, 1, 2)
    rank0.acquire()
    rank1.acquire()
    try:
        with pytest.raises(FolderBusy, match=r"by rank 0: pid \d+ .*; rank 1: pid \d+ .*; wait for them or stop them"):
            OutputLock(tmp_path).acquire()
        with pytest.raises(FolderBusy, match=r"by rank 1: pid \d+"):
            OutputLock(tmp_path, 1, 2).acquire()
    finally:
        rank0.release()
        rank1.release()
    whole = OutputLock(tmp_path)
    whole.acquire()
    try:
        with pytest.raises(FolderBusy, match=f"by pid {os.getpid()} "):
            OutputLock(tmp_path, 0, 2).acquire()
    finally:
        whole.release()


def test_holder_information_is_overwritten_by_the_next_holder(tmp_path):
    (tmp_path / FOLDER_LOCK).write_text(json.dumps({"pid": 1, "host": "elsewhere", "started_at": 0.0,
                                                    "command": "eaglewatch extract --old"}) + "\n" + "x" * 500)
    with OutputLock(tmp_path):
        holder = read_holder(tmp_path / FOLDER_LOCK)
        assert holder is not None and holder.pid == os.getpid() and holder.host == socket.gethostname()


# ---------------------------------------------------------------- real processes

def slow_args(model, data, out, *extra):
    """A run long enough to be caught in the act: one sample per engine call."""
    return ["extract", "--engine", "hf", "--model-path", str(model), "--prepared-data", str(data),
            "--output-dir", str(out), "--layer-ids", "1", "2", "4", "--max-seq-len", "512", "--batch-size", "1",
            "--no-miniature", *extra]


def small_data(prepared_data: Path, dst: Path, n: int) -> Path:
    dst.write_text("".join(prepared_data.read_text().splitlines(keepends=True)[:n]))
    return dst


def test_a_second_extract_is_refused_and_kill_9_frees_the_folder(tmp_path, tiny_llama, prepared_data):
    out = tmp_path / "out"
    args = slow_args(tiny_llama, small_data(prepared_data, tmp_path / "data.jsonl", 16), out)
    first = subprocess.Popen([*EAGLEWATCH, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        wait_for(lambda: held_by(out / FOLDER_LOCK, first.pid), "the first run's lock", first)
        wait_for(lambda: any(e.get("phase") == "loading" for e in read_events(out / "events.jsonl")),
                 "the first run to finish planning", first)
        os.killpg(first.pid, signal.SIGSTOP)  # holds the folder for as long as the checks below take
        planted = out / "hs_elsewhere.safetensors.tmp.12345"  # as a live writer's temporary file would be
        planted.write_bytes(b"partial")
        events_before = (out / "events.jsonl").read_bytes()

        for extra in ([], ["--force-new"]):
            second = run_cli(*args, *extra, timeout=120)
            assert second.returncode == 2, second.stderr
            line = second.stderr.strip()
            assert "\n" not in line and "Traceback" not in line
            assert line.startswith(f"eaglewatch extract: error: {out} is being written by pid {first.pid} on "
                                   f"{socket.gethostname()} since ")
            assert f"(command: eaglewatch {' '.join(args)})" in line and line.endswith("; wait for it or stop it")
        assert planted.exists() and (out / "manifest.json").exists()
        assert (out / "events.jsonl").read_bytes() == events_before  # the first run's story, untouched

        preflight = run_cli("preflight", *args[1:], timeout=120)
        assert preflight.returncode == 0, preflight.stdout + preflight.stderr
        assert f"[warn] output folder  {out} is being written by pid {first.pid}" in preflight.stdout
        assert f"being written by pid {first.pid}" in verify(out, finite=False).notes[0]

        os.killpg(first.pid, signal.SIGCONT)
        wait_for(lambda: any(e["kind"] == "sample" for e in read_events(out / "events.jsonl")),
                 "the first run's first file", first)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()

    third = subprocess.Popen([*EAGLEWATCH, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, stderr = third.communicate(timeout=600)
    assert third.returncode == 0, stderr
    holder = read_holder(out / FOLDER_LOCK)
    assert holder is not None and holder.pid == third.pid  # the dead run's words were overwritten
    assert not planted.exists() and not list(out.glob("*.tmp.*"))  # cleaned by the lock's holder
    report = verify(out, finite=False)
    assert report.passed and report.ok == 16, report


def test_ranks_write_one_folder_at_once_and_a_whole_run_waits(tmp_path, tiny_llama, prepared_data):
    out = tmp_path / "out"
    data = small_data(prepared_data, tmp_path / "data.jsonl", 8)
    ranks = [subprocess.Popen([*EAGLEWATCH, *slow_args(tiny_llama, data, out, "--rank", str(r), "--world-size", "2")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
             for r in range(2)]
    try:
        for r, proc in enumerate(ranks):
            wait_for(lambda r=r, proc=proc: held_by(out / f".eaglewatch.rank{r}.lock", proc.pid), f"rank {r}'s lock",
                     proc)
            os.killpg(proc.pid, signal.SIGSTOP)
        whole = run_cli(*slow_args(tiny_llama, data, out), timeout=120)
        assert whole.returncode == 2, whole.stderr
        assert f"rank 0: pid {ranks[0].pid}" in whole.stderr and f"rank 1: pid {ranks[1].pid}" in whole.stderr
        assert "wait for them or stop them" in whole.stderr
        for proc in ranks:
            os.killpg(proc.pid, signal.SIGCONT)
        for proc in ranks:
            _, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, err
    finally:
        for proc in ranks:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    report = verify(out, finite=False)
    assert report.passed and report.ok == 8, report


def test_kill_9_of_a_holder_with_a_child_names_the_gone_holder(tmp_path):
    """A child that inherited the lock keeps it (it may still write); the message says the holder is gone."""
    script = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from eaglewatch.pipeline.output_lock import OutputLock\n"
        "lock = OutputLock(Path(sys.argv[1]))\n"
        "lock.acquire()\n"
        "if os.fork() == 0:\n"
        "    time.sleep(600)\n"
        "    os._exit(0)\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n"
    )
    holder = subprocess.Popen([EAGLEWATCH[0], "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        with pytest.raises(FolderBusy, match=rf"pid {holder.pid} \(gone; a process it started still holds"):
            OutputLock(tmp_path).acquire()
    finally:
        try:
            os.killpg(holder.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 60
    while True:  # the child is gone too: the kernel has released the lock
        try:
            with OutputLock(tmp_path):
                break
        except FolderBusy:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_verify_notes_a_folder_being_written(tmp_path, hf_reference):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(hf_reference, out)
    with OutputLock(out):
        report = verify(out, finite=False)
    assert report.passed
    assert report.notes and report.notes[0].startswith(f"{out} is being written by pid {os.getpid()} ")


def test_lock_is_taken_before_the_events_file_is_touched(tmp_path, tiny_llama, prepared_data):
    out = tmp_path / "out"
    out.mkdir()
    (out / "events.jsonl").write_text("")
    with OutputLock(out):
        proc = run_cli(*slow_args(tiny_llama, prepared_data, out), timeout=120)
    assert proc.returncode == 2 and "is being written by" in proc.stderr
    assert (out / "events.jsonl").read_text() == "" and not (out / "manifest.json").exists()
    assert sorted(p.name for p in Path(out).iterdir()) == [FOLDER_LOCK, "events.jsonl"]
