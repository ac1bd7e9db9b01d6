"""Durability off the engine's path: the periodic sync, the manifest's watermark, and what a resume after a restart
does with the files past it.

A power loss cannot be made here. What stands for it is its only trace a resume can read: a manifest whose durable
record was written on another boot of the machine (the record is rewritten with another boot id). The extraction
runs are real (the HF engine, which is quick; the sync and the watermark are the same code for both engines).
"""

from __future__ import annotations

import json

import pytest

from conftest import file_bytes, read_events, run_cli
from eaglewatch.pipeline import output
from eaglewatch.pipeline.engines import durability
from eaglewatch.pipeline.prepared_data import iter_prepared
from resume_helpers import KillPoints, kill_mid_run


def hf_args(model, data, out, *extra):
    return ["extract", "--engine", "hf", "--model-path", str(model), "--prepared-data", str(data),
            "--output-dir", str(out), "--layer-ids", "1", "2", "4", "--max-seq-len", "512", "--no-preflight",
            "--batch-size", "8", *extra]


def test_the_watermark_counts_complete_files_without_a_gap():
    mark = durability.Watermark([True, False, True, False, False])
    assert mark.prefix == 1
    mark.landed(3)
    assert mark.prefix == 1
    mark.landed(1)
    assert mark.prefix == 4
    mark.landed(4)
    assert mark.prefix == 5


def test_a_restart_distrusts_the_complete_files_past_the_watermark_only():
    ids = ["a", "b", "c", "d"]
    status = {"a": output.COMPLETE, "b": output.COMPLETE, "c": output.COMPLETE, "d": output.MISSING}
    same_boot = {durability.DURABLE_KEY: {"samples": 1, "boot_id": durability.boot_id()}}
    assert durability.distrust_unsynced(same_boot, ids, dict(status)) == 0
    other_boot = {durability.DURABLE_KEY: {"samples": 1, "boot_id": "another-boot"}}
    seen = dict(status)
    assert durability.distrust_unsynced(other_boot, ids, seen) == 2
    assert seen == {"a": output.COMPLETE, "b": durability.UNSYNCED, "c": durability.UNSYNCED, "d": output.MISSING}
    assert durability.distrust_unsynced({}, ids, dict(status)) == 0  # no record: written without the watermark
    damaged = {durability.DURABLE_KEY: "nonsense"}
    assert durability.distrust_unsynced(damaged, ids, dict(status)) == 3


def test_a_sync_records_the_watermark_it_covered_in_a_durable_manifest(tmp_path):
    manifest_path = tmp_path / "manifest.json"
    manifest = {"status": "running"}
    mark = durability.Watermark([True, True, False])
    sync = durability.DurableSync(tmp_path, mark, manifest_path, manifest, interval_s=3600, syncs=True,
                                  clock=lambda: 123.0)
    sync.sync_once()
    on_disk = json.loads(manifest_path.read_text())
    assert on_disk == {"status": "running", "durable": {"samples": 2, "boot_id": durability.boot_id(),
                                                        "synced_at": 123.0}}
    assert not list(tmp_path.glob("*.tmp"))


def test_kill_9_then_resume_after_a_restart_redoes_what_the_last_sync_did_not_cover(
        tiny_llama, prepared_data, hf_reference, tmp_path, request):
    points = KillPoints(request.node.nodeid)
    out = tmp_path / "out"
    args = hf_args(tiny_llama, prepared_data, out, "--sync-interval", "0.2")
    left = kill_mid_run(args, out, points, total=64, upper=48)
    assert 0 < left < 64, points
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    record = manifest["durable"]
    assert record["boot_id"] == durability.boot_id(), points
    order = [s.id for s in iter_prepared(prepared_data)]
    have = [output.sample_path(out, i).exists() for i in order]
    watermark = record["samples"]
    assert all(have[:watermark]), (watermark, points)  # the watermark never runs ahead of the files

    # As if the machine had lost power and come back: the record is from another boot.
    manifest["durable"]["boot_id"] = "a-boot-before-a-power-loss"
    manifest_path.write_text(json.dumps(manifest))
    before = set(file_bytes(out))
    resumed = run_cli(*args)
    assert resumed.returncode == 0, f"{points}\n{resumed.stderr[-4000:]}"

    events = read_events(out / "events.jsonl")
    run_events = events[max(i for i, e in enumerate(events) if e["kind"] == "phase" and e["phase"] == "validating"):]
    rewritten = {e["file"] for e in run_events if e["kind"] == "sample"}
    synced = {output.sample_path(out, i).name for i in order[:watermark]}
    # The hf engine runs batches of 8 whole: a batch the watermark cuts runs again, its synced files with it.
    kept = {output.sample_path(out, i).name for i in order[:watermark - watermark % 8]}
    past = before - synced
    assert not rewritten & kept, points  # synced before the restart: trusted as they are
    assert past <= rewritten, points  # written after the last sync: written again
    assert rewritten == {output.sample_path(out, i).name for i in order} - kept, points
    assert file_bytes(out) == file_bytes(hf_reference), points
    warnings = [e for e in run_events if e["kind"] == "warning" and e.get("code") == "unsynced"]
    assert (len(warnings) == 1) == bool(past), points
    assert json.loads(manifest_path.read_text())["durable"]["samples"] == 64


@pytest.mark.parametrize("flags, record", [(["--sync-interval", "0"], 8), (["--no-fsync"], None)])
def test_each_file_fsync_and_no_fsync_say_what_they_promise(tiny_llama, prepared_data, tmp_path, flags, record):
    out = tmp_path / "out"
    proc = run_cli(*hf_args(tiny_llama, prepared_data, out, "--max-samples", "8", *flags))
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest.get("durable", {}).get("samples") == record
    assert ("syncs" in manifest) == (record is not None)


@pytest.mark.parametrize("options, message", [
    ({"sync_interval": -1.0}, "--sync-interval must be a number of seconds, 0 or more (got -1.0)"),
    ({"sync_interval": float("nan")}, "--sync-interval must be a number of seconds, 0 or more (got nan)"),
    ({"max_in_flight": 0}, "--max-in-flight must be at least 1 (got 0)"),
    ({"max_in_flight_tokens": 0}, "--max-in-flight-tokens must be at least 1 (got 0)"),
    ({"exact": True, "engine_core_process": True}, "--exact runs vLLM's engine core in-process"),
])
def test_feeding_and_durability_options_out_of_range_are_refused(options, message):
    from eaglewatch.errors import UserError
    from eaglewatch.pipeline.plan import ExtractConfig

    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ExtractConfig(model_path="m", prepared_data="d", output_dir="o", engine="vllm", **options)
