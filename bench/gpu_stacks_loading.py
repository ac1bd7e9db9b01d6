"""Stacks of a real vLLM engine while it loads, on a GPU host: the fixture of tests/test_stacks_gpu_fixture.py.

A Kimi-K2.5-like miniature (`make-tiny-model --like` the published config: DeepseekV3, MLA, MoE, INT4) is extracted
by a run the agent launches (so that the stack hook is in every Python process it starts), in a HOME of its own (a
cold start: compilation and CUDA graphs take their time). While the run's events say it loads, its stacks are taken
every few seconds, as `eaglewatch stacks` takes them; each taking is kept as JSON and as the text printed.

    OUT=/some/dir python3 bench/gpu_stacks_loading.py KIMI_CONFIG_JSON

(vLLM on the PYTHONPATH: bench/gpu_wheels.sh; py-spy on the PATH is used for processes without the hook.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from eaglewatch.decode.stackgroups import report
from eaglewatch.pipeline.agent import jobs

EVERY_S = float(os.environ.get("EVERY_S", "4"))
LIMIT_S = 420.0


def main() -> int:
    out = Path(os.environ["OUT"])
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("WORKDIR", "/tmp/stacks"))
    work.mkdir(parents=True, exist_ok=True)
    home = work / "home"
    home.mkdir(exist_ok=True)
    model, data = work / "kimi-mini", work / "data.jsonl"
    ew = [sys.executable, "-m", "eaglewatch"]
    if not model.exists():
        subprocess.run([*ew, "make-tiny-model", "--like", sys.argv[1], "--out", str(model)], check=True)
        subprocess.run([*ew, "prepare", "--model-path", str(model), "--output", str(data), "--max-length", "512",
                        "--input", _sample_data()], check=True)
    env = {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "VLLM_CACHE_ROOT": str(home / ".cache/vllm"),
           "TRITON_CACHE_DIR": str(home / ".triton")}
    argv = [*ew, "extract", "--engine", "vllm", "--model-path", str(model), "--prepared-data", str(data),
            "--output-dir", str(work / "out"), "--layer-ids", "1", "2", "--dtype", "bfloat16", "--no-preflight"]
    run = jobs.launch(work / "runs", argv, env=env, name="kimi-mini-loading")
    started = time.monotonic()
    taken = 0
    phase = ""
    while time.monotonic() - started < LIMIT_S:
        phase = _phase(run.events_path) or phase
        if run.exit_path.exists() or phase in ("extracting", "done", "failed"):
            break
        if phase == "loading":
            stacks = jobs.take_stacks(run)
            taken += 1
            at = round(time.monotonic() - started, 1)
            stacks["seconds_since_launch"] = at
            (out / f"stacks-{taken:02d}.json").write_text(json.dumps(stacks, indent=1))
            (out / f"stacks-{taken:02d}.txt").write_text("\n".join(report(stacks, all_threads=True)) + "\n")
            print(f"+{at:.0f}s taken {taken}: {len(stacks['processes'])} processes by {stacks['methods']}", flush=True)
        time.sleep(EVERY_S)
    print(f"phase at the end: {phase}", flush=True)
    jobs.stop(run, 10.0)
    for name in ("log", "events.jsonl", "cmd.json", "exit.json"):
        if (run.path / name).exists():
            (out / f"run.{name}").write_bytes((run.path / name).read_bytes()[-400_000:])
    return 0 if taken else 1


def _sample_data() -> str:
    from eaglewatch.assets import SAMPLE_CHAT_DATA

    return str(SAMPLE_CHAT_DATA)


def _phase(path: Path) -> str:
    found = ""
    try:
        for line in path.read_text(errors="replace").splitlines():
            if '"phase"' in line:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("kind") == "phase":
                    found = str(event.get("phase") or "")
    except OSError:
        pass
    return found


if __name__ == "__main__":
    sys.exit(main())
