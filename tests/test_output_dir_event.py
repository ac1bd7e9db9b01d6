"""The job says where it writes (an `info` event with `output_dir`), and the agent's disk telemetry follows it."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import read_events, run_cli
from eaglewatch import protocol
from eaglewatch.pipeline.agent.rundir import CMD_FILE, EVENTS_FILE, EXIT_FILE
from eaglewatch.pipeline.agent.server import RunRanks
from eaglewatch.pipeline.telemetry.host import HostSampler


def make_run(root: Path, run_id: str, *events: dict, tail: bytes = b"") -> Path:
    run = root / run_id
    run.mkdir(parents=True)
    (run / CMD_FILE).write_text(json.dumps({"argv": ["x", "--output-dir", "/from/argv"], "cwd": "/"}))
    (run / EVENTS_FILE).write_bytes(b"".join(protocol.encode(e) for e in events) + tail)
    return run


def info(**fields) -> dict:
    return protocol.make_event(protocol.EVENT_INFO, **fields)


def test_no_running_run_means_no_disk(tmp_path):
    assert RunRanks(tmp_path / "runs").output_dir() is None
    ended = make_run(tmp_path / "runs", "20250101-120000-aaaaaa", info(output_dir="/data/out"))
    (ended / EXIT_FILE).write_text('{"code": 0}')
    assert RunRanks(tmp_path / "runs").output_dir() is None


def test_run_directory_until_the_job_says_where_it_writes(tmp_path):
    root = tmp_path / "runs"
    run = make_run(root, "20250101-120000-aaaaaa", protocol.make_event(protocol.EVENT_PHASE, phase="validating"))
    ranks = RunRanks(root)
    assert ranks.output_dir() == str(run)  # argv is not read
    with open(run / EVENTS_FILE, "ab") as f:
        f.write(protocol.encode(info(output_dir="/data/demo")))
        f.write(protocol.encode(protocol.make_event(protocol.EVENT_SAMPLE, id="a", tokens=3, bytes=9, file="x")))
        f.write(protocol.encode(info(engine="vllm", layer_ids=[1, 2])))
    assert ranks.output_dir() == "/data/demo"
    with open(run / EVENTS_FILE, "ab") as f:
        # The last one said wins (the demo names its work folder, then its extraction its own); a torn line
        # is not read until it is complete.
        f.write(protocol.encode(info(output_dir="/data/demo/hidden-states")))
        f.write(b'{"v":1,"kind":"info","output_dir":"/torn')
    assert ranks.output_dir() == "/data/demo/hidden-states"
    with open(run / EVENTS_FILE, "ab") as f:
        f.write(b'"}\n')
    assert ranks.output_dir() == "/torn"


def test_the_newest_running_run_is_watched(tmp_path):
    root = tmp_path / "runs"
    make_run(root, "20250101-120000-aaaaaa", info(output_dir="/older"))
    newer = make_run(root, "20250101-130000-bbbbbb", tail=b"not json\n")
    ranks = RunRanks(root)
    assert ranks.output_dir() == str(newer)
    (newer / EXIT_FILE).write_text('{"code": 0}')
    assert ranks.output_dir() == "/older"


def test_host_sampler_follows_a_new_output_dir(tmp_path):
    sampler = HostSampler(str(tmp_path / "run"))
    first = sampler.disk
    sampler.set_output_dir(str(tmp_path / "run"))
    assert sampler.disk is first
    sampler.set_output_dir(str(tmp_path / "out"))
    assert sampler.disk is not None and sampler.disk.path == str(tmp_path / "out")
    sampler.set_output_dir(None)
    assert sampler.disk is None


def test_extract_says_its_output_dir_first(tmp_path):
    """Before validation can fail: here the model folder is missing, and the event is there all the same."""
    copy = tmp_path / "run-events.jsonl"
    proc = run_cli("extract", "--engine", "hf", "--model-path", tmp_path / "no-model", "--prepared-data",
                   tmp_path / "none.jsonl", "--output-dir", "out", cwd=str(tmp_path),
                   env={"EAGLEWATCH_EVENTS_FILE": str(copy)}, timeout=120)
    assert proc.returncode == 2, proc.stderr
    for events in (read_events(tmp_path / "out" / "events.jsonl"), read_events(copy)):
        assert events[0]["kind"] == protocol.EVENT_INFO
        assert Path(events[0]["output_dir"]).resolve() == (tmp_path / "out").resolve()
        assert Path(events[0]["output_dir"]).is_absolute()
        assert [e["phase"] for e in events if e["kind"] == protocol.EVENT_PHASE] == ["validating", "failed"]
