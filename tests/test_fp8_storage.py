"""`--storage fp8`: speculators 0.9's FP8 layout, written by the one sample writer for both engines, read back by
speculators' own dataset and loader (their dequantization), checked by verify (values against scales, the rounding
error per layer, `--against-hf` with the storage in the floor), and resumed like any folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from conftest import file_bytes, run_cli
from eaglewatch.pipeline.output import (FP8_ERROR_TOKENS, dequantize_fp8, fp8_error_tokens, quantize_fp8, read_header,
                                        relative_token_errors)
from eaglewatch.pipeline.prepared_data import iter_prepared
from speculators_reader import SPECULATORS_ENV, read_with_speculators

# float8_e4m3fn keeps 3 mantissa bits: one rounding is at most 2^-4 of a value, and about 2.6% per token (L2) on
# the tiny Llama's states; no token may be further off than the largest single rounding.
FP8_TOKEN_ERROR_BOUND = 2.0 ** -4


def fp8_args(engine, model, data, out, *extra):
    return ["extract", "--engine", engine, "--model-path", str(model), "--prepared-data", str(data),
            "--output-dir", str(out), "--layer-ids", "1", "2", "4", "--max-seq-len", "512", "--storage", "fp8",
            *extra]


@pytest.fixture(scope="module")
def fp8_hf(tiny_llama, prepared_data, tmp_path_factory):
    """The hf engine's fp8 extraction of all 64 samples, with the speculators view."""
    out = tmp_path_factory.mktemp("fp8-hf")
    args = fp8_args("hf", tiny_llama, prepared_data, out, "--batch-size", "8", "--no-miniature", "--format",
                    "speculators")
    proc = run_cli(*args, env=SPECULATORS_ENV)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, args, proc


@pytest.fixture()
def fp8_copy(fp8_hf, tmp_path):
    copy = tmp_path / "fp8"
    shutil.copytree(fp8_hf[0], copy, symlinks=True)
    return copy


def test_files_are_speculators_fp8_layout_within_fp8_error_of_the_computed_states(fp8_hf, hf_reference,
                                                                                   prepared_data):
    out, _, proc = fp8_hf
    for sample in list(iter_prepared(prepared_data))[:8]:
        path = out / f"hs_{sample.id}.safetensors"
        header = read_header(path)
        n = sample.num_tokens
        assert header["hidden_states"]["dtype"] == "F8_E4M3" and header["hidden_states"]["shape"] == [n, 3, 128]
        assert header["hidden_states_scales"]["dtype"] == "F32" and header["hidden_states_scales"]["shape"] == [n, 1, 1]
        ours = load_file(str(path))
        computed = load_file(str(hf_reference / path.name))["hidden_states"]
        # One scale per token over all its layers: the largest |value| becomes float8's largest, 448.
        assert torch.allclose(ours["hidden_states_scales"].reshape(-1), computed.abs().amax(dim=(1, 2)) / 448,
                              rtol=1e-6)
        values = dequantize_fp8(ours["hidden_states"], ours["hidden_states_scales"])
        errors = relative_token_errors(values, computed)
        assert errors.max().item() < FP8_TOKEN_ERROR_BOUND
        # The writer's record: the same measure over evenly spaced tokens (all of them in a short sample).
        recorded = json.loads(header["__metadata__"]["eaglewatch_fp8_error"])
        measured = errors[fp8_error_tokens(n)]
        assert recorded["tokens"] == len(measured) and len(measured) >= min(n, FP8_ERROR_TOKENS)
        assert recorded["mean"] == pytest.approx(measured.mean(dim=0).tolist(), rel=1e-3)
        assert recorded["max"] == pytest.approx(measured.amax(dim=0).tolist(), rel=1e-3)
        assert ours["token_ids"].tolist() == sample.input_ids and ours["loss_mask"].tolist() == sample.loss_mask
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["storage"] == "fp8" and manifest["dtype"] == "float32"
    layers = manifest["fp8_error"]["layers"]
    assert [layer["layer_id"] for layer in layers] == [1, 2, 4] and manifest["fp8_error"]["files"] == 64
    assert all(0.005 < layer["mean_error"] < 0.04 for layer in layers), layers
    assert "fp8 rounding error per layer" in proc.stdout
    # Half of bf16's bytes, a quarter of this float32 model's.
    fp8_bytes = sum(p.stat().st_size for p in out.glob("hs_*.safetensors"))
    reference_bytes = sum(p.stat().st_size for p in hf_reference.glob("hs_*.safetensors"))
    assert fp8_bytes < 0.3 * reference_bytes


