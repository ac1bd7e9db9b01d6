"""Record a real telemetry stream while a GPU workload runs, then stop the workload and time the GPU release.

    python bench/capture_telemetry.py --dest DIR [--samples 72] [--kill-after 60] [--cpu]

Runs, in this order: a GPU process outside the job (``--stranger``: 2 GiB, never in the job tree); the telemetry
command line (``python -m eaglewatch.pipeline.telemetry``) at 1 Hz with the job given by a pid file and its log;
the job (bench/telemetry_workload.py, a launcher with two workers). After ``--kill-after`` seconds the job gets
SIGTERM, as a restart would send it, and :func:`wait_for_gpu_release` waits for its workers' memory to be freed.

Writes into DIR: ``stream.jsonl`` (the protocol lines, as an agent sends them), ``raw.jsonl`` (the NVML readings and
process context each sample was shaped from), ``workload.log`` (the job's log), ``release.jsonl`` (the release
wait: a ``meta`` line, its ``progress`` reports and the ``raw`` NVML readings it polled).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from eaglewatch.pipeline.telemetry import NvmlSource, ranks_from_log, wait_for_gpu_release

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "telemetry_workload.py")


class RecordingSource(NvmlSource):
    """An NVML source that keeps every reading it returns, with the time it was taken."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []

    def read(self, fields: tuple[str, ...] = ()) -> list[dict[str, Any]]:  # type: ignore[override]
        readings = super().read(fields) if fields else super().read()
        self.records.append({"kind": "raw", "t": round(time.time(), 3), "gpus": readings})
        return readings


def children_of(pid: int) -> list[int]:
    try:
        import psutil  # noqa: PLC0415

        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except Exception:
        return []


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dest", required=True)
    parser.add_argument("--samples", type=int, default=72)
    parser.add_argument("--kill-after", type=float, default=60.0)
    parser.add_argument("--pid-file", default=None, help="where the job's pid goes (default DEST/job.pid)")
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    dest = os.path.abspath(args.dest)
    os.makedirs(dest, exist_ok=True)
    work = os.path.join(dest, "work")
    output_dir = os.path.join(work, "output")
    os.makedirs(output_dir, exist_ok=True)
    pid_file = args.pid_file or os.path.join(work, "job.pid")
    log_path = os.path.join(dest, "workload.log")
    open(log_path, "wb").close()
    cpu = ["--cpu"] if args.cpu else []

    stranger_log = open(os.path.join(work, "stranger.log"), "wb")
    stranger = subprocess.Popen([sys.executable, WORKLOAD, "--stranger", "--out-dir", work, *cpu],
                                stdout=stranger_log, stderr=subprocess.STDOUT)
    sampler = subprocess.Popen(
        [sys.executable, "-m", "eaglewatch.pipeline.telemetry", "--interval", "1", "--count", str(args.samples),
         "--output-dir", output_dir, "--job-pid-file", pid_file, "--log", log_path,
         "--raw-out", os.path.join(dest, "raw.jsonl"), "--out", os.path.join(dest, "stream.jsonl")]
    )
    time.sleep(2.0)  # a couple of samples before the job starts
    with open(log_path, "ab") as job_log:
        job = subprocess.Popen(
            [sys.executable, WORKLOAD, "--out-dir", output_dir, "--duration", str(args.kill_after + 30), *cpu],
            stdout=job_log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    with open(pid_file + ".tmp", "w") as fh:
        fh.write(f"{job.pid}\n")
    os.replace(pid_file + ".tmp", pid_file)
    started = time.monotonic()

    time.sleep(max(0.0, args.kill_after - (time.monotonic() - started)))
    with open(log_path, "rb") as fh:
        ranks = ranks_from_log(fh.read())
    workers = children_of(job.pid) or sorted(pid for pid in ranks if pid != job.pid)
    kill_t = time.time()
    os.killpg(job.pid, signal.SIGTERM)
    source = RecordingSource()
    progress: list[dict[str, Any]] = []
    t0 = time.monotonic()
    released = wait_for_gpu_release(
        workers, timeout_s=60.0, poll_s=0.05, nvml=source,
        progress_cb=lambda report: progress.append({"kind": "progress", "t": round(time.time(), 3), **report}),
    )
    waited = time.monotonic() - t0
    job.wait(timeout=30)
    sampler.wait(timeout=args.samples + 30)
    stranger.terminate()
    stranger.wait(timeout=30)
    source.close()

    meta = {
        "kind": "meta",
        "job_pid": job.pid,
        "worker_pids": workers,
        "stranger_pid": stranger.pid,
        "ranks": {str(k): v for k, v in sorted(ranks.items())},
        "kill_t": round(kill_t, 3),
        "released": released,
        "wait_s": round(waited, 3),
        "driver": source.driver,
        "nvml": source.reason,
    }
    with open(os.path.join(dest, "release.jsonl"), "w") as fh:
        for record in [meta, *progress, *source.records]:
            fh.write(json.dumps(record, separators=(",", ":")) + "\n")
    print(json.dumps({k: meta[k] for k in ("job_pid", "worker_pids", "stranger_pid", "ranks", "released", "wait_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
