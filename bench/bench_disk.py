"""Extraction when the disk is the limit: eaglewatch with default flags against ``dd`` on the same disk, with the
same durability (everything on disk when the run ends), in one run.

The engine must produce bytes faster than the disk takes them: many layers per token (``--layers``), and, where the
kernel lets us, small dirty-page limits (``vm.dirty_bytes`` / ``vm.dirty_background_bytes``) so that writes meet
the disk at once instead of piling up in page cache. Whether the limits could be set is printed and kept in the
JSON; without them the run is still disk-bound, because both sides end with everything synced (``dd conv=fsync``;
eaglewatch's closing sync, ``sync_s``, is counted in its time) and the data are many times the disk's speed.

    python bench/bench_disk.py --model MODEL --dtype bfloat16 --layers 1 3 5 7 9 11 13 16 --max-len 2048 \\
        --samples 1024 --enforce-eager --storages dtype fp8 --json OUT.json

Each eaglewatch run also keeps what its progress events said of the pace (``disk`` or ``engine``, and the largest
share of a minute the driver waited on the writer), the dashboard's ``pace`` line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench_extract import lengths_for, write_data

DIRTY = {"dirty_bytes": "/proc/sys/vm/dirty_bytes", "dirty_background_bytes": "/proc/sys/vm/dirty_background_bytes",
         "dirty_ratio": "/proc/sys/vm/dirty_ratio", "dirty_background_ratio": "/proc/sys/vm/dirty_background_ratio"}


def read_dirty() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name, path in DIRTY.items():
        try:
            out[name] = Path(path).read_text().strip()
        except OSError:
            out[name] = None
    return out


def set_dirty(limit_bytes: int) -> str:
    """Small dirty-page limits, or why not. Writing the *_bytes knobs zeroes the *_ratio ones (the kernel's rule)."""
    try:
        Path(DIRTY["dirty_background_bytes"]).write_text(str(limit_bytes // 4))
        Path(DIRTY["dirty_bytes"]).write_text(str(limit_bytes))
    except OSError as exc:
        return f"not set ({exc.strerror or exc})"
    now = read_dirty()
    return f"set: dirty_bytes {now['dirty_bytes']}, dirty_background_bytes {now['dirty_background_bytes']}"


def restore_dirty(before: dict[str, str | None]) -> None:
    # Ratios first: setting a ratio zeroes the matching *_bytes knob, and the reverse.
    for name in ("dirty_background_ratio", "dirty_ratio", "dirty_background_bytes", "dirty_bytes"):
        value = before.get(name)
        if value is not None and value != "0":
            try:
                Path(DIRTY[name]).write_text(value)
            except OSError:
                pass


def drop_written(folder: Path) -> None:
    subprocess.run(["rm", "-rf", str(folder)], check=False)
    os.sync()


def run_dd(target: Path, nbytes: int) -> dict:
    block = 16 << 20
    count = max(1, nbytes // block)
    t0 = time.perf_counter()
    proc = subprocess.run(["dd", "if=/dev/zero", f"of={target}", f"bs={block}", f"count={count}", "conv=fsync"],
                          capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"dd failed: {proc.stderr}")
    written = count * block
    target.unlink()
    os.sync()
    return {"bytes": written, "seconds": round(seconds, 2), "mb_per_s": round(written / seconds / 1e6, 1)}


def pace_seen(events: Path) -> dict:
    """What the run's progress events said of its pace: how often the disk set it, and the largest share of a
    recent window the driver spent waiting on the writer."""
    paces, shares = [], []
    try:
        lines = events.read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("kind") == "progress" and event.get("pace"):
            paces.append(event["pace"])
            shares.append(event.get("writer_wait_share") or 0.0)
    return {"progress_events_with_pace": len(paces), "disk_paced": paces.count("disk"),
            "writer_wait_share_max": max(shares, default=None)}


def run_eaglewatch(args: argparse.Namespace, data: Path, out: Path, storage: str) -> dict:
    drop_written(out)
    cmd = [sys.executable, "-m", "eaglewatch", "extract", "--engine", "vllm", "--model-path", args.model,
           "--prepared-data", str(data), "--output-dir", str(out), "--layer-ids", *map(str, args.layers),
           "--max-seq-len", str(args.max_len), "--no-preflight", "--storage", storage]
    if args.dtype:
        cmd += ["--dtype", args.dtype]
    if args.enforce_eager:
        cmd += ["--enforce-eager"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)}\n{proc.stderr[-3000:]}")
    m = json.loads((out / "manifest.json").read_text())
    seconds = m["extract_s"] + (m.get("sync_s") or 0.0)
    nbytes = m.get("bytes_written") or sum(p.stat().st_size for p in out.glob("*.safetensors"))
    pace = pace_seen(out / "events.jsonl")
    drop_written(out)
    return {"storage": storage, **pace, "bytes": nbytes, "tokens": m["tokens_written"], "extract_s": m["extract_s"], "sync_s": m.get("sync_s"),
            "seconds": round(seconds, 2), "mb_per_s": round(nbytes / seconds / 1e6, 1),
            "tokens_per_s_without_sync": m["tokens_per_s"], "load_s": m["load_s"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--workdir", default="/tmp/bench-disk")
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--min-len", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--layers", type=int, nargs="+", required=True)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--dirty-limit-mb", type=int, default=256, help="0: leave the kernel's dirty-page limits alone")
    ap.add_argument("--rounds", type=int, default=2, help="eaglewatch then dd, this many times")
    ap.add_argument("--storages", nargs="+", default=["dtype"], choices=("dtype", "fp8"),
                    help="eaglewatch's --storage for each pair (each against dd of its own bytes)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    data = work / "data-lognormal.jsonl"
    lengths = lengths_for("lognormal", args.samples, args.min_len, args.max_len, seed=0)
    tokens = write_data(data, lengths, vocab, seed=1)
    before = read_dirty()
    dirty = set_dirty(args.dirty_limit_mb << 20) if args.dirty_limit_mb else "left alone"
    try:
        # eaglewatch first: its bytes decide how much dd writes.
        pairs = []
        for _ in range(args.rounds):
            for storage in args.storages:
                ew = run_eaglewatch(args, data, work / "out", storage)
                pairs.append((ew, run_dd(work / "dd.bin", ew["bytes"])))
                print(json.dumps(pairs[-1]), file=sys.stderr, flush=True)
    finally:
        restore_dirty(before)
    result = {"tokens": tokens, "layers": args.layers, "dirty_before": before, "dirty_limits": dirty,
              "eaglewatch": [e for e, _ in pairs], "dd": [d for _, d in pairs],
              "ratios": [round(e["mb_per_s"] / d["mb_per_s"], 3) for e, d in pairs]}
    print(f"## Disk-bound: {args.samples} samples, {tokens:,} tokens, layers {' '.join(map(str, args.layers))}; "
          f"dirty-page limits {dirty}")
    print("| run | bytes | seconds (with closing sync) | MB/s | tokens/s | vs dd | pace (disk-paced events) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for i, (e, d) in enumerate(pairs, 1):
        storage = "bf16" if e["storage"] == "dtype" else e["storage"]
        print(f"| dd conv=fsync, pair {i} | {d['bytes']:,} | {d['seconds']} | {d['mb_per_s']:,} | - | 1.00 | - |")
        print(f"| eaglewatch, {storage}, pair {i} | {e['bytes']:,} | {e['seconds']} (sync {e['sync_s']}) | "
              f"{e['mb_per_s']:,} | {e['tokens'] / e['seconds']:,.0f} | {e['mb_per_s'] / d['mb_per_s']:.2f} | "
              f"{e.get('disk_paced', '-')} of {e.get('progress_events_with_pace', '-')}, largest wait share "
              f"{e.get('writer_wait_share_max')} |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
