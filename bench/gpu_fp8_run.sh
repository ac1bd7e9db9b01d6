#!/usr/bin/env bash
# FP8 rounded on the GPU at the target's width, on a real GPU (vLLM 0.26 in /tmp/site: bench/gpu_wheels.sh):
# a random Kimi-K2.5-like model at hidden 7168 (4 layers, bf16, `make-tiny-model --like` the published config),
# then bench/bench_extract.py's feeding runs side by side in one run: bare vLLM with its stock connector, eaglewatch
# with default flags (bf16), and `--storage fp8`; then the FP8 files against the host's rounding of the bf16 ones
# (bench/fp8_gpu_check.py) and `eaglewatch verify` of the FP8 folder.
#
#   OUT=/some/dir bash bench/gpu_fp8_run.sh [SAMPLES]
set -u
OUT=${OUT:?set OUT to the results folder}
SAMPLES=${1:-256}
REPO=$(cd "$(dirname "$0")/.." && pwd)
W=${WORKDIR:-/tmp/fp8}
mkdir -p "$OUT" "$W"
. "$REPO/bench/gpu_env.sh"
say() { echo "[fp8 +${SECONDS}s] $*" | tee -a "$OUT/console.txt"; }
if [ ! -e "$W/model/config.json" ]; then
    say "model"
    timeout 240 python3 -m eaglewatch make-tiny-model --like "$REPO/tests/fixtures/configs/kimi_k25_config.json" \
        --hidden-size 7168 --layers 4 --quantization none --dtype bfloat16 --out "$W/model" > "$OUT/model.txt" 2>&1
    du -sh "$W/model" >> "$OUT/model.txt"
fi
say "feeding"
timeout 420 python3 "$REPO/bench/bench_extract.py" feeding --workdir "$W/bench" --model "$W/model" --dtype bfloat16 \
    --max-len 2048 --layers 1 2 3 4 --enforce-eager --bare-connector stock --lengths lognormal \
    --samples "$SAMPLES" --repeat 1 --runs bare default fp8 --json "$OUT/feeding.json" \
    > "$OUT/feeding.md" 2> "$OUT/feeding.err"
say "feeding exit $?"
du -s --block-size=1 "$W/bench/out-lognormal-default" "$W/bench/out-lognormal-fp8" > "$OUT/bytes.txt" 2>&1
timeout 120 python3 "$REPO/bench/fp8_gpu_check.py" "$W/bench/out-lognormal-default" "$W/bench/out-lognormal-fp8" \
    > "$OUT/fp8_check.txt" 2>&1
timeout 120 python3 -m eaglewatch verify "$W/bench/out-lognormal-fp8" > "$OUT/verify_fp8.txt" 2>&1
say "done"
