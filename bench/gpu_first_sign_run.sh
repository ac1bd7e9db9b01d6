#!/usr/bin/env bash
# The miniature's first sign, and its cost beside a healthy job, on a real GPU (an H200 with vLLM 0.26 in
# /tmp/site, see bench/gpu_wheels.sh):
#
#   ours-cold:  the Kimi-K2.5 INT4 config through `eaglewatch preflight` on a host where vLLM never ran (a fresh
#               HOME: no vLLM, Triton, FlashInfer or CUDA caches), timed by bench/first_sign.py.
#   bare-cold:  bare vLLM's own first start of the same miniature (bench/write_miniature.py) in another fresh HOME,
#               timed by bench/bare_vllm_start.py; then both again with their HOME's caches warm (ours-warm,
#               bare-warm).
#   job:        a DeepSeek-V3-like INT4 model at the real width (hidden 7168), 640 samples extracted three times
#               (eager unless JOB_FLAGS says otherwise): --no-miniature to warm up, then --no-miniature and with the
#               miniature (auto: beside the load), timed.
#   The two cold runs are one device call each (each can take minutes); every step is sampled every 15 s by a
#   watcher (the process tree, and py-spy's stacks of its Python processes when py-spy is there) so that a silent
#   minute says where it went.
#
#   OUT=/some/dir bash bench/gpu_first_sign_run.sh ours-cold|bare-cold|job|job-again
#
# Results in $OUT: one log per step, steps.tsv (step, exit code, seconds), *.json from the timers, the preflight
# events (stage times and vLLM's own timing lines), summary.txt.
set -u
PART=${1:?usage: OUT=DIR $0 ours-cold|bare-cold|job|job-again}
OUT=${OUT:?set OUT to the results folder}
W=${WORKDIR:-/tmp/fs}
DEADLINE_S=${DEADLINE_S:-560}
REPO=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT" "$W"
T_HALF=$(date +%s)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_WORKER_MULTIPROC_METHOD=spawn
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LAYOUT=/tmp/ew
rm -rf "$LAYOUT" && mkdir -p "$LAYOUT" && cp -rL "$REPO/eaglewatch" "$LAYOUT/"
export PYTHONPATH=$LAYOUT:/tmp/site PATH=/tmp/site/bin:$PATH
cd "$W"
EW=(python3 -m eaglewatch)
say() { echo "[first-sign $PART +$(( $(date +%s) - T_HALF ))s] $*" | tee -a "$OUT/console.txt"; }
# shellcheck source=bench/gpu_steps.sh
. "$REPO/bench/gpu_steps.sh"
# A host where nothing ran yet: every cache under a HOME of its own, made once per machine, so the later parts run
# in the caches the earlier ones left.
home() { [ -d "$1" ] || mkdir -p "$1"; echo "HOME=$1 XDG_CACHE_HOME=$1/.cache VLLM_CACHE_ROOT=$1/.cache/vllm TRITON_CACHE_DIR=$1/.triton FLASHINFER_WORKSPACE_BASE=$1"; }
cold_ours=$(home "$W/home-ours") cold_bare=$(home "$W/home-bare")

if [ ! -e "$W/data.jsonl" ]; then
    step prepare-data 120 bash -c 'set -e; python3 -m eaglewatch make-tiny-model --arch llama --out "$0/tok" \
        --shards 1; python3 -m eaglewatch prepare --model-path "$0/tok" --output "$0/data.jsonl" --max-length 1024 \
        --input "$(python3 -c "from eaglewatch.assets import SAMPLE_CHAT_DATA as d; print(d)")"' "$W" ||
        { say "no prepared data; stopping"; exit 1; }
fi

kimi_folder() {
    mkdir -p "$W/kimi-int4"
    cp "$REPO/tests/fixtures/configs/kimi_k25_config.json" "$W/kimi-int4/config.json"
    # Preflight wants a model folder with weights: one placeholder tensor stands in for the 1T parameters.
    python3 -c "import torch, sys; from safetensors.torch import save_file; save_file({'placeholder': torch.zeros(8, dtype=torch.bfloat16)}, sys.argv[1], metadata={'format': 'pt'})" "$W/kimi-int4/model.safetensors"
    PRE=(preflight --engine vllm --model-path "$W/kimi-int4" --prepared-data "$W/data.jsonl"
         --output-dir "$W/out-kimi" --layer-ids 2 30 58 61)
}

