"""Extraction throughput, side by side in one run.

``feeding`` (the default): bare vLLM fed every prompt in one ``generate`` call against eaglewatch with its default
flags (the stream) and against fixed batches of 16 (``--exact --batch-size 16``, what the default was before the
stream), on the same model, the same synthetic data and the same ``LLM`` arguments (``extraction_llm_kwargs``),
for log-normal and uniform lengths. Runs alternate (``--repeat``) so that a machine's drift hits them alike; the
table gives the median and the spread. Bare vLLM is timed from its ``generate`` call until its last file is
complete, eaglewatch by its manifest (``extract_s``: from the first sample handed over until the last file is under
its final name). Both then sync the output's filesystem (``sync_s``: eaglewatch's closing sync of the default
durability, a ``syncfs`` after bare vLLM's last file), and the last two columns time both to the last byte on disk.

    .venv/bin/python bench/bench_extract.py [feeding] [--samples 1024] [--lengths lognormal uniform] [--repeat 2]
    # on a GPU machine, with a model folder made there and vLLM's stock connector for the bare runs:
    python bench/bench_extract.py feeding --model /tmp/gx/model --dtype bfloat16 --max-len 2048 \\
        --layers 2 8 13 16 --enforce-eager --bare-connector stock --json /tmp/gx/feeding.json

``engines``: tokens/s of the vLLM engine and the HF engine on the tiny model. ``writer``: the output writer
(safetensors + fsync + rename per sample) against ``dd`` writing the same bytes, with fsync, on the same disk.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_common import tiny_llama_with_data, work_folder

# The runs of `feeding`: name -> the eaglewatch flags beyond the common ones (None: bare vLLM).
FEEDING_RUNS: dict[str, list[str] | None] = {
    "bare": None,
    "default": [],
    "batch16": ["--exact", "--batch-size", "16"],
    "fp8": ["--storage", "fp8"],
}
RUN_TITLES = {
    "bare": "bare vLLM, every prompt in one `generate`",
    "default": "eaglewatch, default flags (stream)",
    "batch16": "eaglewatch `--exact --batch-size 16` (fixed batches)",
    "fp8": "eaglewatch, default flags, `--storage fp8` (rounded on the GPU)",
}


def replicate(prepared: Path, dest: Path, copies: int) -> int:
    rows = [json.loads(line) for line in prepared.read_text().splitlines() if line.strip()]
    with open(dest, "w") as out:
        for c in range(copies):
            for row in rows:
                out.write(json.dumps({**row, "id": f"{row['id']}-c{c}"}) + "\n")
    return len(rows) * copies


def lengths_for(kind: str, samples: int, min_len: int, max_len: int, seed: int) -> list[int]:
    """Sample lengths: ``lognormal`` (median a fifth of ``max_len``, sigma 0.9, clipped: a few long samples among
    many short ones, like chat data) or ``uniform`` (every sample half of ``max_len``)."""
    if kind == "uniform":
        return [max(min_len, max_len // 2)] * samples
    rng = random.Random(seed)
    median = max(min_len, max_len // 5)
    return [min(max_len, max(min_len, int(rng.lognormvariate(math.log(median), 0.9)))) for _ in range(samples)]


def write_data(path: Path, lengths: list[int], vocab: int, seed: int) -> int:
    """Prepared data of random token ids (loss mask on the last three quarters); returns the tokens."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i, n in enumerate(lengths):
            ids = [rng.randrange(5, vocab) for _ in range(n)]
            f.write(json.dumps({"id": f"s{i:06d}", "input_ids": ids, "loss_mask": [0] * (n // 4) + [1] * (n - n // 4)})
                    + "\n")
    return sum(lengths)


def run_eaglewatch(flags: list[str], args: argparse.Namespace, model: Path, data: Path, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "eaglewatch", "extract", "--engine", "vllm", "--model-path", str(model),
           "--prepared-data", str(data), "--output-dir", str(out), "--layer-ids", *map(str, args.layers),
           "--max-seq-len", str(args.max_len), "--no-preflight", *common_engine_flags(args), *flags]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)}\n{proc.stderr[-3000:]}")
    m = json.loads((out / "manifest.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    return {"tokens": m["tokens_written"], "extract_s": m["extract_s"], "tokens_per_s": m["tokens_per_s"],
            "sync_s": m.get("sync_s"), "load_s": m["load_s"], "wall_s": round(wall, 1),
            "engine_core_process": m.get("engine_core_process")}


def common_engine_flags(args: argparse.Namespace) -> list[str]:
    flags = []
    if args.dtype:
        flags += ["--dtype", args.dtype]
    if args.enforce_eager:
        flags += ["--enforce-eager"]
    return flags


def run_bare(args: argparse.Namespace, model: Path, data: Path, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    result = out.with_suffix(".json")
    cmd = [sys.executable, __file__, "bare", "--model", str(model), "--data", str(data), "--out-dir", str(out),
           "--result", str(result), "--layers", *map(str, args.layers), "--max-len", str(args.max_len),
           "--connector", args.bare_connector, "--core-process", args.bare_core_process]
    if args.dtype:
        cmd += ["--dtype", args.dtype]
    if args.enforce_eager:
        cmd += ["--enforce-eager"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)}\n{proc.stderr[-3000:]}")
    r = json.loads(result.read_text())
    shutil.rmtree(out, ignore_errors=True)
    return {**r, "wall_s": round(wall, 1)}


def sync_filesystem(folder: Path) -> None:
    """``syncfs`` of the filesystem that holds ``folder`` (what eaglewatch's closing sync does); ``sync`` where the
    C library has no ``syncfs``."""
    import ctypes

    fd = os.open(folder, os.O_RDONLY)
    try:
        syncfs = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
        if syncfs is None or syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def to_last_byte(run: dict) -> float:
    """Tokens a second from the first sample handed over to the last byte on disk (the closing sync counted)."""
    return run["tokens"] / (run["extract_s"] + (run.get("sync_s") or 0.0))


def bare_main(argv: list[str]) -> None:
    """Bare vLLM in its own process: the same ``LLM`` arguments, every prompt in one ``generate``, timed until the
    last file is on disk. ``--connector eaglewatch`` (the only one that runs on CPU) or ``stock``
    (``ExampleHiddenStatesConnector``, what vLLM ships)."""
    ap = argparse.ArgumentParser(prog="bench_extract.py bare")
    ap.add_argument("--model"), ap.add_argument("--data"), ap.add_argument("--out-dir"), ap.add_argument("--result")
    ap.add_argument("--layers", type=int, nargs="+"), ap.add_argument("--max-len", type=int)
    ap.add_argument("--dtype", default=None), ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--connector", choices=("eaglewatch", "stock"), default="eaglewatch")
    ap.add_argument("--core-process", choices=("auto", "yes", "no"), default="auto")
    a = ap.parse_args(argv)
    from eaglewatch.pipeline.engines import cpu_build_of_vllm

    on_cpu = cpu_build_of_vllm()
    own_process = a.core_process == "yes" or (a.core_process == "auto" and not on_cpu)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if own_process else "0"
    from vllm import LLM, SamplingParams

    from eaglewatch.pipeline.engines.vllm_connector import LOSS_MASK_KEY, PATH_KEY
    from eaglewatch.pipeline.engines.vllm_engine import CPU_DEFAULT_KV_CACHE_BYTES, extraction_llm_kwargs
    from eaglewatch.pipeline.model_info import load_model_info, normalise_dtype

    dtype = normalise_dtype(a.dtype or load_model_info(a.model).dtype)
    kwargs = extraction_llm_kwargs(a.model, a.layers, tp_size=1, dtype=dtype, max_seq_len=a.max_len,
                                   gpu_memory_utilization=0.9,
                                   kv_cache_memory_bytes=CPU_DEFAULT_KV_CACHE_BYTES if on_cpu else None,
                                   enforce_eager=a.enforce_eager or on_cpu, trust_remote_code=False, fsync=False)
    rows = [json.loads(line) for line in open(a.data)]
    prompts = [{"prompt_token_ids": r["input_ids"][: a.max_len]} for r in rows]
    out = Path(a.out_dir)
    if a.connector == "stock":
        kwargs["kv_transfer_config"] = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                                        "kv_connector_extra_config": {"shared_storage_path": str(out)}}
        params: list | SamplingParams = SamplingParams(max_tokens=1, detokenize=False)
    else:
        params = [SamplingParams(max_tokens=1, detokenize=False, extra_args={"kv_transfer_params": {
            PATH_KEY: str(out / f"hs_{r['id']}.safetensors"), LOSS_MASK_KEY: r["loss_mask"][: a.max_len]}})
            for r in rows]
    tokens = sum(len(p["prompt_token_ids"]) for p in prompts)
    t = time.perf_counter()
    llm = LLM(seed=0, **kwargs)
    load_s = time.perf_counter() - t
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    t_gen = time.perf_counter()
    if a.connector == "stock":
        import fcntl

        paths = [o.kv_transfer_params["hidden_states_path"] for o in outs]
        for p in paths:  # the stock writer holds an exclusive lock on <file>.lock until the file is complete
            if os.path.exists(p + ".lock"):
                with open(p + ".lock") as f:
                    fcntl.flock(f, fcntl.LOCK_SH)
            else:
                while not os.path.exists(p):
                    time.sleep(0.001)
    else:
        # eaglewatch's connector hands a request's write over with the next step: one more for the last ones.
        llm.generate([{"prompt_token_ids": [0]}], SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
        paths = [str(out / f"hs_{r['id']}.safetensors") for r in rows]
        for p in paths:
            while not os.path.exists(p):
                time.sleep(0.001)
    t1 = time.perf_counter()
    # Then the bytes onto the disk, as eaglewatch's closing sync puts them: both sides timed to the last byte.
    sync_filesystem(out)
    t2 = time.perf_counter()
    result = {"tokens": tokens, "extract_s": round(t1 - t0, 3), "generate_s": round(t_gen - t0, 3),
              "sync_s": round(t2 - t1, 3), "tokens_per_s": round(tokens / (t1 - t0), 1), "load_s": round(load_s, 1),
              "engine_core_process": own_process, "connector": a.connector}
    Path(a.result).write_text(json.dumps(result))
    shutdown = getattr(llm.llm_engine, "shutdown", None)
    if callable(shutdown):
        shutdown()


def feeding(args: argparse.Namespace) -> None:
    work = work_folder(args.workdir)
    if args.model:
        model = Path(args.model).resolve()
    else:
        model, _ = tiny_llama_with_data(work, "llama", shards=8)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    results: dict[str, dict[str, list[dict]]] = {}
    totals = {}
    for kind in args.lengths:
        data = work / f"data-{kind}.jsonl"
        lengths = lengths_for(kind, args.samples, args.min_len, args.max_len, seed=0)
        totals[kind] = (len(lengths), write_data(data, lengths, vocab, seed=1), max(lengths))
        results[kind] = {name: [] for name in args.runs}
        for r in range(args.repeat):
            for name in args.runs:
                out = work / f"out-{kind}-{name}"
                flags = FEEDING_RUNS[name]
                res = run_bare(args, model, data, out) if flags is None else run_eaglewatch(flags, args, model,
                                                                                            data, out)
                print(f"[{kind} round {r + 1}] {name}: {json.dumps(res)}", file=sys.stderr, flush=True)
                results[kind][name].append(res)
    print_feeding(args, model, totals, results)
    if args.json:
        Path(args.json).write_text(json.dumps({"totals": totals, "results": results}, indent=2) + "\n")


def print_feeding(args: argparse.Namespace, model: Path, totals: dict, results: dict) -> None:
    load = os.getloadavg()
    print(f"## Feeding: {args.samples} samples, layers {' '.join(map(str, args.layers))}, max {args.max_len} tokens, "
          f"model {model.name}; nproc {os.cpu_count()}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for kind, runs in results.items():
        n, tokens, longest = totals[kind]
        print(f"\n### {kind} lengths: {n} samples, {tokens:,} tokens (longest {longest}), {args.repeat} rounds")
        print("| run | tokens/s (median) | spread (min-max) | extract s (median) | closing sync s | vs bare "
              "| tokens/s to the last byte (median) | vs bare, to the last byte |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        bare = statistics.median(r["tokens_per_s"] for r in runs["bare"]) if runs.get("bare") else None
        bare_last = statistics.median(to_last_byte(r) for r in runs["bare"]) if runs.get("bare") else None
        for name, rs in runs.items():
            rates = [r["tokens_per_s"] for r in rs]
            med = statistics.median(rates)
            last = statistics.median(to_last_byte(r) for r in rs)
            syncs = [r["sync_s"] for r in rs if r.get("sync_s") is not None]
            sync = f"{statistics.median(syncs):.2f}" if syncs else "-"
            ratio = f"{med / bare:.2f}" if bare else "-"
            ratio_last = f"{last / bare_last:.2f}" if bare_last else "-"
            print(f"| {RUN_TITLES[name]} | {med:,.0f} | {min(rates):,.0f}-{max(rates):,.0f} | "
                  f"{statistics.median(r['extract_s'] for r in rs):.2f} | {sync} | {ratio} | {last:,.0f} | "
                  f"{ratio_last} |")


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


def engines(args: argparse.Namespace) -> None:
    work = work_folder(args.workdir)
    model, base = tiny_llama_with_data(work, "llama", shards=8)
    n = replicate(base, work / "data.jsonl", args.copies)
    results = [run_engine(e, model, work / "data.jsonl", work / f"out-{e}") for e in ("vllm", "hf")]
    print(f"## Extraction on this CPU ({os.cpu_count()} cores): tiny Llama (hidden 128, 4 layers, fp32, 8 shards), "
          f"{n} samples, layers 1 2 4, batch 64")
    print("| engine | tokens | extract s | tokens/s | load s | wall s |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['engine']} | {r['tokens']} | {r['extract_s']} | {r['tokens_per_s']:.0f} | {r['load_s']} | "
              f"{r['wall_s']} |")
    print(f"vLLM / HF tokens/s: {results[0]['tokens_per_s'] / results[1]['tokens_per_s']:.2f}")


def bench_writer(folder: Path, samples: int, tokens: int, layers: int, hidden: int, rounds: int = 3) -> dict:
    """Alternate the writer and dd for a few rounds (the disk's speed drifts) and compare medians."""
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


def writer(args: argparse.Namespace) -> None:
    work = work_folder(args.workdir)
    w = bench_writer(work / "writer", samples=64, tokens=2048, layers=4, hidden=2048)
    print("## Output writer vs dd (same bytes, same disk, fsync)")
    print(json.dumps(w))


def main() -> None:
    if sys.argv[1:2] == ["bare"]:
        bare_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("what", nargs="?", default="feeding", choices=("feeding", "engines", "writer"))
    parser.add_argument("--workdir", default=".work/bench-extract")
    parser.add_argument("--copies", type=int, default=8, help="engines: copies of the 64 bundled samples")
    parser.add_argument("--model", default=None, help="feeding: a model folder (default: the tiny Llama, built here)")
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--lengths", nargs="+", default=["lognormal", "uniform"], choices=("lognormal", "uniform"))
    parser.add_argument("--min-len", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--runs", nargs="+", default=list(FEEDING_RUNS), choices=list(FEEDING_RUNS))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--bare-connector", choices=("eaglewatch", "stock"), default="eaglewatch",
                        help="bare vLLM's writer: eaglewatch's connector (runs on CPU) or vLLM's stock one (GPU)")
    parser.add_argument("--bare-core-process", choices=("auto", "yes", "no"), default="auto",
                        help="bare vLLM's engine core in its own process (auto: on GPUs, as vLLM's default; "
                             "in-process on CPU, as eaglewatch's)")
    parser.add_argument("--json", default=None, help="feeding: also write every figure to this file")
    args = parser.parse_args()
    {"feeding": feeding, "engines": engines, "writer": writer}[args.what](args)


if __name__ == "__main__":
    main()
