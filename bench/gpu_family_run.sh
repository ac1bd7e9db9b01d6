#!/usr/bin/env bash
# The target family on a real GPU (an H200 with vLLM 0.26 installed in /tmp/site, see bench/gpu_wheels.sh):
#
#   bf16 half:  the Kimi-K2.5 config's miniature through `eaglewatch preflight` (bf16: its quantization_config
#               removed); a DeepSeek-V3 MoE with DeepSeek-V3's MLA dimensions (128/64/128, kv_lora_rank 512,
#               grouped noaux_tc routing, 6 layers, hidden 512, 8 shards) through `eaglewatch extract` with default
#               flags (preflight and miniature included), then `eaglewatch verify --against-hf`; the same for a
#               Qwen3-MoE model (Qwen3-30B-A3B's config, shrunk).
#   int4 half:  the same three, INT4: the Kimi-K2.5 config as it is (compressed-tensors pack-quantized), and the
#               two MoE models written by `make-tiny-model --quantization int4` (Kimi-K2's scheme: 4-bit, group 32,
#               symmetric, routed experts only; round-to-nearest).
#
#   OUT=/some/dir bash bench/gpu_family_run.sh bf16|int4|all
#
# EXTRACT_ARGS adds flags to the two MoE extractions (e.g. "--format speculators --storage fp8 --draft-vocab-size
# 512"; the speculators format needs `datasets`: EW_EXTRA_PATH=/tmp/spec-site puts it after vLLM's folder).
#
# Each half fits in 9 minutes on an H200 once vLLM is installed: a step starts only with time left, and each runs
# under `timeout`. Results in $OUT: one log per step (<step>.log), steps.tsv (step, exit code, seconds),
# summary.txt (the preflight and verify lines), the verify reports as JSON, and the models' config.json files.
# A copy of this script run from outside the checkout needs EW_REPO=<checkout>.
set -u
HALF=${1:-all}
case "$HALF" in bf16|int4|all) ;; *) echo "usage: OUT=DIR $0 bf16|int4|all" >&2; exit 64 ;; esac
OUT=${OUT:?set OUT to the results folder}
W=${WORKDIR:-/tmp/gf}
DEADLINE_S=${DEADLINE_S:-520}   # per half, from its start (the first from the script's)
REPO=$(cd "$(dirname "$0")/.." && pwd)
REPO=${EW_REPO:-$REPO}
mkdir -p "$OUT" "$W"
T_HALF=$(date +%s)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_WORKER_MULTIPROC_METHOD=spawn
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-$W/vllm-cache}
# The package maps pipeline/, tui/ and assets/ into eaglewatch/ through links: lay it out as one tree.
LAYOUT=${EW_LAYOUT:-/tmp/ew}
rm -rf "$LAYOUT" && mkdir -p "$LAYOUT" && cp -rL "$REPO/eaglewatch" "$LAYOUT/"
export PYTHONPATH=$LAYOUT:/tmp/site${EW_EXTRA_PATH:+:$EW_EXTRA_PATH}
cd "$W"  # not the checkout's root, so that the laid-out copy is the one imported
EW=(python3 -m eaglewatch)

say() { echo "[family-run $HALF +$(( $(date +%s) - T_HALF ))s] $*" | tee -a "$OUT/console.txt"; }
# shellcheck source=bench/gpu_steps.sh
. "$REPO/bench/gpu_steps.sh"

