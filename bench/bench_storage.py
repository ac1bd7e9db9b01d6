"""Storage of the hidden states, side by side in one run: ``--storage dtype`` (bf16, as computed) against
``--storage fp8`` (float8_e4m3fn with a float32 scale per token, and the rounding's error measured per layer).

Both go through the one sample writer (``output.write_sample_file``), on the same synthetic bf16 states, into
the same disk, alternating round by round so that the disk's drift hits them alike; the table gives medians.
Each round writes ``--samples`` files of ``--tokens`` tokens without a per-file fsync and then syncs the
filesystem, as the default durability does (``--sync-interval 10``: the writers never wait for the disk, a
``syncfs`` follows); ``--fsync-each`` fsyncs every file before its rename instead (``--sync-interval 0``).
``encode`` times the FP8 rounding and its error record alone (no disk), the writer thread's extra work.

    .venv/bin/python bench/bench_storage.py [--hidden 4096 7168] [--layers 4] [--tokens 1024] [--samples 16]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from bench_common import work_folder

STORAGES = ("dtype", "fp8")


def synthetic_states(tokens: int, layers: int, hidden: int, seed: int = 0):  # type: ignore[no-untyped-def]
    """bf16 states with what real ones have: norms that grow with depth and differ per token, and a few massive
    channels (the activations that set each token's fp8 scale)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    states = torch.randn(tokens, layers, hidden, generator=generator)
    states *= torch.linspace(1.0, 8.0, layers)[None, :, None]
    states *= torch.rand(tokens, 1, 1, generator=generator) + 0.5
    states[:, :, :4] *= 30.0
    return states.to(torch.bfloat16)


def write_round(folder: Path, storage: str, tensors: dict, samples: int, fsync_each: bool) -> tuple[float, int]:
    """Seconds to write ``samples`` files and have them on the disk; bytes written."""
    from eaglewatch.pipeline.output import write_sample_file

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    started = time.perf_counter()
    total = sum(write_sample_file(folder / f"hs_{i}.safetensors", tensors, fsync=fsync_each, storage=storage)
                for i in range(samples))
    if not fsync_each:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.sync()
    return time.perf_counter() - started, total


def encode_seconds(tensors: dict, repeat: int) -> float:
    from eaglewatch.pipeline.output import encode_storage

    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        encode_storage(tensors, "fp8")
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(work: Path, tokens: int, layers: int, hidden: int, samples: int, rounds: int,
            fsync_each: bool) -> dict:
    import torch

    from eaglewatch.pipeline.output import dequantize_fp8, quantize_fp8, relative_token_errors

    states = synthetic_states(tokens, layers, hidden)
    tensors = {"hidden_states": states, "token_ids": torch.arange(tokens, dtype=torch.int64),
               "loss_mask": torch.ones(tokens, dtype=torch.int8)}
    times: dict[str, list[float]] = {s: [] for s in STORAGES}
    sizes: dict[str, int] = {}
    for _ in range(rounds):
        for storage in STORAGES:
            seconds, total = write_round(work / f"out-{storage}", storage, tensors, samples, fsync_each)
            times[storage].append(seconds)
            sizes[storage] = total
    for storage in STORAGES:
        shutil.rmtree(work / f"out-{storage}", ignore_errors=True)
    errors = relative_token_errors(dequantize_fp8(*quantize_fp8(states)), states)
    result = {"tokens": tokens, "layers": layers, "hidden": hidden, "samples": samples, "rounds": rounds,
              "fsync_each": fsync_each, "fp8_error_per_layer": [round(v, 4) for v in errors.mean(dim=0).tolist()],
              "encode_tokens_per_s": round(tokens / encode_seconds(tensors, max(rounds, 3)))}
    for storage in STORAGES:
        seconds = statistics.median(times[storage])
        result[storage] = {"bytes_per_token": round(sizes[storage] / samples / tokens, 1),
                           "tokens_per_s": round(samples * tokens / seconds),
                           "MB_per_s": round(sizes[storage] / 1e6 / seconds, 1),
                           "seconds": [round(t, 3) for t in times[storage]]}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=".work/bench-storage")
    parser.add_argument("--hidden", type=int, nargs="+", default=[4096, 7168])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fsync-each", action="store_true")
    parser.add_argument("--json", default=None, help="also write every figure to this file")
    args = parser.parse_args()
    work = work_folder(args.workdir)
    results = [measure(work, args.tokens, args.layers, hidden, args.samples, args.rounds, args.fsync_each)
               for hidden in args.hidden]
    print(f"## Storage on this machine ({os.cpu_count()} cores): bf16 states, {args.layers} layers, "
          f"{args.samples} files of {args.tokens} tokens per round, median of {args.rounds} rounds, "
          f"{'fsync per file' if args.fsync_each else 'one sync per round'}")
    print("| hidden | storage | bytes/token | write tokens/s | MB/s | fp8 vs bf16 | fp8 encode tokens/s | "
          "fp8 error per layer (mean) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        for storage in STORAGES:
            row = r[storage]
            vs = (f"{r['fp8']['bytes_per_token'] / r['dtype']['bytes_per_token']:.2f}x bytes, "
                  f"{r['fp8']['tokens_per_s'] / r['dtype']['tokens_per_s']:.2f}x speed") if storage == "fp8" else ""
            print(f"| {r['hidden']} | {'bf16' if storage == 'dtype' else 'fp8'} | {row['bytes_per_token']} | "
                  f"{row['tokens_per_s']} | {row['MB_per_s']} | {vs} | "
                  f"{r['encode_tokens_per_s'] if storage == 'fp8' else ''} | "
                  f"{r['fp8_error_per_layer'] if storage == 'fp8' else ''} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
