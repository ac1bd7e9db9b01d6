"""pid → TP rank from real vLLM logs, the H200 workload's log and pipeline events."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from eaglewatch import protocol
from eaglewatch.pipeline.telemetry import RankMap, ranks_from_events, ranks_from_log
from eaglewatch.pipeline.telemetry.ranks import name_weight

FIXTURES = Path(__file__).parent / "fixtures"
VLLM_LOGS = FIXTURES / "vllm-logs"
TELEMETRY = FIXTURES / "telemetry"


def read(path: Path) -> bytes:
    return path.read_bytes()


def test_tp2_log_maps_each_worker_to_its_rank() -> None:
    data = read(VLLM_LOGS / "llama_extract_tp2.log")
    ranks = ranks_from_log(data)
    # Every worker pid is printed under several names; the one carrying the TP rank wins, whatever the order.
    tp_pids = {int(pid): f"Worker_TP{int(rank)}" for rank, pid in re.findall(rb"\(Worker_TP(\d) pid=(\d+)\)", data)}
    assert len(tp_pids) == 2
    for pid, label in tp_pids.items():
        assert ranks[pid] == label
        assert re.search(rb"\(Worker pid=%d\)" % pid, data)  # also printed without a rank
    engine = int(re.search(rb"\(EngineCore pid=(\d+)\)", data).group(1))
    assert ranks[engine] == "EngineCore"


def test_ansi_coloured_prefixes_are_read() -> None:
    data = read(VLLM_LOGS / "llama_extract_tty_pty.log")
    assert b"\x1b[" in data
    ranks = ranks_from_log(data)
    assert "MainProcess" in ranks.values() and "EngineCore" in ranks.values()
    assert any(label.startswith("Worker") or label.startswith("VllmWorker") for label in ranks.values())


def test_single_worker_logs_fall_back_to_the_names_they_have() -> None:
    data = read(VLLM_LOGS / "crash_cpu_mem_util.log")
    ranks = ranks_from_log(data)
    pid = int(re.search(rb"\(VllmWorker-0 pid=(\d+)\)", data).group(1))
    assert ranks[pid] == "VllmWorker-0"
    gpu = ranks_from_log(read(VLLM_LOGS / "gpu_h200_vllm026_extract.log"))
    assert set(gpu.values()) <= {"EngineCore", "MainProcess", "APIServer"} and "EngineCore" in gpu.values()


def test_h200_workload_log_matches_the_pids_recorded_on_the_gpu() -> None:
    for name in ("h200", "h200x2"):
        ranks = ranks_from_log(read(TELEMETRY / f"{name}_workload.log"))
        lines = (TELEMETRY / f"{name}_release.jsonl").read_text().splitlines()
        meta = next(record for record in map(json.loads, lines) if record["kind"] == "meta")
        workers = meta["worker_pids"]
        assert sorted(ranks[pid] for pid in workers) == ["Worker_TP0", "Worker_TP1"]
        assert ranks[meta["job_pid"]] == "MainProcess"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=40))
def test_feeding_in_chunks_gives_the_same_map(cuts: list[int]) -> None:
    data = read(VLLM_LOGS / "llama_extract_tp2.log")[:20000]
    whole = ranks_from_log(data)
    ranks = RankMap()
    position = 0
    for cut in cuts:
        ranks.feed_log(data[position : position + cut])
        position += cut
    ranks.feed_log(data[position:])
    assert ranks() == whole


def test_pipeline_events_state_ranks_and_outweigh_the_log() -> None:
    ranks = RankMap()
    ranks.feed_log(b"(Worker_TP0 pid=100) INFO x\n(Worker_TP1 pid=101) INFO y\n")
    events = [
        protocol.make_event(protocol.EVENT_INFO, pid=100, rank="Worker_TP1"),
        {"type": protocol.MSG_EVENT, "run": "r", "offset": 0,
         "event": protocol.make_event(protocol.EVENT_INFO, pid=102, tp_rank=2)},
        protocol.make_event(protocol.EVENT_INFO, engine="vllm"),  # says nothing about ranks
        protocol.make_event(protocol.EVENT_INFO, pid=True, rank="bogus"),
    ]
    ranks.feed_events(events)
    ranks.feed_log(b"(Worker_TP0 pid=100) INFO later\n")  # a later log line does not override the event
    assert ranks() == {100: "Worker_TP1", 101: "Worker_TP1", 102: "Worker_TP2"}
    assert ranks_from_events(events) == {100: "Worker_TP1", 102: "Worker_TP2"}


def test_a_reused_pid_takes_the_latest_name_of_equal_weight() -> None:
    ranks = ranks_from_log(b"(Worker_TP0 pid=7) a\n(Worker_TP3 pid=7) b\n(Worker pid=7) c\n")
    assert ranks == {7: "Worker_TP3"}


def test_name_weights() -> None:
    assert name_weight("Worker_TP0") > name_weight("Worker") > name_weight("MainProcess")
    assert name_weight("Worker_PP1_TP3") == name_weight("VllmWorker-2") == name_weight("Worker_DP0_TP1_EP1")
    assert name_weight("EngineCore_DP0") > name_weight("EngineCore") == name_weight("Worker")


def test_a_worker_is_known_by_its_global_rank_before_it_takes_its_tp_name() -> None:
    # On two H200s the workers printed as plain "Worker" for 70 s of loading, saying "world_size=2 rank=R".
    lines = read(FIXTURES / "gpu" / "runs" / "h200x2_tp2_ok" / "log").splitlines(keepends=True)
    first_tp_name = next(i for i, line in enumerate(lines) if b"(Worker_TP" in line)
    ranks = RankMap()
    for line in lines[:first_tp_name]:
        ranks.feed_log(line)
    said = {int(pid): int(rank) for pid, rank in
            re.findall(rb"\(Worker pid=(\d+)\)[^\n]*world_size=2 rank=(\d)", b"".join(lines[:first_tp_name]))}
    assert sorted(said.values()) == [0, 1]
    assert ranks.as_dict() == {pid: f"Worker rank={rank}" for pid, rank in said.items()}
    for line in lines[first_tp_name:]:  # the TP name outweighs it once it comes
        ranks.feed_log(line)
    assert ranks.as_dict() == {pid: f"Worker_TP{rank}" for pid, rank in said.items()}
    # Split anywhere, the same.
    data = b"".join(lines[:first_tp_name])
    for cut in range(0, len(data), 97):
        split = RankMap()
        split.feed_log(data[:cut])
        split.feed_log(data[cut:])
        assert split.as_dict() == ranks_from_log(data)
