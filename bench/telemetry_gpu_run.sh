#!/usr/bin/env bash
# Telemetry on a real GPU machine, in one go: check the software, record a telemetry stream while a torch workload
# allocates, frees and computes, time the GPU release after stopping it, and measure the sampling cost.
#
#   OUT=/some/dir bash bench/telemetry_gpu_run.sh
#
# Results in $OUT: stream.jsonl raw.jsonl workload.log release.jsonl (bench/capture_telemetry.py),
# bench_gpus.json (the GPUs present), bench_8gpus.json (each GPU queried 8/N times: 8 GPUs' worth of queries),
# console.txt (everything printed, nvidia-smi included). BENCH_ONLY=1 runs the workload and measures the cost only.
set -u
OUT=${OUT:?set OUT to the folder for the results}
mkdir -p "$OUT"
exec > >(tee "$OUT/console.txt") 2>&1
cd "$(dirname "$0")/.."
REPO=$(pwd)

# The package maps pipeline/ and tui/ into eaglewatch/; lay that out in a scratch folder instead of installing.
rm -rf /tmp/ew && mkdir -p /tmp/ew
cp -rL eaglewatch /tmp/ew/  # its pipeline/, tui/ and assets/ are links: -L copies what they point to
export PYTHONPATH=/tmp/ew PYTHONUNBUFFERED=1
# Not from the checkout's root: its eaglewatch/ (without pipeline/) would shadow the one laid out above.
cd /tmp

echo "== software"
uname -r; nproc
nvidia-smi --query-gpu=index,name,driver_version,memory.total,power.limit --format=csv
python3 - <<'EOF'
import importlib.metadata as md
for name in ("nvidia-ml-py", "psutil", "torch"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "MISSING")
import torch
print("cuda devices", torch.cuda.device_count())
EOF
python3 -m eaglewatch.pipeline.telemetry --count 1 --text

NGPU=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
REPEAT=$(( NGPU > 0 ? (8 + NGPU - 1) / NGPU : 1 ))
D=/tmp/cap
rm -rf "$D" && mkdir -p "$D/work/output"

echo "== capture and benchmark (${NGPU} GPU(s); 8-GPU stand-in queries each ${REPEAT}x)"
python3 "$REPO/bench/bench_telemetry.py" --duration "${BENCH_S:-62}" --job-pid-file "$D/work/job.pid" --output-dir "$D/work/output" \
    --query-costs 2000 --json-out "$OUT/bench_gpus.json" > /dev/null &
B1=$!
python3 "$REPO/bench/bench_telemetry.py" --duration "${BENCH_S:-62}" --gpu-repeat "$REPEAT" --job-pid-file "$D/work/job.pid" \
    --output-dir "$D/work/output" --json-out "$OUT/bench_8gpus.json" > /dev/null &
B2=$!
( for i in $(seq 1 15); do sleep 5; echo "-- nvidia-smi compute apps at +$((i * 5))s";
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; done ) &
S=$!
if [ -n "${BENCH_ONLY:-}" ]; then
    # Only the cost: the same workload as the job, without recording a stream.
    python3 "$REPO/bench/telemetry_workload.py" --out-dir "$D/work/output" --duration 80 ${CAPTURE_ARGS:-} \
        > "$D/workload.log" 2>&1 &
    W=$!
    echo $W > "$D/work/job.pid"
    wait $B1 $B2
    kill $W $S 2>/dev/null
    wait $W $S  # not a bare wait: that would also wait for the tee above
    cat "$OUT/bench_gpus.json" "$OUT/bench_8gpus.json"
    exit 0
fi
python3 "$REPO/bench/capture_telemetry.py" --dest "$D" --samples "${SAMPLES:-72}" --kill-after "${KILL_AFTER:-60}" ${CAPTURE_ARGS:-}
wait $B1 $B2
kill $S 2>/dev/null
echo "== clock event reasons as nvidia-smi reads them, after the run"
nvidia-smi -q -d PERFORMANCE | head -30
cp "$D/stream.jsonl" "$D/raw.jsonl" "$D/workload.log" "$D/release.jsonl" "$OUT/"
cat "$OUT/bench_gpus.json" "$OUT/bench_8gpus.json"
ls -la "$OUT"
