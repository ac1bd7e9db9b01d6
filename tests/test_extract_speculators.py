"""`eaglewatch extract --format speculators`: the folder it leaves is what `speculators train --data-path` reads,
checked with speculators' own dataset and data loader; it survives kill -9 and resume, the ranks of a data-parallel
run leave one view, and a layer order the trainer cannot take is refused before anything is loaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from conftest import EAGLEWATCH, file_bytes, read_events, run_cli
from eaglewatch.pipeline.prepared_data import iter_prepared
from resume_helpers import KillPoints, kill_mid_run
from speculators_reader import SPECULATORS_ENV, read_with_speculators


def speculators_args(engine, model, data, out, *extra):
    return ["extract", "--engine", engine, "--model-path", str(model), "--prepared-data", str(data),
            "--output-dir", str(out), "--layer-ids", "1", "2", "4", "--max-seq-len", "512",
            "--format", "speculators", *extra]


def hf_args(model, data, out, *extra):
    return speculators_args("hf", model, data, out, "--batch-size", "8", "--no-miniature", *extra)


def assert_rows_are_our_files(folder, got, sample_ids):
    """speculators' rows are our samples in the prepared data's order, each with our file's tensors (the aux layers
    side by side, the final layer as the verifier's last state), and its packed batches hold each sample whole."""
    rows = got["rows"]
    assert [r["sample_id"] for r in rows] == sample_ids
    ours = {}
    for row, sample_id in zip(rows, sample_ids):
        tensors = load_file(str(folder / f"hs_{sample_id}.safetensors"))
        ours[sample_id] = tensors
        assert row["input_ids"].tolist() == tensors["token_ids"].tolist()
        assert row["loss_mask"].tolist() == tensors["loss_mask"].tolist()
        assert torch.equal(row["hidden_states"], tensors["hidden_states"][:, :2].flatten(1))
        assert torch.equal(row["verifier_last_hidden_states"], tensors["hidden_states"][:, 2])
    batches = got["batches"]
    assert batches and all(b["error_records"] == 0 for b in batches)
    by_tokens = {tuple(t["token_ids"].tolist()): sid for sid, t in ours.items()}
    seen = []
    for batch in batches:
        docs = batch["document_ids"][0]
        for d in sorted(set(docs.tolist()) - {-1}):
            at = docs == d
            sample_id = by_tokens[tuple(batch["input_ids"][0][at].tolist())]
            seen.append(sample_id)
            assert torch.equal(batch["verifier_last_hidden_states"][0][at], ours[sample_id]["hidden_states"][:, 2])
    assert sorted(seen) == sorted(sample_ids)


def assert_view_record(folder, sample_ids, draft_vocab_size=None):
    record = json.loads((folder / "speculators.json").read_text())
    assert record["sample_ids"] == sample_ids and record["rows"] == len(sample_ids)
    assert (record["target_layer_ids"], record["final_layer_id"]) == ([1, 2], 4)
    assert record["draft_vocab_size"] == draft_vocab_size
    links = sorted((folder / "hidden_states").iterdir())
    assert len(links) == len(sample_ids) and all(p.is_symlink() for p in links)
    return record


