#!/usr/bin/env bash
# Extraction at the target's real width (hidden 7168, layers 1-4 saved: 57,344 bytes a token in bf16) on a real GPU
# (vLLM 0.26 in /tmp/site: bench/gpu_wheels.sh), in two device calls:
#
#   OUT=/some/dir PHASE=disk    bash bench/gpu_width_run.sh [SAMPLES] [ROUNDS]
#       a light Kimi-K2.5-like model (8 experts of MLP 128, 313 MB) that produces bytes faster than any disk, then
#       bench/bench_disk.py: eaglewatch bf16 and fp8 against `dd` of the same bytes, with small dirty-page limits,
#       several rounds in one run; each run's progress events say what set the pace.
#   OUT=/some/dir PHASE=feeding bash bench/gpu_width_run.sh [SAMPLES] [ROUNDS]
#       a heavier one (16 experts of Kimi-K2.5's real expert MLP, 2048: 5.8 GB), then bench/bench_extract.py's
#       feeding runs side by side: bare vLLM with its stock connector, eaglewatch default (bf16) and fp8, all timed
#       to the last byte on disk.
set -u
OUT=${OUT:?set OUT to the results folder}
PHASE=${PHASE:?set PHASE to disk or feeding}
REPO=$(cd "$(dirname "$0")/.." && pwd)
W=${WORKDIR:-/tmp/width}
mkdir -p "$OUT" "$W"
. "$REPO/bench/gpu_env.sh"
say() { echo "[width +${SECONDS}s] $*" | tee -a "$OUT/console.txt"; }
model() {  # folder, then make-tiny-model's extra flags
    local dest=$1; shift
    if [ ! -e "$dest/config.json" ]; then
        say "model $dest $*"
        timeout 300 python3 -m eaglewatch make-tiny-model --like "$REPO/tests/fixtures/configs/kimi_k25_config.json" \
            --hidden-size 7168 --layers 4 --quantization none --dtype bfloat16 --out "$dest" "$@" \
            >> "$OUT/model.txt" 2>&1
        du -sh "$dest" >> "$OUT/model.txt"
    fi
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
df -h /tmp >> "$OUT/gpu.txt" 2>&1
if [ "$PHASE" = disk ]; then
    model "$W/light"
    say "disk-bound"
    timeout 540 python3 "$REPO/bench/bench_disk.py" --model "$W/light" --workdir "$W/disk" --dtype bfloat16 \
        --layers 1 2 3 4 --max-len 2048 --samples "${1:-512}" --enforce-eager --rounds "${2:-3}" \
        --storages dtype fp8 --json "$OUT/disk.json" > "$OUT/disk.md" 2> "$OUT/disk.err"
    say "disk-bound exit $?"
else
    model "$W/heavy" --experts 16 --moe-intermediate-size 2048
    say "feeding"
    timeout 560 python3 "$REPO/bench/bench_extract.py" feeding --workdir "$W/feed" --model "$W/heavy" \
        --dtype bfloat16 --max-len 2048 --layers 1 2 3 4 --enforce-eager --bare-connector stock --lengths lognormal \
        --samples "${1:-256}" --repeat "${2:-2}" --runs bare default fp8 --json "$OUT/feeding.json" \
        > "$OUT/feeding.md" 2> "$OUT/feeding.err"
    say "feeding exit $?"
fi
tail -c 20000 "$OUT/${PHASE}.err" > "$OUT/${PHASE}.err.tail" 2>/dev/null && rm -f "$OUT/${PHASE}.err"
say "done"