python3 -c "import vllm, sys; print('vllm', vllm.__version__, file=sys.stderr)" 2>>"$OUT/console.txt" || {
    say "vLLM does not import with PYTHONPATH=$PYTHONPATH: install it first (bench/gpu_wheels.sh)"; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$OUT/console.txt" 2>&1

# Target configs. DeepSeek-V3's and Qwen3-30B-A3B's published values, less their quantization (DeepSeek-V3's is
# FP8, which the tiny-model factory does not write); the Kimi-K2.5 config is the project's fixture.
mkdir -p "$W/configs"
cat > "$W/configs/deepseek_v3.json" <<'EOF'
{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280,
 "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
 "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
 "num_experts_per_tok": 8, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
 "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "topk_method": "noaux_tc",
 "scoring_func": "sigmoid", "norm_topk_prob": true, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3,
 "moe_layer_freq": 1, "max_position_embeddings": 163840, "rope_theta": 10000, "hidden_act": "silu",
 "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                  "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
 "rms_norm_eps": 1e-06, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}
EOF
cat > "$W/configs/qwen3_moe.json" <<'EOF'
{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
 "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
 "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
 "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": true, "hidden_act": "silu",
 "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "attention_bias": false,
 "tie_word_embeddings": false, "torch_dtype": "bfloat16"}
EOF
mkdir -p "$W/kimi-int4" "$W/kimi-bf16"
cp "$REPO/tests/fixtures/configs/kimi_k25_config.json" "$W/kimi-int4/config.json"
# Preflight wants a model folder with weights: one placeholder tensor stands in for the 1T parameters.
python3 - "$W/kimi-int4" "$W/kimi-bf16" <<'EOF'
import json, sys
import torch
from safetensors.torch import save_file
config = json.load(open(f"{sys.argv[1]}/config.json"))
config["text_config"].pop("quantization_config", None)
json.dump(config, open(f"{sys.argv[2]}/config.json", "w"), indent=1)
for folder in sys.argv[1:]:
    save_file({"placeholder": torch.zeros(8, dtype=torch.bfloat16)}, f"{folder}/model.safetensors",
              metadata={"format": "pt"})
EOF

# Prepared data: the bundled chat data through a tiny model's tokenizer (every tiny model has the same one).
if [ ! -e "$W/data.jsonl" ]; then
    step prepare-data 120 bash -c 'set -e; python3 -m eaglewatch make-tiny-model --arch llama --out "$0/tok" \
        --shards 1; python3 -m eaglewatch prepare --model-path "$0/tok" --output "$0/data.jsonl" --max-length 1024 \
        --input "$(python3 -c "from eaglewatch.assets import SAMPLE_CHAT_DATA as d; print(d)")"' "$W" ||
        { say "no prepared data; stopping"; exit 1; }
fi

# Kimi-K2.5: preflight on the config alone (no shards: the miniature is what is measured).
kimi() {
    local kind=$1
    step "kimi-$kind-preflight" 240 "${EW[@]}" preflight --engine vllm --model-path "$W/kimi-$kind" \
        --prepared-data "$W/data.jsonl" --output-dir "$W/out-kimi-$kind" --layer-ids 2 30 58 61
    grep -h -E 'miniature|preflight:' "$OUT/kimi-$kind-preflight.log" >> "$OUT/summary.txt"
}

# family NAME CONFIG QUANT LAYER_IDS...: build in 8 shards, extract with default flags, verify against HF.
family() {
    local name=$1 config=$2 quant=$3; shift 3
    local model="$W/model-$name" out="$W/out-$name"
    rm -rf "$model" "$out"
    step "$name-make" 120 "${EW[@]}" make-tiny-model --like "$config" --out "$model" --shards 8 --layers 6 \
        --platform gpu --dtype bfloat16 --quantization "$quant" || return
    cp "$model/config.json" "$OUT/$name.config.json"
    step "$name-extract" 330 "${EW[@]}" extract --model-path "$model" --prepared-data "$W/data.jsonl" \
        --output-dir "$out" --layer-ids "$@" ${EXTRACT_ARGS:-}
    grep -h -E '\] miniature|time to|phase: done|phase: failed|speculators layout|fp8' "$OUT/$name-extract.log" >> "$OUT/summary.txt"
    step "$name-verify" 150 "${EW[@]}" verify "$out" --against-hf 8 --json
    cp "$OUT/$name-verify.log" "$OUT/$name-verify.json" 2>/dev/null
    head -c 2000 "$OUT/$name-verify.log" >> "$OUT/summary.txt"; echo >> "$OUT/summary.txt"
}

run_half() {
    local kind=$1 quant=none
    [ "$kind" = int4 ] && quant=int4
    [ "${2:-}" = again ] && T_HALF=$(date +%s)  # the first half's clock started with the script
    kimi "$kind"
    family "deepseek-v3-$kind" "$W/configs/deepseek_v3.json" "$quant" 1 3 6
    family "qwen3-moe-$kind" "$W/configs/qwen3_moe.json" "$quant" 1 3 6
    say "$kind half done in $(( $(date +%s) - T_HALF ))s"
}

case "$HALF" in
    bf16|int4) run_half "$HALF" ;;
    all) run_half bf16; run_half int4 again ;;
esac
cat "$OUT/steps.tsv"