@pytest.fixture(scope="module")
def vllm_speculators(tiny_llama, prepared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm-speculators")
    args = speculators_args("vllm", tiny_llama, prepared_data, out, "--draft-vocab-size", "64", "--no-preflight")
    proc = run_cli(*args, env=SPECULATORS_ENV)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, args, proc


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_extract_leaves_what_speculators_reads(vllm_speculators, prepared_data, hf_reference, tmp_path):
    pytest.importorskip("vllm")
    out, args, proc = vllm_speculators
    assert "pass --target-layer-ids 1 2 (final layer 4 last in each file)" in proc.stdout, proc.stdout
    assert "--target-layer-ids 1 2 --draft-vocab-size 64" in proc.stdout and "train with: speculators" in proc.stdout
    ids = [s.id for s in iter_prepared(prepared_data)]
    assert_view_record(out, ids, draft_vocab_size=64)
    assert (out / "d2t-64.npy").is_file() and (out / "t2d-64.npy").is_file() and (out / "token_freq.pt").is_file()
    assert_rows_are_our_files(out, read_with_speculators(out, tmp_path, hidden=128, aux=2, seq=2048), ids)
    # The engine's files themselves are today's: vLLM agrees with HF.
    ours, reference = load_file(str(out / f"hs_{ids[0]}.safetensors")), load_file(str(hf_reference / f"hs_{ids[0]}"
                                                                                        ".safetensors"))
    assert (ours["hidden_states"] - reference["hidden_states"]).abs().max().item() < 1e-5
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["output_format"], manifest["draft_vocab_size"], manifest["storage"]) == ("speculators", 64, "dtype")
    view_event = [e for e in read_events(out / "events.jsonl") if e["kind"] == "info" and "speculators_view" in e]
    assert view_event and view_event[-1]["speculators_view"]["target_layer_ids"] == [1, 2]
    verified = run_cli("verify", out)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "speculators view: 64 rows" in verified.stdout, verified.stdout


@pytest.mark.vllm
@pytest.mark.slow
def test_the_same_command_again_keeps_the_view(vllm_speculators):
    out, args, _ = vllm_speculators
    record = (out / "speculators.json").read_bytes()
    again = run_cli(*args, env=SPECULATORS_ENV)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "nothing to do" in again.stdout and "already describes these files" in again.stderr
    assert "pass --target-layer-ids 1 2" in again.stdout
    assert (out / "speculators.json").read_bytes() == record


def test_kill_9_then_resume_writes_the_view_over_bit_identical_files(tiny_llama, prepared_data, hf_reference,
                                                                     tmp_path, request, monkeypatch):
    # The killed run and its resume both need the datasets package; the kill helper's child inherits this.
    monkeypatch.setenv("PYTHONPATH", SPECULATORS_ENV["PYTHONPATH"])
    points = KillPoints(request.node.nodeid)
    out = tmp_path / "out"
    args = hf_args(tiny_llama, prepared_data, out)
    left = kill_mid_run(args, out, points, total=64, upper=40)
    assert 0 < left < 64, points
    assert not (out / "speculators.json").exists(), "the view comes only once every sample is extracted"
    resumed = run_cli(*args)
    assert resumed.returncode == 0, f"{points}\n{resumed.stderr[-4000:]}"
    assert file_bytes(out) == file_bytes(hf_reference), points
    ids = [s.id for s in iter_prepared(prepared_data)]
    assert_view_record(out, ids)
    assert not list(out.glob(".export-*")), "no work folder of the export is left behind"
    assert_rows_are_our_files(out, read_with_speculators(out, tmp_path, hidden=128, aux=2, seq=2048), ids)
    verified = run_cli("verify", out)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_ranks_leave_one_view_and_a_run_that_changes_files_removes_it(tiny_llama, prepared_data, tmp_path):
    out = tmp_path / "out"
    ranks = [hf_args(tiny_llama, prepared_data, out, "--rank", str(r), "--world-size", "2", "--max-samples", "10")
             for r in range(2)]
    first = run_cli(*ranks[0], env=SPECULATORS_ENV)
    assert first.returncode == 0, first.stderr[-4000:]
    assert "written by the last rank to finish (rank 1 of 2 has no manifest yet)" in first.stdout, first.stdout
    assert not (out / "speculators.json").exists()
    last = run_cli(*ranks[1], env=SPECULATORS_ENV)
    assert last.returncode == 0, last.stderr[-4000:]
    assert "pass --target-layer-ids 1 2" in last.stdout, last.stdout
    ids = [s.id for s in iter_prepared(prepared_data)][:10]
    assert_view_record(out, ids)
    assert_rows_are_our_files(out, read_with_speculators(out, tmp_path, hidden=128, aux=2, seq=2048), ids)
    # A run without --format that rewrites a file takes the view away with it: it would name stale rows.
    (out / f"hs_{ids[1]}.safetensors").unlink()
    native = run_cli(*[a for a in ranks[0] if a not in ("--format", "speculators")])
    assert native.returncode == 0, native.stderr[-4000:]
    warnings = [e for e in read_events(out / "events.rank0.jsonl") if e.get("code") == "view_removed"]
    assert warnings and not (out / "speculators.json").exists() and not (out / "hidden_states").exists()
    again = run_cli(*ranks[0], env=SPECULATORS_ENV)
    assert again.returncode == 0 and "pass --target-layer-ids 1 2" in again.stdout, again.stderr[-4000:]
    assert_view_record(out, ids)