def test_quantization_is_speculators_own_bit_for_bit(tmp_path):
    """The writer rounds as speculators' quantize_tensor_to_fp8 does, so its reader's fp8 * scale is our value."""
    torch.manual_seed(0)
    cases = {"bf16": torch.randn(37, 4, 64).to(torch.bfloat16) * 3,
             "fp32 with a zero token": torch.cat([torch.zeros(1, 3, 16), torch.randn(9, 3, 16) * 1e3])}
    ours = {name: quantize_fp8(t) for name, t in cases.items()}
    torch.save({"cases": cases}, tmp_path / "cases.pt")
    script = ("import sys, torch\nfrom hs_connectors.fp8_utils import quantize_tensor_to_fp8\n"
              "cases = torch.load(sys.argv[1])['cases']\n"
              "torch.save({k: quantize_tensor_to_fp8(v) for k, v in cases.items()}, sys.argv[2])\n")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "cases.pt"), str(tmp_path / "theirs.pt")],
                          capture_output=True, text=True, env={**os.environ, **SPECULATORS_ENV}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    theirs = torch.load(tmp_path / "theirs.pt")
    for name in cases:
        assert torch.equal(ours[name][0].view(torch.uint8), theirs[name][0].view(torch.uint8)), name
        assert torch.equal(ours[name][1], theirs[name][1]), name


def test_speculators_fp8_backend_reads_our_files_as_we_dequantize_them(fp8_hf, hf_reference, prepared_data,
                                                                       tmp_path):
    out, _, proc = fp8_hf
    assert "--hidden-states-backend fp8" in proc.stdout, proc.stdout
    record = json.loads((out / "speculators.json").read_text())
    assert record["hidden_states_backend"] == "fp8"
    ids = [s.id for s in iter_prepared(prepared_data)]
    got = read_with_speculators(out, tmp_path, hidden=128, aux=2, seq=2048, backend="fp8")
    assert [r["sample_id"] for r in got["rows"]] == ids == record["sample_ids"]
    for row, sample_id in zip(got["rows"], ids):
        tensors = load_file(str(out / f"hs_{sample_id}.safetensors"))
        ours = dequantize_fp8(tensors["hidden_states"], tensors["hidden_states_scales"])
        # Their reader dequantizes into bf16 (FP8Transfer's default): the same values, to bf16's rounding.
        assert row["hidden_states"].dtype == torch.bfloat16
        final, aux = row["verifier_last_hidden_states"].float(), row["hidden_states"].float()
        assert torch.allclose(final, ours[:, 2], rtol=2 ** -7, atol=1e-6)
        assert torch.allclose(aux, ours[:, :2].flatten(1), rtol=2 ** -7, atol=1e-6)
        computed = load_file(str(hf_reference / f"hs_{sample_id}.safetensors"))["hidden_states"]
        theirs = torch.cat([aux.reshape(-1, 2, 128), final[:, None]], 1)
        assert relative_token_errors(theirs, computed).max().item() < FP8_TOKEN_ERROR_BOUND
    assert got["batches"] and all(b["error_records"] == 0 for b in got["batches"])


def test_verify_passes_and_reports_the_rounding_error_per_layer(fp8_hf):
    out = fp8_hf[0]
    proc = run_cli("verify", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "64 of 64 files good" in proc.stdout
    assert "fp8 storage, rounding error against the states as computed" in proc.stdout
    for layer in (1, 2, 4):
        assert f"layer    {layer}: mean 0.0" in proc.stdout, proc.stdout
    as_json = json.loads(run_cli("verify", out, "--json").stdout)
    manifest = json.loads((out / "manifest.json").read_text())
    assert as_json["fp8"]["layers"] == manifest["fp8_error"]["layers"] and as_json["fp8"]["tokens"] > 5_000


def test_against_hf_holds_an_fp8_output_against_hf_stored_the_same_way(fp8_copy, prepared_data):
    """The floor is HF's states rounded to fp8 as the writer rounds them (floor 0 would fail every fp8 file)."""
    proc = run_cli("verify", fp8_copy, "--against-hf", "3", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)["against_hf"]
    assert result["floor_model"]["storage"] == "fp8" and result["passed"]
    for layer in result["layers"]:
        assert layer["floor"] > 0.005 and layer["ratio"] == pytest.approx(1.0, abs=0.01)
    # Another token's states in one file (a shift by one position) is far beyond that floor.
    chosen = [s["id"] for s in result["per_sample"]]
    path = fp8_copy / f"hs_{chosen[0]}.safetensors"
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(path))
    for key in ("hidden_states", "hidden_states_scales"):
        tensors[key] = torch.roll(tensors[key], 1, dims=0).contiguous()
    save_file(tensors, str(path), metadata=metadata)
    failed = run_cli("verify", fp8_copy, "--against-hf", "3")
    assert failed.returncode == 1 and "FAIL" in failed.stdout, failed.stdout


