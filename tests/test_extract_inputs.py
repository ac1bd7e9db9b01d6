"""Bad input to `eaglewatch extract`: a clear error and exit code 2, before any model is loaded."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from conftest import read_events, run_cli
from eaglewatch.errors import UserError
from eaglewatch.pipeline import model_info as mi
from eaglewatch.pipeline.plan import ExtractConfig, check_parallelism


def extract(model, data, out, *extra):
    return run_cli("extract", "--engine", "hf", "--model-path", model, "--prepared-data", data,
                   "--output-dir", out, "--max-seq-len", "512", "--no-miniature", *extra, timeout=120)


def assert_rejected_before_loading(proc, out, message):
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    phases = [e.get("phase") for e in read_events(out / "events.jsonl") if e["kind"] == "phase"]
    assert "loading" not in phases


def test_missing_model(tmp_path, prepared_data):
    proc = extract(tmp_path / "no-model", prepared_data, tmp_path / "out")
    assert_rejected_before_loading(proc, tmp_path / "out", "does not exist")


def test_missing_shard(tmp_path, tiny_llama, prepared_data):
    model = tmp_path / "model"
    shutil.copytree(tiny_llama, model)
    (model / "model-00005-of-00008.safetensors").unlink()
    proc = extract(model, prepared_data, tmp_path / "out")
    assert_rejected_before_loading(proc, tmp_path / "out", "missing: model-00005-of-00008.safetensors")


@pytest.mark.parametrize("ids, message", [
    (["-1", "2"], "out of range"), (["1", "5"], "valid ids are 0..4"), (["2", "2"], "repeated")])
def test_impossible_layer_ids(tmp_path, tiny_llama, prepared_data, ids, message):
    proc = extract(tiny_llama, prepared_data, tmp_path / "out", "--layer-ids", *ids)
    assert_rejected_before_loading(proc, tmp_path / "out", message)


def test_malformed_data_line_is_named(tmp_path, tiny_llama, prepared_data):
    lines = prepared_data.read_text().splitlines()
    lines[6] = '{"id": "x", "input_ids": [1, 2'
    data = tmp_path / "bad.jsonl"
    data.write_text("\n".join(lines) + "\n")
    proc = extract(tiny_llama, data, tmp_path / "out")
    assert_rejected_before_loading(proc, tmp_path / "out", f"{data}:7: not valid JSON")


def test_token_ids_outside_vocabulary(tmp_path, tiny_llama, prepared_data):
    lines = prepared_data.read_text().splitlines()
    row = json.loads(lines[2])
    row["input_ids"][0] = 999_999
    lines[2] = json.dumps(row)
    data = tmp_path / "bad.jsonl"
    data.write_text("\n".join(lines) + "\n")
    proc = extract(tiny_llama, data, tmp_path / "out")
    assert_rejected_before_loading(proc, tmp_path / "out", f"{data}:3: token id 999999 is outside")


def test_too_long_samples_rejected_when_asked(tmp_path, tiny_llama, prepared_data):
    proc = extract(tiny_llama, prepared_data, tmp_path / "out", "--max-seq-len", "8", "--long-samples", "reject")
    assert proc.returncode == 2 and "longer than --max-seq-len 8" in proc.stderr


def test_tp_size_must_divide_heads(tmp_path, tiny_llama, prepared_data):
    proc = run_cli("extract", "--engine", "vllm", "--tp-size", "3", "--model-path", tiny_llama,
                   "--prepared-data", prepared_data, "--output-dir", tmp_path / "out", timeout=120)
    assert_rejected_before_loading(proc, tmp_path / "out", "--tp-size 3 does not divide the model's 4 attention heads")


def test_more_tp_ranks_than_gpus(tiny_llama):
    info = mi.load_model_info(tiny_llama)
    cfg = ExtractConfig(model_path=str(tiny_llama), prepared_data="x", output_dir="y", tp_size=4)
    with pytest.raises(UserError, match="--tp-size 4 needs 4 GPUs, but 1 are visible"):
        check_parallelism(info, cfg, visible_gpus=1)
    check_parallelism(info, ExtractConfig(model_path="m", prepared_data="x", output_dir="y", tp_size=2), 2)


def test_output_folder_not_writable(tmp_path, tiny_llama, prepared_data):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = extract(tiny_llama, prepared_data, blocker / "out")
    assert proc.returncode == 2 and "is not writable" in proc.stderr


def test_disk_too_small_for_the_estimate(tmp_path, tiny_llama, prepared_data):
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    try:
        proc = extract(tiny_llama, prepared_data, mount / "out")
        assert proc.returncode == 2, proc.stderr
        assert "not enough disk for the output" in proc.stderr
        assert not list((mount / "out").glob("hs_*"))
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_manifest_mismatch_on_resume(tmp_path, tiny_llama, prepared_data):
    out = tmp_path / "out"
    first = extract(tiny_llama, prepared_data, out, "--layer-ids", "1", "2", "--max-samples", "4")
    assert first.returncode == 0, first.stderr
    second = extract(tiny_llama, prepared_data, out, "--layer-ids", "1", "3", "--max-samples", "4")
    assert second.returncode == 2
    assert "layer_ids: folder has [1, 2], this run wants [1, 3]" in second.stderr
    assert len(list(out.glob("hs_*.safetensors"))) == 4  # nothing was lost
    forced = extract(tiny_llama, prepared_data, out, "--layer-ids", "1", "3", "--max-samples", "4", "--force-new")
    assert forced.returncode == 0, forced.stderr
    assert json.loads((out / "manifest.json").read_text())["layer_ids"] == [1, 3]
