"""`eaglewatch verify` over the shared folder of a data-parallel run: every rank's manifest is read, every sample
must be in exactly one rank's share and have its file, and the manifests must describe one extraction. Real
three-rank extractions of the tiny Llama (hf engine), then planted damage."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import run_cli
from eaglewatch.pipeline.prepared_data import iter_prepared

WORLD = 3
SAMPLES = 12  # shares of 4


@pytest.fixture(scope="module")
def ranks_folder(tiny_llama, prepared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks")
    for rank in range(WORLD):
        proc = run_cli("extract", "--engine", "hf", "--model-path", tiny_llama, "--prepared-data", prepared_data,
                       "--output-dir", out, "--layer-ids", "1", "2", "4", "--max-seq-len", "512", "--no-miniature",
                       "--rank", str(rank), "--world-size", str(WORLD), "--max-samples", str(SAMPLES))
        assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.fixture()
def folder(ranks_folder, tmp_path):
    copy = tmp_path / "out"
    shutil.copytree(ranks_folder, copy)
    return copy


def ids_of(prepared_data) -> list[str]:
    return [s.id for s in iter_prepared(prepared_data)][:SAMPLES]


def edit_manifest(folder, rank, **changes):
    path = folder / f"manifest.rank{rank}.json"
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    path.write_text(json.dumps(manifest))
    return manifest


def verify(folder, *extra):
    proc = run_cli("verify", folder, *extra)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_all_ranks_are_checked_together(folder):
    proc = verify(folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{SAMPLES} of {SAMPLES} files good, 0 samples missing" in proc.stdout
    for rank in range(WORLD):
        assert f"rank {rank} of {WORLD} (manifest.rank{rank}.json): 4 samples, 0 missing" in proc.stdout
    report = json.loads(verify(folder, "--json").stdout)
    assert [r["rank"] for r in report["ranks"]] == [0, 1, 2] and report["passed"]


def test_a_deleted_sample_is_named_with_its_rank(folder, prepared_data):
    gone = ids_of(prepared_data)[5]  # rank 1's second sample
    (folder / f"hs_{gone}.safetensors").unlink()
    proc = verify(folder)
    assert proc.returncode == 1, proc.stdout
    assert f"{SAMPLES - 1} of {SAMPLES - 1} files good, 1 samples missing" in proc.stdout
    assert f"missing: {gone} (rank 1 (manifest.rank1.json))" in proc.stdout, proc.stdout
    assert "rank 1 of 3 (manifest.rank1.json): 4 samples, 1 missing" in proc.stdout


def test_a_sample_duplicated_into_another_ranks_share_is_caught(folder, prepared_data, tmp_path):
    """Rank 1's host had its own copy of the data, in which one of rank 0's samples took the place of one of its
    own: both ranks wrote that id, one file holds one of the two writes, and rank 1's own sample is in no share."""
    lines = prepared_data.read_text().splitlines()
    ids = ids_of(prepared_data)
    rank1_copy = tmp_path / "rank1.jsonl"
    rank1_copy.write_text("\n".join([*lines[:4], lines[1], *lines[5:]]) + "\n")  # line 5: rank 0's 2nd sample
    edit_manifest(folder, 1, prepared_data=str(rank1_copy))
    proc = verify(folder)
    assert proc.returncode == 1, proc.stdout
    assert ("1 samples are in the shares of both rank 0 (manifest.rank0.json) and rank 1 (manifest.rank1.json), "
            f"so two ranks write them (e.g. {ids[1]}, line 2 and line 5 of their data)") in proc.stdout, proc.stdout
    assert f"hs_{ids[4]}.safetensors: no sample with id {ids[4]!r} in any rank's share" in proc.stdout


def test_a_rank_whose_share_overlaps_another_is_caught_and_its_manifest_named(folder, prepared_data):
    """Rank 1 run with another --max-samples: its share (samples 3-5 of 9) overlaps rank 0's (0-3)."""
    edit_manifest(folder, 1, max_samples=9)
    ids = ids_of(prepared_data)
    proc = verify(folder)
    assert proc.returncode == 1, proc.stdout
    assert ("manifest.rank1.json: max_samples is 9, but manifest.rank0.json and manifest.rank2.json have 12"
            in proc.stdout), proc.stdout
    assert "1 samples are in the shares of both rank 0 (manifest.rank0.json) and rank 1 (manifest.rank1.json)" \
        in proc.stdout, proc.stdout
    assert f"e.g. {ids[3]}, line 4 of their data" in proc.stdout
    for lost in ids[6:8]:  # rank 1's files that its new share no longer holds
        assert f"hs_{lost}.safetensors: no sample with id {lost!r} in any rank's share" in proc.stdout


def test_a_manifest_with_another_layer_list_is_named_and_its_files_fail(folder, prepared_data):
    edit_manifest(folder, 2, layer_ids=[1, 2])
    proc = verify(folder)
    assert proc.returncode == 1, proc.stdout
    assert ("manifest.rank2.json: layer_ids is [1, 2], but manifest.rank0.json and manifest.rank1.json have "
            "[1, 2, 4]") in proc.stdout, proc.stdout
    for sample_id in ids_of(prepared_data)[8:]:
        assert f"hs_{sample_id}.safetensors: hidden_states holds 3 layers, expected 2" in proc.stdout
    assert "8 of 12 files good" in proc.stdout


def test_a_rank_without_a_manifest_is_named_and_its_share_still_checked(folder, prepared_data):
    (folder / "manifest.rank2.json").unlink()
    gone = ids_of(prepared_data)[10]
    (folder / f"hs_{gone}.safetensors").unlink()
    proc = verify(folder)
    assert proc.returncode == 1, proc.stdout
    assert "rank 2 of 3: no manifest says it is this rank (manifest.rank2.json is missing" in proc.stdout, proc.stdout
    assert "11 of 11 files good, 1 samples missing" in proc.stdout
    assert f"missing: {gone} (rank 2 (no manifest))" in proc.stdout


def test_a_single_run_manifest_left_beside_the_ranks_is_caught(folder, prepared_data):
    """A folder once extracted whole, then by ranks: the old manifest.json's selection is every rank's too."""
    manifest = json.loads((folder / "manifest.rank0.json").read_text())
    manifest.update(rank=0, world_size=1)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    proc = verify(folder)
    assert proc.returncode == 1, proc.stdout
    assert "manifest.json: world_size is 1, but manifest.rank0.json, manifest.rank1.json and manifest.rank2.json " \
           "have 3" in proc.stdout, proc.stdout
    assert "samples are in the shares of both rank 0 (manifest.json) and rank 0 (manifest.rank0.json)" in proc.stdout
    assert "samples are in the shares of both rank 0 (manifest.json) and rank 1 (manifest.rank1.json)" in proc.stdout


def test_a_manifest_under_another_ranks_name_is_caught(folder):
    shutil.copy(folder / "manifest.rank0.json", folder / "manifest.rank1.json")
    proc = verify(folder)
    assert proc.returncode == 1, proc.stdout
    assert "manifest.rank1.json: it says rank 0 of 3, whose manifest is manifest.rank0.json" in proc.stdout
    assert "manifest.rank1.json: rank 0 is claimed by manifest.rank0.json too" in proc.stdout
    assert "rank 1 of 3: no manifest says it is this rank" in proc.stdout