def damage(tensors: dict, how: str) -> None:
    if how == "no scales":
        del tensors["hidden_states_scales"]
    elif how == "NaN scale":
        tensors["hidden_states_scales"][3] = float("nan")
    elif how == "zero scale":
        tensors["hidden_states_scales"][0] = 0.0
    elif how == "NaN value":
        raw = tensors["hidden_states"].view(torch.uint8)
        raw[2, 1, 5] = 0x7F  # float8_e4m3fn's NaN
    elif how == "values of other scales":
        tensors["hidden_states_scales"] = torch.roll(tensors["hidden_states_scales"], 1, dims=0).contiguous()
        tensors["hidden_states"] = (tensors["hidden_states"].float() * 0.5).to(torch.float8_e4m3fn)
    elif how == "bf16 in an fp8 folder":
        tensors["hidden_states"] = tensors["hidden_states"].to(torch.bfloat16)


@pytest.mark.parametrize("how, expected", [
    ("no scales", "no hidden_states_scales tensor"),
    ("NaN scale", "hidden_states_scales are not positive finite numbers (token 3: nan)"),
    ("zero scale", "hidden_states_scales are not positive finite numbers (token 0: 0.0)"),
    ("NaN value", "1 non-finite values (1 NaN, 0 Inf) in hidden_states (fp8)"),
    ("values of other scales", "fp8 values do not fit their scales (token 0: largest |value| 224, expected 448)"),
    ("bf16 in an fp8 folder", "hidden_states are bfloat16, expected fp8 (float8_e4m3fn) storage"),
    ("truncated", "unreadable"),
])
def test_a_damaged_fp8_file_fails_verify(fp8_copy, how, expected):
    path = sorted(fp8_copy.glob("hs_*.safetensors"))[0]
    if how == "truncated":
        path.write_bytes(path.read_bytes()[:-50])
    else:
        with safe_open(str(path), "pt") as f:
            metadata = f.metadata()
        tensors = load_file(str(path))
        damage(tensors, how)
        save_file(tensors, str(path), metadata=metadata)
    proc = run_cli("verify", fp8_copy)
    assert proc.returncode == 1, proc.stdout
    assert f"{path.name}: " in proc.stdout and expected in proc.stdout, proc.stdout


def test_resume_is_bit_identical_and_another_storage_is_refused(fp8_copy, fp8_hf):
    args = [a if a != str(fp8_hf[0]) else str(fp8_copy) for a in fp8_hf[1]]
    before = file_bytes(fp8_copy)
    sorted(fp8_copy.glob("hs_*.safetensors"))[5].unlink()
    resumed = run_cli(*args, env=SPECULATORS_ENV)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert file_bytes(fp8_copy) == before  # its batch of 8 ran again: the same bytes
    manifest = json.loads((fp8_copy / "manifest.json").read_text())
    assert manifest["samples_written"] == 8 and manifest["fp8_error"]["files"] == 64
    assert run_cli("verify", fp8_copy).returncode == 0
    refused = run_cli(*[a for a in args if a not in ("--storage", "fp8")], env=SPECULATORS_ENV)
    assert refused.returncode == 2
    assert "storage: folder has 'fp8', this run wants 'dtype'" in refused.stderr, refused.stderr


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_connector_writes_fp8_within_fp8_error(tiny_llama, prepared_data, hf_reference, tmp_path):
    pytest.importorskip("vllm")
    out = tmp_path / "vllm-fp8"
    proc = run_cli(*fp8_args("vllm", tiny_llama, prepared_data, out, "--max-samples", "16", "--no-preflight"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    files = sorted(out.glob("hs_*.safetensors"))
    assert len(files) == 16
    for path in files:
        tensors = load_file(str(path))
        assert tensors["hidden_states"].dtype == torch.float8_e4m3fn
        computed = load_file(str(hf_reference / path.name))["hidden_states"]
        values = dequantize_fp8(tensors["hidden_states"], tensors["hidden_states_scales"])
        assert relative_token_errors(values, computed).max().item() < FP8_TOKEN_ERROR_BOUND
    verified = run_cli("verify", out)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "fp8 storage, rounding error" in verified.stdout


def test_the_error_record_is_the_same_split_in_two_as_a_gpu_writer_makes_it():
    """A GPU writer measures the error on the device (fp8_error_stats) and words it on the host (fp8_error_text)."""
    import torch

    from eaglewatch.pipeline.output import fp8_error_record, fp8_error_stats, fp8_error_text

    for tokens in (1, 7, 300):
        states = (torch.randn(tokens, 3, 64) * 5).to(torch.bfloat16)
        fp8, scales = quantize_fp8(states)
        means, maxes = fp8_error_stats(states, fp8, scales)
        assert fp8_error_text(means, maxes, tokens) == fp8_error_record(states, fp8, scales)


def test_a_sample_of_no_tokens_rounds_to_no_values():
    fp8, scales = quantize_fp8(torch.zeros(0, 4, 7168, dtype=torch.bfloat16))
    assert fp8.shape == (0, 4, 7168) and fp8.dtype == torch.float8_e4m3fn and scales.shape == (0, 1, 1)