# watch NAME: every 15 s, the process tree and (with py-spy) the Python stacks, into $OUT/NAME.watch.txt.
watch() {
    local file="$OUT/$1.watch.txt"
    while sleep 15; do
        { echo "=== +$(( $(date +%s) - T_HALF ))s"
          ps -eo pid,ppid,etimes,pcpu,rss,args --forest | grep -v -E ' (ps|grep|sleep) ' | cut -c1-220 | tail -40
          if command -v py-spy >/dev/null; then
              for pid in $(pgrep -f 'eaglewatch|miniature|bare_vllm_start|EngineCore'); do
                  timeout 10 py-spy dump --pid "$pid" 2>&1 | head -60
              done
          fi; } >> "$file" 2>&1
    done
}
watched() { watch "$1" & local w=$!; step "$@"; local rc=$?; kill $w 2>/dev/null; wait $w 2>/dev/null; return $rc; }

ours-cold() {
    kimi_folder
    watched ours-cold 560 env $cold_ours python3 "$REPO/bench/first_sign.py" "$OUT/ours-cold.json" -- "${EW[@]}" \
        "${PRE[@]}" --events "$OUT/ours-cold.events.jsonl"
}

bare-cold() {
    kimi_folder
    [ -e "$W/mini/config.json" ] || step write-miniature 60 python3 "$REPO/bench/write_miniature.py" "$W/kimi-int4" "$W/mini"
    watched bare-cold 400 env $cold_bare python3 "$REPO/bench/bare_vllm_start.py" "$W/mini" "$OUT/bare-cold.json"
    step ours-warm 120 env $cold_ours python3 "$REPO/bench/first_sign.py" "$OUT/ours-warm.json" -- "${EW[@]}" \
        "${PRE[@]}" --events "$OUT/ours-warm.events.jsonl"
    step bare-warm 120 env $cold_bare python3 "$REPO/bench/bare_vllm_start.py" "$W/mini" "$OUT/bare-warm.json"
}

job() {
    local model="$W/job-model"
    if [ ! -e "$model/config.json" ]; then
        step job-make 200 "${EW[@]}" make-tiny-model --like "$REPO/bench/configs/deepseek_v3.json" --out "$model" \
            --shards 8 --layers 6 --hidden-size 7168 --platform gpu --dtype bfloat16 --quantization int4 || return
    fi
    du -sh "$model" | tee -a "$OUT/console.txt"
    # The 64 bundled samples, 10 times over (ids made unique): an extraction long enough that the miniature's minute
    # runs beside it, as it runs beside a real load's 18 minutes.
    python3 -c "import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2], 'w') as out:
    for k in range(10):
        for r in rows: out.write(json.dumps(dict(r, id=f'{r[\"id\"]}-{k}')) + chr(10))" "$W/data.jsonl" "$W/job-data.jsonl"
    # Eager (JOB_FLAGS): the pair compares the job with and without the miniature, not torch.compile's warm-up.
    run=(extract --model-path "$model" --prepared-data "$W/job-data.jsonl" --layer-ids 1 3 6 --force-new
               ${JOB_FLAGS---enforce-eager})
    step job-warmup 200 env $cold_ours "${EW[@]}" "${run[@]}" --output-dir "$W/out-job" --no-miniature
    job_pair job no-miniature beside
}

# job-again: the pair once more, in the other order (run after `job`, on the same machine).
job-again() { run=(extract --model-path "$W/job-model" --prepared-data "$W/job-data.jsonl" --layer-ids 1 3 6
                   --force-new ${JOB_FLAGS---enforce-eager}); job_pair job2 beside no-miniature; }

job_pair() {
    local prefix=$1 kind; shift
    for kind in "$@"; do
        local flag=--no-miniature; [ "$kind" = beside ] && flag=
        step "$prefix-$kind" 170 env $cold_ours "${EW[@]}" "${run[@]}" --output-dir "$W/out-job" $flag
        grep -h -E 'miniature|phase: done|phase: failed' "$OUT/$prefix-$kind.log" | cut -c1-300 >> "$OUT/summary.txt"
    done
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$OUT/console.txt" 2>&1
"$PART"
cat "$OUT/steps.tsv"
