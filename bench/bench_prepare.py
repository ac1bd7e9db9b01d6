"""``prepare`` on one huge line: the time and peak memory of a 15 MB sample, tokenized with the bound
(``encode_bounded``: only about what ``--max-length`` tokens need) and whole (the text tokenized in full, then cut),
each in a fresh process; the two outputs must be identical. The big line is generated here, never stored.

    .venv/bin/python bench/bench_prepare.py [--workdir .work/bench-prepare] [--mb 15] [--max-length 2048]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

from bench_common import work_folder

WORDS = ["shard", "tensor", "layer", "the", "of", "GPU", "hidden", "state", "draft", "token", "1234", "naïve", "über"]


def big_line(path: Path, megabytes: float, kind: str, seed: int = 0) -> Path:
    """One conversation whose assistant turn is ``megabytes`` of text: words, or one unbroken run of letters."""
    size = int(megabytes * 1_000_000)
    if kind == "words":
        rng = random.Random(seed)
        parts, n = [], 0
        while n < size:
            word = rng.choice(WORDS)
            parts.append(word)
            n += len(word) + 1
        text = " ".join(parts)
    else:
        text = "abcdefghij" * (size // 10)
    record = {"id": f"big-{kind}", "conversations": [{"from": "human", "value": "Summarise this."},
                                                     {"from": "gpt", "value": text}]}
    path.write_text(json.dumps(record) + "\n")
    return path


def one_run(model: str, src: str, out: str, max_length: int, whole: bool) -> None:
    """In this process: tokenizer loaded first (not timed), then prepare() timed; prints JSON."""
    from eaglewatch.pipeline import prepare as prep

    tokenizer = prep.load_tokenizer(model)
    if whole:
        def encode_whole(tok, text, limit):  # what prepare did before the bound
            ids, offsets = prep.encode(tok, text)
            return ids[:limit], offsets[:limit], len(ids) > limit
        prep.encode_bounded = encode_whole
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    report = prep.prepare(src, out, tokenizer, max_length=max_length)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "peak_mb": peak / 1024, "growth_mb": (peak - base) / 1024,
                      "written": report.written, "truncated": report.truncated}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", default=".work/bench-prepare")
    parser.add_argument("--mb", type=float, default=15)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--one", nargs=4, metavar=("MODEL", "SRC", "OUT", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        model, src, out, mode = args.one
        one_run(model, src, out, args.max_length, whole=(mode == "whole"))
        return
    work = work_folder(args.workdir)
    from eaglewatch.pipeline.tiny_model import BASE_CONFIGS, make_tiny_model

    model = work / "llama"
    if not (model / "config.json").exists():
        make_tiny_model(model, dict(BASE_CONFIGS["llama"]), shards=1)
    print(f"| {args.mb:g} MB line, --max-length {args.max_length} | mode | seconds | peak RSS MB |")
    print("|---|---|---|---|")
    for kind in ("words", "one-run"):
        src = big_line(work / f"big-{kind}.jsonl", args.mb, kind)
        outputs = {}
        for mode in ("bounded", "whole"):
            out = work / f"big-{kind}.{mode}.prepared.jsonl"
            proc = subprocess.run([sys.executable, __file__, "--max-length", str(args.max_length), "--one",
                                   str(model), str(src), str(out), mode], capture_output=True, text=True, check=True)
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            outputs[mode] = out.read_text()
            print(f"| {kind} | {mode} | {result['seconds']:.2f} | {result['peak_mb']:.0f} |")
        assert outputs["bounded"] == outputs["whole"], f"{kind}: the bounded output differs from the whole one"
        src.unlink()
    print("outputs identical: yes")


if __name__ == "__main__":
    main()
