#!/usr/bin/env bash
# The preflight on published EAGLE-3 target configs, on a real GPU (vLLM installed in /tmp/site): the H200 half of
# docs/preflight.md's coverage table.
#
# For each config in tests/fixtures/target-configs/ (and the Kimi-K2.5 fixture): the static EAGLE-3 verdict of the
# installed vLLM and its time; then, as a new user runs it, `make-tiny-model --like` (GPU sizes, bf16), `extract`
# with default flags (preflight and miniature included) and `verify --against-hf`. A refused target stops at the
# preflight, which is its verdict.
#
#   OUT=/some/dir bash bench/gpu_targets_run.sh
#
# TARGETS picks configs by path under tests/fixtures/target-configs/ (default: the published ones at its top);
# EXTRACT_ARGS adds flags to each extract (e.g. "--no-miniature --enforce-eager" to verify the real extraction
# within a fresh machine's time).
#
# Results in $OUT: one log per step, steps.tsv (step, exit code, seconds), static.tsv (architecture, verdict,
# seconds), summary.txt (the preflight's architecture and miniature lines, and verify's result).
set -u
OUT=${OUT:?set OUT to the results folder}
W=${WORKDIR:-/tmp/gt}
DEADLINE_S=${DEADLINE_S:-540}
REPO=$(cd "$(dirname "$0")/.." && pwd)
REPO=${EW_REPO:-$REPO}
mkdir -p "$OUT" "$W"
T_HALF=$(date +%s)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_WORKER_MULTIPROC_METHOD=spawn
export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-$W/vllm-cache}
LAYOUT=${EW_LAYOUT:-/tmp/ew}
rm -rf "$LAYOUT" && mkdir -p "$LAYOUT" && cp -rL "$REPO/eaglewatch" "$LAYOUT/"
export PYTHONPATH=$LAYOUT:/tmp/site
cd "$W"
EW=(python3 -m eaglewatch)
say() { echo "[targets-run +$(( $(date +%s) - T_HALF ))s] $*" | tee -a "$OUT/console.txt"; }
# shellcheck source=bench/gpu_steps.sh
. "$REPO/bench/gpu_steps.sh"

python3 -c "import vllm, sys; print('vllm', vllm.__version__, file=sys.stderr)" 2>>"$OUT/console.txt" || {
    say "vLLM does not import with PYTHONPATH=$PYTHONPATH"; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$OUT/console.txt" 2>&1

if [ -n "${TARGETS:-}" ]; then
    CONFIGS=()
    for t in $TARGETS; do CONFIGS+=("$REPO/tests/fixtures/target-configs/$t"); done
else
    CONFIGS=("$REPO"/tests/fixtures/target-configs/*.json)
fi
# The static verdict of every config, each in a fresh process (what a user's preflight pays).
for config in "${CONFIGS[@]}" "$REPO/tests/fixtures/configs/kimi_k25_config.json"; do
    python3 - "$config" >> "$OUT/static.tsv" 2>>"$OUT/console.txt" <<'PY'
import json, sys, time
t0 = time.monotonic()
from eaglewatch.pipeline.preflight.eagle3_support import eagle3_support
from eaglewatch.pipeline.preflight.vllm_source import find_vllm
config = json.load(open(sys.argv[1]))
archs = [config["architectures"][0]]
if "text_config" in config:
    archs += config["text_config"].get("architectures", [])
for arch in archs:
    support = eagle3_support(find_vllm(), arch)
    print(f"{arch}\t{support.status}\t{time.monotonic() - t0:.2f}\t{support.reason}")
PY
done
cat "$OUT/static.tsv"

if [ ! -e "$W/data.jsonl" ]; then
    step prepare-data 120 bash -c 'set -e; python3 -m eaglewatch make-tiny-model --arch llama --out "$0/tok" \
        --shards 1; python3 -m eaglewatch prepare --model-path "$0/tok" --output "$0/data.jsonl" --max-length 1024 \
        --input "$(python3 -c "from eaglewatch.assets import SAMPLE_CHAT_DATA as d; print(d)")"' "$W" ||
        { say "no prepared data; stopping"; exit 1; }
fi

for config in "${CONFIGS[@]}"; do
    name=$(basename "$config" .json)
    model="$W/model-$name" out="$W/out-$name"
    rm -rf "$model" "$out"
    step "$name-make" 120 "${EW[@]}" make-tiny-model --like "$config" --out "$model" --shards 4 --layers 6 \
        --platform gpu --dtype bfloat16 || continue
    step "$name-extract" 300 "${EW[@]}" extract --model-path "$model" --prepared-data "$W/data.jsonl" \
        --output-dir "$out" --layer-ids 1 3 6 ${EXTRACT_ARGS:-}
    { echo "== $name"; grep -h -E '\] (architecture|miniature)|preflight:|phase: done|error:' \
        "$OUT/$name-extract.log"; } >> "$OUT/summary.txt"
    [ -e "$out/manifest.json" ] || continue
    step "$name-verify" 150 "${EW[@]}" verify "$out" --against-hf 4
    tail -n 4 "$OUT/$name-verify.log" >> "$OUT/summary.txt"
done
cat "$OUT/steps.tsv"
