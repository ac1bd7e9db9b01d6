#!/usr/bin/env bash
# speculators on a real GPU, on an eaglewatch output (BENCHMARKS.md, "speculators train on an H200"):
#
#   1. a ~1 B random Llama (bf16, 16 layers, the model of gpu_extract_run.sh; reused when $MODEL exists) and
#      SAMPLES samples of random token ids with log-normal lengths;
#   2. `eaglewatch extract` with default flags, layers 2 8 13 16 (the final layer last), then
#      `eaglewatch export --format speculators` with a draft vocabulary of DRAFT_VOCAB tokens;
#   3. the unpatched `speculators train` on that folder for STEPS steps (its log is train.log);
#   4. speculators' own data generation as a user runs it: `vllm serve` configured for hidden-state extraction
#      with vLLM's stock connector, then `speculators generate-offline-data` against it, all in one job log
#      (datagen.log); a second pass whose engine core is killed part-way, so that the log also holds how that
#      pipeline fails (datagen.log, after the line `== second pass ==`).
#
#   5. (stage fp8) the same data through `eaglewatch extract` twice, side by side: bf16 files in the native layout,
#      then `--format speculators --storage fp8` (preflight on) straight into speculators' FP8 layout; `verify
#      --against-hf` on both; then the unpatched `speculators train --hidden-states-backend fp8` on the fp8 folder.
#
#   OUT=/some/dir SPEC_WHEELS=/tmp/w8 bash bench/gpu_speculators_run.sh [model|train|datagen|fp8|all]
#
# `model` builds the model and stops (other GPU benchmarks reuse it); `train` is 1-3, `datagen` is 4 (on the
# folder `train` extracted), `all` both. The extraction uses --no-preflight --enforce-eager to spend the device's
# time on the trainer: the tensors are the same as with preflight, and eager mode changes no file's layout.
#
# vLLM must be installed in /tmp/site (bench/gpu_wheels.sh); the speculators wheels (speculators, hs-connectors,
# datasets, multiprocess) go to /tmp/spec-site. A copy run from outside the checkout needs EW_REPO=<checkout>.
set -u
STAGE=${1:-all}
case "$STAGE" in model|train|datagen|fp8|all) ;; *) echo "usage: $0 model|train|datagen|fp8|all" >&2; exit 64 ;; esac
OUT=${OUT:?set OUT to the results folder}
W=${WORKDIR:-/tmp/gs}
MODEL=${MODEL:-/tmp/gx/model}
SAMPLES=${SAMPLES:-1024}
STEPS=${STEPS:-300}
DRAFT_VOCAB=${DRAFT_VOCAB:-512}  # below the random Llama's vocabulary (896)
DEADLINE_S=${DEADLINE_S:-560}
T0=$(date +%s)
REPO=$(cd "$(dirname "$0")/.." && pwd)
REPO=${EW_REPO:-$REPO}
mkdir -p "$OUT" "$W"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_WORKER_MULTIPROC_METHOD=spawn
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
say() { echo "[speculators-run +$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/console.txt"; }
left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }

