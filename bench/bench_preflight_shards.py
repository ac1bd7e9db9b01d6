"""Preflight's shard checks at the scale of a real checkpoint: a DeepSeek-V3-shaped folder (163 shards, ~91k
tensors, FP8 weights with their scales) whose shards are sparse files, so it takes no disk space but has the real
headers and sizes. Times the model-folder and shard checks in process, and the whole ``preflight --no-miniature``
command (with the tiny model's prepared data, whose ids fit the vocabulary).

    .venv/bin/python bench/bench_preflight_shards.py [--workdir .work/bench-preflight-shards]
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

from bench_common import tiny_llama_with_data, work_folder

LAYERS, DENSE, EXPERTS, HIDDEN, MOE_INTER, INTER, VOCAB, SHARDS = 61, 3, 256, 7168, 2048, 18432, 129280, 163


def tensors() -> dict[str, tuple[str, list[int]]]:
    """Names, dtypes and shapes in DeepSeek-V3's layout (attention simplified to its MLA projections)."""
    out: dict[str, tuple[str, list[int]]] = {"model.embed_tokens.weight": ("BF16", [VOCAB, HIDDEN]),
                                             "lm_head.weight": ("BF16", [VOCAB, HIDDEN]),
                                             "model.norm.weight": ("BF16", [HIDDEN])}

    def fp8(name: str, rows: int, cols: int) -> None:
        out[name + ".weight"] = ("F8_E4M3", [rows, cols])
        out[name + ".weight_scale_inv"] = ("F32", [(rows + 127) // 128, (cols + 127) // 128])

    for layer in range(LAYERS):
        p = f"model.layers.{layer}"
        for proj, rows, cols in (("q_a_proj", 1536, HIDDEN), ("q_b_proj", 24576, 1536), ("kv_a_proj_with_mqa", 576,
                                 HIDDEN), ("kv_b_proj", 32768, 512), ("o_proj", HIDDEN, 16384)):
            fp8(f"{p}.self_attn.{proj}", rows, cols)
        for norm, size in (("input_layernorm", HIDDEN), ("post_attention_layernorm", HIDDEN),
                           ("self_attn.q_a_layernorm", 1536), ("self_attn.kv_a_layernorm", 512)):
            out[f"{p}.{norm}.weight"] = ("BF16", [size])
        if layer < DENSE:
            for proj, rows, cols in (("gate_proj", INTER, HIDDEN), ("up_proj", INTER, HIDDEN),
                                     ("down_proj", HIDDEN, INTER)):
                fp8(f"{p}.mlp.{proj}", rows, cols)
            continue
        out[f"{p}.mlp.gate.weight"] = ("BF16", [EXPERTS, HIDDEN])
        out[f"{p}.mlp.gate.e_score_correction_bias"] = ("F32", [EXPERTS])
        for e in [*(f"experts.{i}" for i in range(EXPERTS)), "shared_experts"]:
            for proj, rows, cols in (("gate_proj", MOE_INTER, HIDDEN), ("up_proj", MOE_INTER, HIDDEN),
                                     ("down_proj", HIDDEN, MOE_INTER)):
                fp8(f"{p}.mlp.{e}.{proj}", rows, cols)
    return out


BITS = {"BF16": 16, "F32": 32, "F8_E4M3": 8}


def write_sparse_shard(path: Path, entries: dict[str, tuple[str, list[int]]]) -> int:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    at = 0
    for name, (dtype, shape) in entries.items():
        size = BITS[dtype] // 8
        for d in shape:
            size *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + size]}
        at += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + at)  # a hole: the apparent size without the bytes
    return at


def build(folder: Path) -> Path:
    if (folder / "model.safetensors.index.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    names = tensors()
    order = list(names)
    per = -(-len(order) // SHARDS)
    weight_map, total = {}, 0
    for i in range(SHARDS):
        shard = f"model-{i + 1:05d}-of-{SHARDS:06d}.safetensors"
        chunk = order[i * per:(i + 1) * per]
        total += write_sparse_shard(folder / shard, {n: names[n] for n in chunk})
        weight_map.update(dict.fromkeys(chunk, shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                      "weight_map": weight_map}, indent=2))
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": LAYERS,
              "hidden_size": HIDDEN, "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": VOCAB,
              "kv_lora_rank": 512, "qk_rope_head_dim": 64, "moe_intermediate_size": MOE_INTER,
              "n_routed_experts": EXPERTS, "torch_dtype": "bfloat16",
              "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", default=".work/bench-preflight-shards")
    args = parser.parse_args()
    work = work_folder(args.workdir)
    model = build(work / "deepseek-v3-sparse")
    _, data = tiny_llama_with_data(work, "llama", shards=1)

    from eaglewatch.pipeline import model_info as mi
    from eaglewatch.pipeline.preflight import checks

    inproc = []
    for _ in range(5):
        t0 = time.perf_counter()
        info = mi.load_model_info(model)
        result = checks._check_shards(info)
        inproc.append(time.perf_counter() - t0)
    assert result.status == checks.PASS, result
    tensors_n = len(info.index.weight_map) if info.index else 0
    base = [sys.executable, "-m", "eaglewatch", "preflight", "--no-miniature", "--engine", "hf", "--model-path",
            str(model), "--prepared-data", str(data), "--output-dir", str(work / "out"), "--max-seq-len", "512"]
    cli = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run(base, capture_output=True, text=True)
        cli.append(time.perf_counter() - t0)
    print(f"| {len(info.shards)} shards, {tensors_n} tensors, {info.weights_bytes / 1e9:.0f} GB (sparse) | seconds |")
    print("|---|---|")
    print(f"| config + index + every shard header and size, in process (median of 5) | {statistics.median(inproc):.3f} |")
    print(f"| `preflight --no-miniature`, whole CLI process (median of 3) | {statistics.median(cli):.2f} |")


if __name__ == "__main__":
    main()
