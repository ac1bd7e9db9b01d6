"""A GPU workload for checking telemetry on a real GPU: two "tensor-parallel" worker processes that allocate and free
memory in steps, keep the GPU busy with bf16 matrix products, write output files, and print vLLM-style log lines
(``(Worker_TP0 pid=…) INFO …``) so that their pids can be mapped to ranks.

    python bench/telemetry_workload.py --out-dir OUT [--workers 2] [--duration 62]

Timeline of each worker (seconds from the shared start; rank r allocates (r + 1)-proportional steps, so that
the ranks hold different, recognisable amounts):

    0   CUDA context, matmul buffers               busy
    8   + step 1 (TP0 8 GiB, TP1 4 GiB)            busy
    20  + step 2 (TP0 +8 GiB, TP1 +4 GiB)          busy, TP0 writes output files
    35  free the steps, empty the cache            busy at half duty
    42  idle                                       idle
    50  + 4 GiB                                    busy until stopped (SIGTERM) or --duration

Without CUDA (``--cpu``) the same timeline runs with host-memory byte arrays and no matrix products, which is
enough to exercise the capture here.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

GIB = 1 << 30


def log(label: str, message: str) -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    # One write per line, so that the workers' lines do not interleave mid-line in the shared log.
    sys.stdout.write(f"({label} pid={os.getpid()}) INFO {stamp} [telemetry_workload.py] {message}\n")
    sys.stdout.flush()


class Gpu:
    def __init__(self, device: str, cpu: bool) -> None:
        self.cpu = cpu
        self.blocks: list = []
        if cpu:
            self.torch = None
            return
        import torch  # noqa: PLC0415

        self.torch = torch
        self.device = torch.device(device)
        torch.cuda.set_device(self.device)
        n = 8192
        self.a = torch.randn(n, n, device=self.device, dtype=torch.bfloat16)
        self.b = torch.randn(n, n, device=self.device, dtype=torch.bfloat16)
        torch.cuda.synchronize()

    def allocate(self, nbytes: int) -> None:
        if self.cpu:
            self.blocks.append(bytearray(min(nbytes, 64 << 20)))
            return
        self.blocks.append(self.torch.zeros(nbytes, dtype=self.torch.uint8, device=self.device))
        self.torch.cuda.synchronize()

    def free(self) -> None:
        self.blocks.clear()
        if not self.cpu:
            self.torch.cuda.empty_cache()

    def stats(self) -> str:
        if self.cpu:
            return f"host blocks={len(self.blocks)}"
        t = self.torch
        return (
            f"torch allocated={t.cuda.memory_allocated(self.device)} reserved={t.cuda.memory_reserved(self.device)}"
        )

    def work(self, seconds: float, duty: float) -> None:
        """Matrix products for ``duty`` of every 100 ms slice, for ``seconds``."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            slice_end = time.monotonic() + 0.1
            busy_until = time.monotonic() + 0.1 * duty
            if self.cpu or duty <= 0:
                time.sleep(max(0.0, min(slice_end, end) - time.monotonic()))
                continue
            while time.monotonic() < busy_until:
                for _ in range(4):
                    self.a @ self.b
                self.torch.cuda.synchronize()
            time.sleep(max(0.0, min(slice_end, end) - time.monotonic()))


def worker(rank: int, start: float, args: argparse.Namespace) -> int:
    label = f"Worker_TP{rank}"
    ngpu = 1
    if not args.cpu:
        import torch  # noqa: PLC0415

        ngpu = max(1, torch.cuda.device_count())
    device = f"cuda:{rank % ngpu}"
    gpu = Gpu(device, args.cpu)
    log(label, f"CUDA context ready on {device}; {gpu.stats()}")
    step = (8 if rank == 0 else 4) * GIB // (1 if not args.cpu else 64)

    def until(t: float, duty: float, write: bool = False) -> None:
        written = 0
        while True:
            now = time.time() - start
            if now >= t:
                return
            gpu.work(min(1.0, t - now), duty)
            if write and rank == 0:
                path = os.path.join(args.out_dir, f"hs_{written}.bin")
                with open(path, "wb") as fh:
                    fh.write(os.urandom(1 << 20) * 16)
                written += 1

    until(8, 1.0)
    gpu.allocate(step)
    log(label, f"allocated step 1: {step} bytes; {gpu.stats()}")
    until(20, 1.0)
    gpu.allocate(step)
    log(label, f"allocated step 2: {step} bytes; {gpu.stats()}")
    until(35, 1.0, write=True)
    gpu.free()
    log(label, f"freed both steps; {gpu.stats()}")
    until(42, 0.5)
    log(label, "idle")
    until(50, 0.0)
    gpu.allocate(4 * GIB // (1 if not args.cpu else 64))
    log(label, f"allocated 4 GiB; {gpu.stats()}")
    until(args.duration, 1.0)
    log(label, "done")
    return 0


def stranger(args: argparse.Namespace) -> int:
    """A GPU process outside the job's process tree: 2 GiB held, no work, until stopped."""
    gpu = Gpu("cuda:0", args.cpu)
    gpu.allocate(2 * GIB // (1 if not args.cpu else 64))
    print(f"(Stranger pid={os.getpid()}) INFO holding 2 GiB; {gpu.stats()}", flush=True)
    while True:
        time.sleep(1.0)


def launcher(args: argparse.Namespace) -> int:
    start = time.time()
    print(f"(MainProcess pid={os.getpid()}) INFO launching {args.workers} workers", flush=True)
    procs = []
    for rank in range(args.workers):
        cmd = [sys.executable, __file__, "--worker-rank", str(rank), "--start", repr(start)]
        cmd += ["--out-dir", args.out_dir, "--duration", str(args.duration)] + (["--cpu"] if args.cpu else [])
        procs.append(subprocess.Popen(cmd))

    def stop(signum: int, frame: object) -> None:
        for proc in procs:
            proc.terminate()

    signal.signal(signal.SIGTERM, stop)
    codes = [proc.wait() for proc in procs]
    print(f"(MainProcess pid={os.getpid()}) INFO workers exited with {codes}", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--duration", type=float, default=62.0)
    parser.add_argument("--cpu", action="store_true", help="no CUDA: host memory and sleeps only")
    parser.add_argument("--stranger", action="store_true", help="hold 2 GiB outside the job until stopped")
    parser.add_argument("--worker-rank", type=int, default=None)
    parser.add_argument("--start", type=float, default=None)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    if args.stranger:
        return stranger(args)
    if args.worker_rank is not None:
        return worker(args.worker_rank, args.start, args)
    return launcher(args)


if __name__ == "__main__":
    sys.exit(main())