rm -rf /tmp/ew && mkdir -p /tmp/ew && cp -rL "$REPO/eaglewatch" /tmp/ew/
if [ -n "${SPEC_WHEELS:-}" ] && [ ! -e /tmp/spec-site/speculators ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/spec-site \
        "$SPEC_WHEELS"/*.whl 2>&1 | grep -v "^WARNING: Target directory" | tee -a "$OUT/console.txt"
fi
EWPATH=/tmp/ew:/tmp/site
SPECPATH=/tmp/spec-site:/tmp/site
cd "$W"

if [ ! -e "$MODEL/model.safetensors.index.json" ]; then
    say "building the model"
    PYTHONPATH=$EWPATH python3 - "$MODEL" <<'EOF'
import sys
from pathlib import Path
from eaglewatch.pipeline.tiny_model import BASE_CONFIGS, make_tiny_model
config = dict(BASE_CONFIGS["llama"], hidden_size=2048, num_hidden_layers=16, num_attention_heads=16,
              num_key_value_heads=8, head_dim=128, intermediate_size=8192, max_position_embeddings=4096)
make_tiny_model(Path(sys.argv[1]), config, shards=9, dtype="bfloat16")
EOF
fi
[ "$STAGE" = model ] && exit 0

write_data() {
PYTHONPATH=$EWPATH:$REPO/bench python3 - "$MODEL" "$W/data.jsonl" "$SAMPLES" <<'EOF'
import json, sys
from pathlib import Path
from bench_extract import lengths_for, write_data
vocab = json.loads((Path(sys.argv[1]) / "config.json").read_text())["vocab_size"]
n = write_data(Path(sys.argv[2]), lengths_for("lognormal", int(sys.argv[3]), 64, 2048, seed=0), vocab, seed=2)
print(f"data: {sys.argv[3]} samples, {n} tokens")
EOF
}

if [ "$STAGE" = fp8 ]; then
    write_data | tee -a "$OUT/console.txt"
    say "extract bf16 (native layout, --no-preflight)"
    PYTHONPATH=$EWPATH python3 -m eaglewatch extract --engine vllm --model-path "$MODEL" --prepared-data "$W/data.jsonl" \
        --output-dir "$W/out-bf16" --layer-ids 2 8 13 16 --max-seq-len 2048 --dtype bfloat16 --force-new \
        --no-preflight --enforce-eager > "$OUT/fp8-extract-bf16.log" 2>&1
    say "extract bf16 exit $?"
    say "extract fp8 (--format speculators --storage fp8, preflight on)"
    PYTHONPATH=$SPECPATH:/tmp/ew python3 -m eaglewatch extract --engine vllm --model-path "$MODEL" \
        --prepared-data "$W/data.jsonl" --output-dir "$W/out-fp8" --layer-ids 2 8 13 16 --max-seq-len 2048 \
        --dtype bfloat16 --force-new --enforce-eager --format speculators --storage fp8 \
        --draft-vocab-size "$DRAFT_VOCAB" > "$OUT/fp8-extract.log" 2>&1
    say "extract fp8 exit $?"
    cp "$W/out-fp8/speculators.json" "$OUT/fp8-speculators.json" 2>/dev/null
    du -sb "$W/out-bf16" "$W/out-fp8" | tee "$OUT/fp8-du.txt"
    for kind in bf16 fp8; do
        PYTHONPATH=$EWPATH python3 -m eaglewatch verify "$W/out-$kind" --against-hf 8 > "$OUT/fp8-verify-$kind.log" 2>&1
        say "verify $kind exit $?"
        PYTHONPATH=$EWPATH python3 -m eaglewatch verify "$W/out-$kind" --json > "$OUT/fp8-verify-$kind.json" 2>&1
    done
    say "speculators train --hidden-states-backend fp8, $STEPS steps ($(left) s left)"
    timeout -k 10 $(( $(left) - 10 )) env PYTHONPATH=$SPECPATH python3 -m speculators train \
        --verifier-name-or-path "$MODEL" --data-path "$W/out-fp8" --speculator-type eagle3 --target-layer-ids 2 8 13 \
        --draft-vocab-size "$DRAFT_VOCAB" --hidden-states-backend fp8 --max-steps "$STEPS" --total-seq-len 4096 \
        --log-freq 10 --save-path "$W/ckpt-fp8" --log-dir "$W/logs-fp8" --on-missing raise --num-workers 4 \
        --checkpoint-freq 100 --loss-implementation eager > "$OUT/fp8-train.log" 2>&1
    say "train exit $?"
    grep -c "loss" "$OUT/fp8-train.log" | sed 's/^/lines with a loss: /' | tee -a "$OUT/console.txt"
    say "done"; exit 0
fi

if [ "$STAGE" = train ] || [ "$STAGE" = all ]; then
write_data

say "extract (default flags)"
PYTHONPATH=$EWPATH python3 -m eaglewatch extract --engine vllm --model-path "$MODEL" --prepared-data "$W/data.jsonl" \
    --output-dir "$W/out" --layer-ids 2 8 13 16 --max-seq-len 2048 --dtype bfloat16 --force-new --no-preflight --enforce-eager \
    > "$OUT/extract.log" 2>&1
say "extract exit $?"
PYTHONPATH=$SPECPATH:/tmp/ew python3 -m eaglewatch export --format speculators "$W/out" \
    --draft-vocab-size "$DRAFT_VOCAB" > "$OUT/export.log" 2>&1
say "export exit $?: $(tail -1 "$OUT/export.log")"
cp "$W/out/speculators.json" "$OUT/" 2>/dev/null

say "speculators train, $STEPS steps"
timeout -k 10 $(( $(left) - 10 )) env PYTHONPATH=$SPECPATH python3 -m speculators train \
    --verifier-name-or-path "$MODEL" --data-path "$W/out" --speculator-type eagle3 --target-layer-ids 2 8 13 \
    --draft-vocab-size "$DRAFT_VOCAB" --max-steps "$STEPS" --total-seq-len 4096 --log-freq 10 \
    --save-path "$W/ckpt" --log-dir "$W/logs" --on-missing raise --num-workers 4 --checkpoint-freq 100 \
    --loss-implementation eager > "$OUT/train.log" 2>&1
say "train exit $?"
grep -c "loss" "$OUT/train.log" | sed 's/^/lines with a loss: /' | tee -a "$OUT/console.txt"
fi
[ "$STAGE" = train ] && { say "done"; exit 0; }

# speculators' own pipeline, as one job: the server, then the client against it.
cat > "$W/datagen_job.sh" <<EOF
set -u
PORT=8123
PYTHONPATH=/tmp/site python3 -m vllm.entrypoints.cli.main serve "$MODEL" --port \$PORT --max-model-len 2048 \\
    --enforce-eager --gpu-memory-utilization 0.5 --dtype bfloat16 \\
    --speculative-config '{"method": "extract_hidden_states", "num_speculative_tokens": 1, "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [2, 8, 13, 16]}}}' \\
    --kv-transfer-config '{"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer", "kv_connector_extra_config": {"shared_storage_path": "$W/hs-server"}}' &
SERVER=\$!
for i in \$(seq 600); do
    python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:\$PORT/health', timeout=2)" 2>/dev/null && break
    kill -0 \$SERVER 2>/dev/null || exit 1
    sleep 1
done
PYTHONPATH=$SPECPATH python3 -m speculators generate-offline-data --endpoint http://127.0.0.1:\$PORT/v1 \\
    --preprocessed-data "$W/out" --output "$W/dg1" --max-samples 512 --concurrency 16
echo "== second pass =="
( while [ \$(ls "$W/dg2" 2>/dev/null | wc -l) -lt 100 ]; do sleep 0.2; done
  for p in \$(pgrep -f 'EngineCore'); do kill -9 \$p; done ) &
PYTHONPATH=$SPECPATH python3 -m speculators generate-offline-data --endpoint http://127.0.0.1:\$PORT/v1 \\
    --preprocessed-data "$W/out" --output "$W/dg2" --concurrency 16 --max-retries 1
echo "client exit \$?"
kill \$SERVER 2>/dev/null
wait \$SERVER
EOF
say "datagen job ($(left) s left)"
timeout -k 10 $(( $(left) - 10 )) bash "$W/datagen_job.sh" > "$OUT/datagen.log" 2>&1
say "datagen exit $?"
ls "$W/dg1" 2>/dev/null | wc -l | sed 's/^/dg1 files: /' | tee -a "$OUT/console.txt"
ls "$W/dg2" 2>/dev/null | wc -l | sed 's/^/dg2 files: /' | tee -a "$OUT/console.txt"
say "done"
