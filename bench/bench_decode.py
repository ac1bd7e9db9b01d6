"""Decoder throughput and memory on a realistic mix, next to a plain ``str.splitlines()`` pass.

The mix: 8 tensor-parallel workers interleaving vLLM logger lines (INFO mostly, some WARNING), each with
its own tqdm bar rewritten with ``\\r``, an EngineCore and an unprefixed main process, and now and then a
worker traceback logged with the header on every line (about one traceback line in 60). It is fed in 64 KiB
chunks, as a channel delivers it.

    python bench/bench_decode.py                 # throughput (about 2M lines) and RSS after 10M lines
    python bench/bench_decode.py --lines 500000 --rss-lines 0   # quick look
    python bench/bench_decode.py --against /tmp/old --rss-lines 0  # beside another checkout's decoder, in turns

"Lines" are what ``str.splitlines()`` returns for the same text, so both sides count the same things (a
``\\r`` rewrite of a bar counts as a line for both).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import subprocess
import sys
import time

from eaglewatch.decode.decoder import Decoder

CHUNK = 64 * 1024
LANES = [f"Worker_TP{i}" for i in range(8)]

_INFO = [
    "[gpu_model_runner.py:2950] Model loading took 7.52 GiB memory and 12.408851 seconds",
    "[kv_cache_utils.py:1087] GPU KV cache size: 1,453,405 tokens",
    "[custom_all_reduce.py:203] Registering 4536 cuda graph addresses",
    "[core.py:402] init engine (profile, create kv cache, warmup model) took 6.35 s",
    "[pipeline.py:118] wrote hs_{n}.safetensors (2048 tokens, 67.1 MB) in 0.31 s",
    "[loggers.py:123] Engine 000: Avg prompt throughput: 151931.2 tokens/s, Running: 64 reqs, Waiting: 12 reqs",
]
_WARNING = [
    "[utils.py:338] KV connector cache layout LBNHC does not satisfy every supported set; using LBHNC instead.",
    "[jit_monitor.py:135] Triton kernel JIT compilation during inference: _compute_slot_mapping_kernel.",
]
_TRACEBACK = [
    "WorkerProc hit an exception.",
    "Traceback (most recent call last):",
    '  File "/opt/venv/lib/python3.11/site-packages/vllm/v1/executor/multiproc_executor.py", line 1055, '
    "in _execute_worker_rpc",
    "    output = func(*args, **kwargs)",
    "             ^^^^^^^^^^^^^^^^^^^^^",
    '  File "/opt/venv/lib/python3.11/site-packages/vllm/v1/worker/gpu_worker.py", line 1328, in execute_model',
    "    output = self.model_runner.execute_model(",
    '  File "/opt/venv/lib/python3.11/site-packages/vllm/v1/worker/gpu_model_runner.py", line {n}, in execute_model',
    "    hidden = self.model(input_ids)",
    '  File "/srv/eagle/pipeline/extract.py", line {n}, in save_hidden_states',
    "    assert request.block_hashes",
    "AssertionError",
    "",
]


def _bar(desc: str, n: int, total: int, elapsed: int, rate: float) -> str:
    pct = 100 * n // total
    filled = pct // 10
    body = "\u2588" * filled + " " * (10 - filled)
    remaining = int((total - n) / rate) if rate else 0
    return (f"{desc}: {pct:3d}%|{body}| {n}/{total} [{elapsed // 60:02d}:{elapsed % 60:02d}<"
            f"{remaining // 60:02d}:{remaining % 60:02d}, {rate:.2f}it/s]")


def make_block(lines_wanted: int, seed: int = 7) -> str:
    """About ``lines_wanted`` splitlines() lines of the mix, as text."""
    rnd = random.Random(seed)
    out: list[str] = []
    count = 0
    bars = {lane: 0 for lane in LANES}
    second = 0
    while count < lines_wanted:
        second += 1
        stamp = f"11-30 {(second // 3600) % 24:02d}:{(second // 60) % 60:02d}:{second % 60:02d}"
        lane = rnd.choice(LANES)
        prefix = f"({lane} pid={1000 + LANES.index(lane)}) "
        roll = rnd.random()
        if roll < 0.60:
            out.append(f"{prefix}INFO {stamp} {rnd.choice(_INFO).format(n=second)}\n")
            count += 1
        elif roll < 0.66:
            out.append(f"{prefix}WARNING {stamp} {rnd.choice(_WARNING)}\n")
            count += 1
        elif roll < 0.97:
            # A bar advancing a few steps, each step a \r rewrite; the line ends when the lane prints again.
            steps = rnd.randint(1, 4)
            segs = []
            for _ in range(steps):
                bars[lane] = (bars[lane] + 1) % 1000
                segs.append("\r" + _bar("Processed prompts", bars[lane], 1000, second % 3600, 40 + rnd.random() * 20))
            out.append(prefix + "".join(segs) + "\n")
            count += steps + 1
        elif roll < 0.985:
            out.append(f"[probe] step {second} done in {rnd.random():.3f}s\n")
            count += 1
        elif roll < 0.99:
            out.append(f"(EngineCore pid=999) INFO {stamp} [core.py:1126] scheduled {rnd.randint(1, 64)} requests\n")
            count += 1
        else:
            header = f"{prefix}ERROR {stamp} [multiproc_executor.py:1063] "
            for line in _TRACEBACK:
                out.append(header + line.format(n=4000 + second % 7) + "\n")
            count += len(_TRACEBACK)
    return "".join(out)


def _chunks(data: bytes):
    for start in range(0, len(data), CHUNK):
        yield data[start : start + CHUNK]


def bench_throughput(lines: int, repeats: int) -> dict[str, float]:
    text = make_block(lines)
    data = text.encode("utf-8")
    n_lines = len(text.splitlines())
    best_split = best_decode = float("inf")
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        data.decode("utf-8", "replace").splitlines()
        best_split = min(best_split, time.perf_counter() - start)
        decoder = Decoder(clock=time.monotonic)
        gc.collect()
        start = time.perf_counter()
        for chunk in _chunks(data):
            decoder.feed(chunk)
        decoder.finish()
        best_decode = min(best_decode, time.perf_counter() - start)
    return {
        "lines": n_lines,
        "bytes": len(data),
        "decoder_lines_per_s": n_lines / best_decode,
        "splitlines_lines_per_s": n_lines / best_split,
        "ratio": best_decode / best_split,
        "failures": len(decoder.state.failures_ranked()),
        "bars": len(decoder.state.bars),
    }


def _rss_mib() -> float:
    try:
        import psutil  # optional: the most portable reading

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:
        with open(f"/proc/{os.getpid()}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    return float("nan")


def bench_memory(total_lines: int, block_lines: int = 50_000) -> list[tuple[int, float]]:
    """RSS while decoding ``total_lines`` lines made of blocks with different seeds (so the lines and the
    tracebacks' line numbers vary); returns (lines so far, RSS MiB) checkpoints. Run in a fresh process."""
    blocks = [make_block(block_lines, seed).encode("utf-8") for seed in range(4)]
    per_block = [len(b.decode("utf-8").splitlines()) for b in blocks]
    decoder = Decoder(clock=time.monotonic, emit_lines=False)
    done = 0
    checkpoints = [(0, _rss_mib())]
    next_mark = total_lines // 10
    i = 0
    while done < total_lines:
        block = blocks[i % len(blocks)]
        for chunk in _chunks(block):
            decoder.feed(chunk)
        done += per_block[i % len(blocks)]
        i += 1
        if done >= next_mark:
            checkpoints.append((done, _rss_mib()))
            next_mark += total_lines // 10
    decoder.finish()
    checkpoints.append((done, _rss_mib()))
    for lines, rss in checkpoints:
        print(f"rss after {lines:>11,} lines: {rss:8.1f} MiB")
    state = decoder.state
    print(f"state after {done:,} lines: {len(state.lanes)} lanes, {len(state.bars)} bars, "
          f"{len(state.failures_ranked())} failure groups "
          f"({sum(g.count for g in state.failures_ranked()):,} tracebacks), "
          f"tail {max(len(lane.tail) for lane in state.lanes.values())} lines per lane")
    return checkpoints


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=2_000_000, help="lines for the throughput run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rss-lines", type=int, default=10_000_000, help="lines for the memory run (0: skip)")
    parser.add_argument("--memory-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--against", metavar="TREE",
                        help="another checkout (its top folder): its decoder and this one, in turns on the same mix")
    parser.add_argument("--rate-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.memory_only:
        bench_memory(args.rss_lines)
        return 0
    if args.rate_only:
        print(bench_throughput(args.lines, args.repeats)["decoder_lines_per_s"])
        return 0
    if args.against:
        return _side_by_side(args)
    print(f"python {sys.version.split()[0]}, one process (one core)")
    result = bench_throughput(args.lines, args.repeats)
    print(f"mix: {result['lines']:,} lines, {result['bytes'] / 2**20:.1f} MiB, "
          f"{result['bars']} bars, {result['failures']} failure groups")
    print(f"decoder          {result['decoder_lines_per_s']:>12,.0f} lines/s")
    print(f"str.splitlines() {result['splitlines_lines_per_s']:>12,.0f} lines/s")
    print(f"ratio            {result['ratio']:>12.1f}x slower than splitlines")
    if args.rss_lines:
        # A fresh interpreter, so that the throughput run's buffers do not hide the decoder's own memory.
        sys.stdout.flush()
        subprocess.run([sys.executable, __file__, "--memory-only", "--rss-lines", str(args.rss_lines)], check=True)
    return 0


def _side_by_side(args: argparse.Namespace) -> int:
    """This tree's decoder and another checkout's, each in fresh processes taking turns (so a busy machine slows
    both alike), best of the turns each: lines per second and their ratio."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"this": here, "other": os.path.abspath(args.against)}
    best = {name: 0.0 for name in trees}
    for _ in range(args.repeats):
        for name, tree in trees.items():
            env = dict(os.environ, PYTHONPATH=tree)
            out = subprocess.run([sys.executable, __file__, "--rate-only", "--lines", str(args.lines),
                                  "--repeats", "1"], env=env, check=True, capture_output=True, text=True)
            best[name] = max(best[name], float(out.stdout.strip().splitlines()[-1]))
    print(f"python {sys.version.split()[0]}, one process (one core) each, {args.lines:,} lines, best of "
          f"{args.repeats} turns")
    print(f"this tree  ({trees['this']}): {best['this']:>12,.0f} lines/s")
    print(f"other tree ({trees['other']}): {best['other']:>12,.0f} lines/s")
    print(f"this / other: {best['this'] / best['other']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
