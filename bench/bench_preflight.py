"""Preflight speed: the checks on a 64-shard model folder, and the time to a miniature result, side by side with
the seed's 18-minute model load (64 shards at ~17 s each).

    .venv/bin/python bench/bench_preflight.py [--workdir .work/bench-preflight]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from bench_common import tiny_llama_with_data, work_folder

SEED_LOAD_S = 18 * 60


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", default=".work/bench-preflight")
    args = parser.parse_args()
    work = work_folder(args.workdir)
    # 16 layers: enough tensors for 64 shards.
    model, data = tiny_llama_with_data(work, "llama-64", shards=64, num_hidden_layers=16)
    base = [sys.executable, "-m", "eaglewatch", "preflight", "--model-path", str(model), "--prepared-data",
            str(data), "--output-dir", str(work / "out"), "--max-seq-len", "512"]
    checks = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([*base, "--engine", "vllm", "--no-miniature"], check=True, capture_output=True)
        checks.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    subprocess.run([*base, "--engine", "vllm"], check=True, capture_output=True)
    mini = time.perf_counter() - t0
    shards = len(list(model.glob("*.safetensors")))
    print(f"| what | seconds | vs the seed's {SEED_LOAD_S} s load |")
    print("|---|---|---|")
    print(f"| checks only, {shards} shards, whole CLI process (median of 5) | {statistics.median(checks):.2f} | "
          f"{SEED_LOAD_S / statistics.median(checks):.0f}x sooner |")
    print(f"| checks + vLLM miniature (engine start included) | {mini:.1f} | {SEED_LOAD_S / mini:.0f}x sooner |")


if __name__ == "__main__":
    main()
