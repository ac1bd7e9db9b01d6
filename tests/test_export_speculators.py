"""`eaglewatch export --format speculators`: speculators' own dataset and data loader read the folder unchanged."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import run_cli
from eaglewatch.pipeline.export import layer_order_problem, vocab_mapping
from eaglewatch.pipeline.prepared_data import iter_prepared

ROOT = Path(__file__).resolve().parent.parent
SPECULATORS_SITE = ROOT / ".work" / "speculators-site"
READER = Path(__file__).with_name("speculators_reader.py")
# Where speculators (and the datasets package the export writes with) is installed, apart from the suite's own
# environment: a GPU host that trains with speculators has them; the export needs datasets, nothing else of it.
SPECULATORS_ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(SPECULATORS_SITE), os.environ.get("PYTHONPATH")]))}


def export(*args) -> subprocess.CompletedProcess:
    assert (SPECULATORS_SITE / "speculators").is_dir(), "speculators is not installed: run ./run setup"
    return run_cli("export", *args, env=SPECULATORS_ENV)


@pytest.fixture()
def exported(hf_reference, tmp_path) -> Path:
    folder = tmp_path / "out"
    shutil.copytree(hf_reference, folder)
    proc = export("--format", "speculators", folder, "--draft-vocab-size", "64")
    assert proc.returncode == 0, proc.stderr
    assert "--target-layer-ids 1 2" in proc.stdout and "--draft-vocab-size 64" in proc.stdout, proc.stdout
    return folder


def read_with_speculators(folder: Path, tmp_path: Path, hidden: int, aux: int, seq: int) -> dict:
    result = tmp_path / "read.pt"
    env = {**os.environ, **SPECULATORS_ENV}
    proc = subprocess.run([sys.executable, str(READER), str(folder), str(result), str(hidden), str(aux), str(seq)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(result, weights_only=False)


def test_speculators_dataset_and_loader_give_our_tensors(exported, prepared_data, tmp_path):
    samples = list(iter_prepared(prepared_data))
    got = read_with_speculators(exported, tmp_path, hidden=128, aux=2, seq=2048)
    rows = got["rows"]
    # Every sample is a row, in the prepared data's order, and the row leads back to our sample.
    assert [r["sample_id"] for r in rows] == [s.id for s in samples]
    ours = {}
    for row, sample in zip(rows, samples):
        tensors = load_file(str(exported / f"hs_{sample.id}.safetensors"))
        ours[sample.id] = tensors
        assert row["input_ids"].tolist() == sample.input_ids
        assert row["loss_mask"].tolist() == sample.loss_mask
        assert row["seq_len"] == sample.num_tokens
        # Aux inputs: layers 1 and 2 side by side; the verifier's final state: layer 4, the file's last.
        assert torch.equal(row["hidden_states"], tensors["hidden_states"][:, :2].flatten(1))
        assert torch.equal(row["verifier_last_hidden_states"], tensors["hidden_states"][:, 2])
    # The trainer's packed batches: no sample dropped, and each document is one of ours, whole.
    batches = got["batches"]
    assert batches and all(b["error_records"] == 0 for b in batches)
    by_tokens = {tuple(s.input_ids): s.id for s in samples}
    seen = []
    for batch in batches:
        docs = batch["document_ids"][0]
        for d in sorted(set(docs.tolist()) - {-1}):
            at = docs == d
            sample_id = by_tokens[tuple(batch["input_ids"][0][at].tolist())]
            seen.append(sample_id)
            states = ours[sample_id]["hidden_states"]
            assert torch.equal(batch["hidden_states"][0][at], states[:, :2].flatten(1))
            assert torch.equal(batch["verifier_last_hidden_states"][0][at], states[:, 2])
            assert batch["loss_mask"][0][at].tolist() == ours[sample_id]["loss_mask"].tolist()
    assert sorted(seen) == sorted(s.id for s in samples)


def test_export_writes_vocab_files_and_keeps_verify_and_resume_working(exported, tiny_llama, prepared_data):
    record = json.loads((exported / "speculators.json").read_text())
    assert record["target_layer_ids"] == [1, 2] and record["final_layer_id"] == 4 and record["rows"] == 64
    links = sorted((exported / "hidden_states").iterdir())
    assert len(links) == 64 and all(p.is_symlink() and not os.path.isabs(os.readlink(p)) for p in links)
    freq = torch.load(exported / "token_freq.pt", weights_only=True)
    counted: dict[int, int] = {}
    for s in iter_prepared(prepared_data):
        for t, m in zip(s.input_ids, s.loss_mask):
            if m:
                counted[t] = counted.get(t, 0) + 1
    assert freq == counted
    import numpy as np

    d2t, t2d = np.load(exported / "d2t-64.npy"), np.load(exported / "t2d-64.npy")
    vocab = json.loads((tiny_llama / "config.json").read_text())["vocab_size"]
    assert d2t.shape == (64,) and t2d.shape == (vocab,) and t2d.sum() == 64
    kept = np.flatnonzero(t2d)
    assert (kept - np.arange(64) == d2t).all()
    top = sorted(counted, key=lambda t: (-counted[t], t))[:64]
    assert set(top) <= set(kept.tolist())
    # eaglewatch's own view of the folder is unchanged.
    verified = run_cli("verify", exported)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    resumed = run_cli("extract", "--engine", "hf", "--model-path", tiny_llama, "--prepared-data", prepared_data,
                      "--output-dir", exported, "--layer-ids", "1", "2", "4", "--batch-size", "8",
                      "--max-seq-len", "512", "--no-miniature")
    assert resumed.returncode == 0 and "nothing to do" in resumed.stdout, resumed.stderr
    again = export(exported)
    assert again.returncode == 0, again.stderr
    assert not list(exported.glob("d2t-*.npy")), "a new export replaces the earlier one's files"
    assert len(list((exported / "hidden_states").iterdir())) == 64


def test_layer_order_rules():
    assert layer_order_problem([2, 30, 58, 61], 61) is None
    assert "--layer-ids 2 30 58 61" in layer_order_problem([61, 2, 30, 58], 61)
    assert "add 61 at the end" in layer_order_problem([2, 30, 58], 61)
    assert layer_order_problem([61], 61) is not None


@pytest.mark.parametrize("change, expected", [
    ("reorder", "puts 2 last"),
    ("unfinished", "has not finished"),
    ("other-data", "holds other tokens"),
    ("no-data", "is not there"),
    ("not-ours", "holds files that are not links"),
])
def test_export_refuses_what_it_cannot_export_and_writes_nothing(hf_reference, prepared_data, tmp_path, change,
                                                                 expected):
    folder = tmp_path / "out"
    shutil.copytree(hf_reference, folder)
    manifest_path = folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    args = [folder]
    if change == "reorder":
        manifest["layer_ids"] = [1, 4, 2]
    elif change == "unfinished":
        manifest["status"] = "running"
    elif change == "other-data":
        lines = prepared_data.read_text().splitlines()
        first = json.loads(lines[0])
        first["input_ids"] = first["input_ids"][::-1]
        changed = tmp_path / "changed.jsonl"
        changed.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
        args += ["--prepared-data", changed]
    elif change == "no-data":
        args += ["--prepared-data", tmp_path / "missing.jsonl"]
    elif change == "not-ours":
        (folder / "hidden_states").mkdir()
        (folder / "hidden_states" / "hs_0.safetensors").write_bytes(b"someone else's")
    manifest_path.write_text(json.dumps(manifest))
    before = sorted(p.name for p in folder.iterdir())
    proc = export(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in folder.iterdir()) == before


def test_vocab_mapping_tops_up_with_lowest_unused_ids():
    d2t, t2d = vocab_mapping({7: 5, 3: 5, 9: 1}, draft_vocab_size=5, verifier_vocab_size=12)
    assert t2d.nonzero()[0].tolist() == [0, 1, 3, 7, 9]
    assert (d2t + range(5)).tolist() == [0, 1, 3, 7, 9]
    d2t, t2d = vocab_mapping({7: 5, 3: 5, 9: 1}, draft_vocab_size=2, verifier_vocab_size=12)
    assert t2d.nonzero()[0].tolist() == [3, 7]


def _snapshot(folder: Path) -> dict[str, tuple]:
    """Every entry under ``folder``: its kind, size and modification time, or a link's target."""
    out = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        out[str(path.relative_to(folder))] = (os.readlink(path),) if path.is_symlink() else (
            path.is_dir(), st.st_size, st.st_mtime_ns)
    return out


def test_a_failed_export_leaves_the_view_there_as_it_was(exported):
    """The new view is built beside the old one: a refusal, or a failure half-way, loses nothing."""
    before = _snapshot(exported)
    too_big = export(exported, "--draft-vocab-size", "99999")
    assert too_big.returncode == 2 and too_big.stderr.count("\n") == 1, too_big.stderr
    assert "--draft-vocab-size must be between 1 and the verifier's vocabulary" in too_big.stderr
    assert _snapshot(exported) == before
    # A sample file damaged after the view was written: the export stops at it, naming it, half-way through.
    damaged = sorted(exported.glob("hs_*.safetensors"))[-1]
    damaged.write_bytes(damaged.read_bytes()[:100])
    before = _snapshot(exported)
    failed = export(exported, "--draft-vocab-size", "32")
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr
    assert f"{damaged.name} cannot be read" in failed.stderr
    assert _snapshot(exported) == before
