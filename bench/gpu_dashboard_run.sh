#!/usr/bin/env bash
# The dashboard watching a real extraction, started on the GPU host itself in local mode, in a tmux window that is
# read with `capture-pane` twice a second (docs/dashboard.md, "Seen on an H200"):
#
#   OUT=/some/dir [WATCH=ok|fault] [TP=1|2] [WHEELS=/tmp/w] bash bench/gpu_dashboard_run.sh
#
# It installs the wheels in $WHEELS as gpu_extract_run.sh does (vLLM and its needs, plus textual and its needs), and
# uses the tmux on PATH, or unpacks tmux's .deb files from $WHEELS into /tmp/tmux-root when there is none. The model
# and data are gpu_extract_run.sh's (a ~1 B random Llama in bf16, 9 shards) unless MODEL and DATA name others. Then:
#
#   tmux: eaglewatch launch local --name NAME-WATCH -- python3 -m eaglewatch extract --engine vllm ... (fast checks,
#   no miniature, fsync per file: the defaults an operator gets), the dashboard opening on the run at once;
#
# and every 0.5 s the pane's text goes to $W/captures-WATCH/NNNN.txt (its first line: seconds since launch).
# WATCH=ok runs to the end, then presses `g` (GPU view) and `l` (log); WATCH=fault makes the writing worker fail a
# bare assert after FAULT_AFTER samples, in vLLM's engine-core process, then presses `f` (failures), Enter (the
# traceback) and Escape. Both end with `q` (detach). Results in $OUT: captures-WATCH.tar.gz (every capture),
# run-WATCH.tar.gz (the run directory the agent wrote: log, events, exit; the output's manifest), console.txt.
# Locally, without a GPU: MODEL=... DATA=... EXTRA_ARGS="--dtype float32" (the checkout's .venv/bin on PATH).
set -u
WHEELS=${WHEELS:-/tmp/w}
W=${WORKDIR:-/tmp/gx}
OUT=${OUT:?set OUT to the folder for the results}
SAMPLES=${SAMPLES:-1024}
BATCH=${BATCH:-32}
SEQ=${SEQ:-1024}
LAYERS=${LAYERS:-2 8 13 16}
COLS=${COLS:-160}
ROWS=${ROWS:-48}
DEADLINE_S=${DEADLINE_S:-540}
NAME=${NAME:-h200-1b}
WATCH=${WATCH:-ok}          # ok: a run to the end; fault: one whose worker fails (below)
TP=${TP:-1}
FAULT_AFTER=${FAULT_AFTER:-200}
REPO=$(cd "$(dirname "$0")/.." && pwd)
T_START=$(date +%s)
mkdir -p "$OUT" "$W"
exec > >(tee "$OUT/console.txt") 2>&1
say() { echo "[dashboard-run +$(( $(date +%s) - T_START ))s] $*"; }

if [ -z "${MODEL:-}" ]; then
    say "wheels, model and data (gpu_extract_run.sh)"
    bash "$REPO/bench/gpu_extract_run.sh" install || exit 1
    if [ -e "$W/prep.started" ] && [ ! -e "$W/prep.done" ]; then   # a prep started earlier, in the background
        say "waiting for the prep started earlier"
        for _ in $(seq 1 300); do [ -e "$W/prep.done" ] && break; sleep 1; done
    fi
    SKIP_HF=1 SAMPLES=$SAMPLES SEQ=$SEQ WORKDIR=$W bash "$REPO/bench/gpu_extract_run.sh" prep || exit 1
    MODEL=$W/model DATA=$W/data.jsonl
    EXTRA_ARGS=${EXTRA_ARGS---enforce-eager}   # as in gpu_extract_run.sh: no CUDA graphs to capture at start-up
    export PYTHONPATH=/tmp/ew:/tmp/site
else
    : # MODEL given: the eaglewatch on PATH/PYTHONPATH as it is (e.g. the checkout's .venv on PATH)
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_WORKER_MULTIPROC_METHOD=spawn TERM=xterm-256color
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