REFUSAL_PROBE = """
import json, sys
from eaglewatch.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "loaded": sorted(m for m in ("torch", "vllm", "transformers", "safetensors",
                                                             "datasets") if m in sys.modules)}))
"""


@pytest.mark.parametrize("layers, expected", [
    (["4", "1", "2"], "puts 2 last: extract with --layer-ids 1 2 4"),
    (["1", "2"], "(layer id 4) as the last of --layer-ids; these are [1, 2]: add 4 at the end"),
    (["4"], "at least one auxiliary layer"),
])
def test_a_layer_order_the_trainer_cannot_take_is_refused_before_preflight_and_any_engine(
        tiny_llama, prepared_data, tmp_path, layers, expected):
    """With the default engine (vllm) and preflight on: refused in validation, before the checks, the miniature or
    any engine library is imported; nothing but the folder's lock and events is written."""
    out = tmp_path / "out"
    args = [*speculators_args("vllm", tiny_llama, prepared_data, out), "--layer-ids", *layers]
    proc = subprocess.run([sys.executable, "-c", REFUSAL_PROBE, *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **SPECULATORS_ENV})
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"code": 2, "loaded": []}, proc.stdout + proc.stderr
    assert expected in proc.stderr, proc.stderr
    events = read_events(out / "events.jsonl")
    assert [e["phase"] for e in events if e["kind"] == "phase"] == ["validating", "failed"]
    assert not [e for e in events if e["kind"] == "check"], "preflight must not have started"
    assert not list(out.glob("hs_*")) and not (out / "manifest.json").exists()


def test_speculators_format_needs_the_datasets_package_and_says_so_first(tiny_llama, prepared_data, tmp_path):
    proc = subprocess.run([*EAGLEWATCH, *speculators_args("vllm", tiny_llama, prepared_data, tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "datasets package, which is not installed" in proc.stderr and "Traceback" not in proc.stderr
    assert not list((tmp_path / "out").glob("hs_*"))


@pytest.mark.parametrize("extra, expected", [
    (["--format", "native", "--draft-vocab-size", "64"], "--draft-vocab-size is for --format speculators"),
    (["--draft-vocab-size", "0"], "--draft-vocab-size must be at least 1"),
    (["--draft-vocab-size", "100000"], "larger than the model's vocabulary"),
])
def test_draft_vocabulary_flags_are_checked_up_front(tiny_llama, prepared_data, tmp_path, extra, expected):
    args = [*speculators_args("hf", tiny_llama, prepared_data, tmp_path / "out"), *extra]
    proc = run_cli(*args, env=SPECULATORS_ENV)
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
    assert not list((tmp_path / "out").glob("hs_*"))


def test_a_damaged_view_fails_verify(hf_reference, tmp_path):
    """verify looks at the view too: each row's link must lead to the sample the record names."""
    out = tmp_path / "out"
    shutil.copytree(hf_reference, out)
    proc = run_cli("export", out, env=SPECULATORS_ENV)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "speculators.json").read_text())
    link = out / "hidden_states" / "hs_3.safetensors"
    link.unlink()
    link.symlink_to(f"../hs_{record['sample_ids'][4]}.safetensors")
    (out / "hidden_states" / "hs_5.safetensors").unlink()
    verified = run_cli("verify", out)
    assert verified.returncode == 1, verified.stdout
    assert f"hidden_states/hs_3.safetensors: leads to hs_{record['sample_ids'][4]}.safetensors, but row 3 is " \
           f"sample {record['sample_ids'][3]}" in verified.stdout, verified.stdout
    assert "hidden_states/hs_5.safetensors: missing (row 5" in verified.stdout, verified.stdout
