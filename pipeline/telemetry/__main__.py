"""``python -m eaglewatch.pipeline.telemetry``: print telemetry messages as protocol JSON lines.

For manual use on a GPU host and for recording fixtures. The job is given by pids (``--job-pid``) or by a pid
file that is re-read every sample (``--job-pid-file``, e.g. a run folder's ``pid``); rank labels come from the
job's log and events files, followed as they grow.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from typing import IO, Any

from .ranks import RankMap
from .render import render_lines
from .sampler import TelemetrySampler


class FileFollower:
    """New bytes of a growing file since the last call (starts over if the file shrinks)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0

    def read_new(self, limit: int = 1 << 20) -> bytes:
        try:
            with open(self.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < self.offset:
                    self.offset = 0
                fh.seek(self.offset)
                data = fh.read(limit)
        except OSError:
            return b""
        self.offset += len(data)
        return data


class JobContext:
    """Job pids and rank labels, refreshed from files at every sample."""

    def __init__(self, pids: list[int], pid_file: str | None, log: str | None, events: str | None) -> None:
        self.pids = pids
        self.pid_file = pid_file
        self.ranks = RankMap()
        self.log = FileFollower(log) if log else None
        self.events = FileFollower(events) if events else None
        self._event_tail = b""

    def job_pids(self) -> list[int]:
        pids = list(self.pids)
        if self.pid_file:
            try:
                with open(self.pid_file) as fh:
                    pids.extend(int(tok) for tok in fh.read().split())
            except (OSError, ValueError):
                pass
        return pids

    def rank_map(self) -> dict[int, str]:
        while self.log is not None:
            chunk = self.log.read_new()
            if not chunk:
                break
            self.ranks.feed_log(chunk)
        if self.events is not None:
            data = self._event_tail + self.events.read_new()
            lines = data.split(b"\n")
            self._event_tail = lines.pop()  # a torn last line waits for its end
            for line in lines:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    self.ranks.feed_event(event)
        return self.ranks.as_dict()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m eaglewatch.pipeline.telemetry",
        description="Sample NVML and the host and print telemetry messages as protocol JSON lines.",
    )
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    parser.add_argument("--count", type=int, default=None, help="stop after N samples (default: run until killed)")
    parser.add_argument("--output-dir", default=None, help="the job's output folder: free space and growth")
    parser.add_argument("--job-pid", type=int, action="append", default=[], help="a root pid of the job")
    parser.add_argument("--job-pid-file", default=None, help="file holding the job's pid(s), re-read each sample")
    parser.add_argument("--log", default=None, help="the job's log, scanned for worker prefixes (rank labels)")
    parser.add_argument("--events", default=None, help="the job's events.jsonl, scanned for rank events")
    parser.add_argument("--raw-out", default=None, help="also write raw NVML readings here, one JSON line a sample")
    parser.add_argument("--out", default=None, help="write the messages here instead of stdout")
    parser.add_argument("--text", action="store_true", help="print a readable view instead of JSON lines")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.interval <= 0:
        print("telemetry: --interval must be positive", file=sys.stderr)
        return 2
    job = JobContext(args.job_pid, args.job_pid_file, args.log, args.events)
    raw_fh: IO[str] | None = open(args.raw_out, "w") if args.raw_out else None
    out: IO[bytes] = open(args.out, "wb") if args.out else sys.stdout.buffer

    def write_raw(record: dict[str, Any]) -> None:
        assert raw_fh is not None
        raw_fh.write(json.dumps(record, separators=(",", ":")) + "\n")
        raw_fh.flush()

    sampler = TelemetrySampler(
        interval_s=args.interval,
        output_dir=args.output_dir,
        job_pids_fn=job.job_pids,
        rank_map_fn=job.rank_map,
        raw_sink=write_raw if raw_fh else None,
    )
    def emit(line: bytes) -> None:
        # A missing NVML is reported once, on stderr, by the sampler's logger; each message also carries it.
        if args.text:
            message = json.loads(line)
            out.write(("\n".join(render_lines(message)) + "\n\n").encode())
        else:
            out.write(line)
        out.flush()

    try:
        sampler.run(emit, count=args.count, stop=threading.Event())
    except KeyboardInterrupt:
        pass
    finally:
        sampler.close()
        if raw_fh:
            raw_fh.close()
        if args.out:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
