#!/usr/bin/env bash
# One fresh-clone CI run of this checkout's HEAD while busy loops keep cores at 100 % (the suite must pass on a
# busy machine). Prints one line: commit, exit code, seconds, mean 1-minute load.
#   bash bench/loaded_ci_run.sh [BUSY_LOOPS (default 1)] [LOG (default: a file in the clone's parent)]
set -u
loops=${1:-1}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/eaglewatch-loaded.XXXX")
log=${2:-$work/ci.log}
git clone -q "$repo" "$work/c"
commit=$(git -C "$work/c" rev-parse --short HEAD)
pids=()
for _ in $(seq "$loops"); do python3 -c 'while True: pass' & pids+=($!); done
( while sleep 60; do cut -d' ' -f1 /proc/loadavg; done ) > "$work/load.txt" & sampler=$!
start=$(date +%s)
(cd "$work/c" && CI=true bash .ci/run) > "$log" 2>&1
code=$?
end=$(date +%s)
kill "${pids[@]}" "$sampler" 2>/dev/null
mean=$(awk '{s+=$1} END {if (NR) printf "%.2f", s/NR}' "$work/load.txt")
echo "commit $commit exit $code seconds $((end - start)) mean-load1 ${mean:-?} log $log"
