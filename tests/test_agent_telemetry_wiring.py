"""The agent's telemetry knows the running job's output folder and its processes' TP ranks (from the log)."""

from __future__ import annotations

import sys

from agent_support import stop_leftovers, wait_for
from eaglewatch.pipeline.agent import jobs
from eaglewatch.pipeline.agent.server import RunRanks

WORKER = ("import json, os, sys, time\n"
          "print(f'(Worker_TP1 pid={os.getpid()}) INFO 11-30 04:10:53 [x.py:1] ready', flush=True)\n"
          "with open(os.environ['EAGLEWATCH_EVENTS_FILE'], 'a') as f:\n"
          "    f.write(json.dumps({'v': 1, 'kind': 'info', 'output_dir': sys.argv[-1]}) + '\\n')\n"
          "time.sleep(30)\n")


def test_ranks_and_output_dir_come_from_the_running_job(tmp_path):
    root = tmp_path / "runs"
    out = tmp_path / "hidden states"
    try:
        jobs.launch(root, [sys.executable, "-c", WORKER, "--output-dir", str(out)], cwd=str(tmp_path),
                    env={}, name="ranks")
        ranks = RunRanks(root)
        mapping = wait_for(lambda: ranks(), timeout_s=15)
        (pid, label), = mapping.items()
        assert label == "Worker_TP1" and pid in jobs.job_pids(root)
        assert wait_for(lambda: ranks.output_dir() == str(out), timeout_s=15)
    finally:
        stop_leftovers(root)