if ! command -v tmux >/dev/null; then
    say "tmux from its .deb files"
    for f in "$WHEELS"/*.deb; do dpkg -x "$f" /tmp/tmux-root; done
    export PATH=/tmp/tmux-root/usr/bin:$PATH
    export LD_LIBRARY_PATH=/tmp/tmux-root/usr/lib/x86_64-linux-gnu:/tmp/tmux-root/lib/x86_64-linux-gnu
fi
tmux -V || exit 1
python3 -c "import textual, eaglewatch; print('textual', textual.__version__)" || exit 1

RUNS=$W/runs-$WATCH OUTPUT=$W/out-$WATCH CAPS=$W/captures-$WATCH
rm -rf "$RUNS" "$OUTPUT" "$CAPS" && mkdir -p "$CAPS"
export EAGLEWATCH_RUN_ROOT=$RUNS
LAUNCH=(--name "$NAME-$WATCH" --cwd /tmp)
# shellcheck disable=SC2086  # LAYERS and EXTRA_ARGS are word lists
JOB=(python3 -m eaglewatch extract --engine vllm --model-path "$MODEL" --prepared-data "$DATA"
     --output-dir "$OUTPUT" --layer-ids $LAYERS --max-seq-len "$SEQ" --batch-size "$BATCH" --no-miniature
     ${EXTRA_ARGS-})
[ "$TP" -gt 1 ] && JOB+=(--tp-size "$TP")
if [ "$WATCH" = fault ]; then
    # The writing worker fails a bare `assert` after FAULT_AFTER samples, in vLLM's own engine-core process: the
    # shape of the block_hashes crash (a worker's empty AssertionError, then EngineDeadError in the main process).
    LAUNCH+=(-e "EAGLEWATCH_INJECT_FAULT=worker_assert:$FAULT_AFTER")
    JOB+=(--engine-core-process)
fi
# Not from the checkout's root: its eaglewatch/ (without pipeline/) would shadow the package laid out in /tmp/ew.
DASH="cd /tmp && python3 -m eaglewatch launch local $(printf '%q ' "${LAUNCH[@]}")-- $(printf '%q ' "${JOB[@]}");"
DASH+=" echo EXIT=\$?; sleep 600"
tmux -L ew kill-server 2>/dev/null
say "tmux ${COLS}x${ROWS}: $DASH"
tmux -L ew new-session -d -s dash -x "$COLS" -y "$ROWS" "$DASH" || exit 1
T0=$(date +%s.%N)

capture() {  # capture NAME: the pane's text, after a line with the seconds since launch
    { date +%s.%N | awk -v t0="$T0" '{ printf "# t=%.1fs\n", $1 - t0 }'; tmux -L ew capture-pane -p -t dash; } \
        > "$CAPS/$1.txt"
}
press() {  # press KEY NAME: send a key, give the screen a moment, capture it
    tmux -L ew send-keys -t dash "$1"; sleep 1.5; capture "$2"
}

n=0 ended="" settled=""
while [ $(( $(date +%s) - T_START )) -lt "$DEADLINE_S" ]; do
    n=$((n + 1))
    capture "$(printf '%04d' "$n")"
    if [ -z "$ended" ] && ls "$RUNS"/*/exit.json >/dev/null 2>&1; then
        ended=$n
        say "the run ended (capture $n): $(tr -d '\n ' < "$RUNS"/*/exit.json)"
    fi
    # After the end, until the supervisor has dealt with any leftover processes, then some seconds more.
    if [ -n "$ended" ] && [ -z "$settled" ] && ! kill -0 "$(cat "$RUNS"/*/supervisor.pid)" 2>/dev/null; then
        settled=$n
        say "the supervisor is done (capture $n): $(tr -d '\n ' < "$RUNS"/*/exit.json)"
    fi
    [ -n "$settled" ] && [ $((n - settled)) -ge 6 ] && break
    sleep 0.5
done
[ -n "$ended" ] || say "the run had not ended by the deadline"
if [ "$WATCH" = fault ]; then
    press f after-f; press Enter after-enter; press Escape after-escape
else
    press g after-g; press l after-l
fi
tmux -L ew send-keys -t dash q; sleep 3; capture after-q
tmux -L ew kill-server 2>/dev/null
say "$n captures"; tail -n +2 "$CAPS/$(printf '%04d' "$n").txt"; grep -v '^$' "$CAPS/after-q.txt" | tail -3

rm -rf "$W/runpack" && mkdir -p "$W/runpack"
cp -r "$RUNS"/. "$W/runpack/" && cp "$OUTPUT"/manifest*.json "$OUTPUT"/events*.jsonl "$W/runpack/" 2>/dev/null
tar -C "$CAPS" -czf "$OUT/captures-$WATCH.tar.gz" .
tar -C "$W/runpack" -czf "$OUT/run-$WATCH.tar.gz" .
rm -rf "$OUTPUT"   # the hidden states themselves are not needed here; free the disk for the next watch
ls -la "$OUT"
say "done"
