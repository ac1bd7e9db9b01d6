"""Extraction throughput, side by side in one run.

1. Tokens/s of the vLLM engine and the HF engine on the same tiny model and the same data (this CPU).
2. Write throughput of the output writer (safetensors + fsync + rename per sample) against `dd` writing the same
   number of bytes, with fsync, on the same disk.

    .venv/bin/python bench/bench_extract.py [--copies 8] [--workdir .work/bench-extract]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench_common import tiny_llama_with_data, work_folder


def replicate(prepared: Path, dest: Path, copies: int) -> int:
    rows = [json.loads(line) for line in prepared.read_text().splitlines() if line.strip()]
    with open(dest, "w") as out:
        for c in range(copies):
            for row in rows:
                out.write(json.dumps({**row, "id": f"{row['id']}-c{c}"}) + "\n")
    return len(rows) * copies


def run_engine(engine: str, model: Path, data: Path, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "eaglewatch", "extract", "--engine", engine, "--model-path",
                           str(model), "--prepared-data", str(data), "--output-dir", str(out), "--layer-ids", "1",
                           "2", "4", "--max-seq-len", "512", "--batch-size", "64"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    manifest = json.loads((out / "manifest.json").read_text())
    return {"engine": engine, "tokens": manifest["tokens_written"], "extract_s": manifest["extract_s"],
            "tokens_per_s": manifest["tokens_per_s"], "load_s": manifest["load_s"], "wall_s": round(wall, 1),
            "bytes": manifest["bytes_written"]}


def bench_writer(folder: Path, samples: int, tokens: int, layers: int, hidden: int, rounds: int = 3) -> dict:
    """Alternate the writer and dd for a few rounds (the disk's speed drifts) and compare medians."""
    import statistics

    import torch

    from eaglewatch.pipeline.output import write_sample_file

    states = torch.randn(tokens, layers, hidden, dtype=torch.bfloat16)
    ids = torch.arange(tokens, dtype=torch.int64)
    mask = torch.ones(tokens, dtype=torch.int8)
    writer_times, dd_times = [], []
    total = 0
    for _ in range(rounds):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        t0 = time.perf_counter()
        total = sum(write_sample_file(folder / f"hs_{i}.safetensors",
                                      {"hidden_states": states, "token_ids": ids, "loss_mask": mask})
                    for i in range(samples))
        writer_times.append(time.perf_counter() - t0)
        shutil.rmtree(folder)
        folder.mkdir()
        per_file = total // samples  # dd writes the same bytes, one fsync'd file per sample like the writer
        t0 = time.perf_counter()
        for i in range(samples):
            subprocess.run(["dd", "if=/dev/zero", f"of={folder}/dd_{i}", f"bs={per_file}", "count=1",
                            "conv=fsync"], check=True, capture_output=True)
        dd_times.append(time.perf_counter() - t0)
    shutil.rmtree(folder)
    writer_s, dd_s = statistics.median(writer_times), statistics.median(dd_times)
    mb = total / 1e6
    return {"samples": samples, "bytes": total, "rounds": rounds, "writer_MBps": round(mb / writer_s, 1),
            "dd_MBps": round(mb / dd_s, 1), "writer_vs_dd": round(dd_s / writer_s, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--copies", type=int, default=8, help="copies of the 64 bundled samples")
    parser.add_argument("--workdir", default=".work/bench-extract")
    args = parser.parse_args()
    work = work_folder(args.workdir)
    model, base = tiny_llama_with_data(work, "llama", shards=8)
    n = replicate(base, work / "data.jsonl", args.copies)
    results = [run_engine(e, model, work / "data.jsonl", work / f"out-{e}") for e in ("vllm", "hf")]
    print(f"## Extraction on this CPU ({os.cpu_count()} cores): tiny Llama (hidden 128, 4 layers, fp32, 8 shards), "
          f"{n} samples, layers 1 2 4, batch 64")
    print("| engine | tokens | extract s | tokens/s | load s | wall s |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['engine']} | {r['tokens']} | {r['extract_s']} | {r['tokens_per_s']:.0f} | {r['load_s']} | {r['wall_s']} |")
    print(f"vLLM / HF tokens/s: {results[0]['tokens_per_s'] / results[1]['tokens_per_s']:.2f}")
    w = bench_writer(work / "writer", samples=64, tokens=2048, layers=4, hidden=2048)
    print("\n## Output writer vs dd (same bytes, same disk, fsync)")
    print(json.dumps(w))


if __name__ == "__main__":
    main()
