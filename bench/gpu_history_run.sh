#!/usr/bin/env bash
# The supervisor's GPU history and leftover handling on a real GPU, no vLLM needed (docs/telemetry.md):
#
#   OUT=/some/dir bash bench/gpu_history_run.sh
#
# A job takes 8 GiB, then 24 GiB of GPU 0 with torch, starts a child that takes 4 GiB more and never ends, and
# exits. The run is launched as operators do (`eaglewatch launch local`), with a history line every second and a
# 3 s grace for leftovers. Results in $OUT: run.tar.gz (the run directory), served.json (what the agent's
# gpu_history op returns), console.txt.
set -u
OUT=${OUT:?set OUT to the folder for the results}
REPO=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
exec > >(tee "$OUT/console.txt") 2>&1
rm -rf /tmp/ew /tmp/hist-runs && mkdir -p /tmp/ew
cp -rL "$REPO/eaglewatch" /tmp/ew/  # its pipeline/, tui/ and assets/ are links: -L copies what they point to
cd /tmp
export PYTHONPATH=/tmp/ew EAGLEWATCH_RUN_ROOT=/tmp/hist-runs EAGLEWATCH_GPU_HISTORY_S=1 EAGLEWATCH_LEFTOVER_GRACE_S=3
cat > /tmp/hist_job.py <<'PY'
import subprocess, sys, time
import torch

def hold(gib):
    block = torch.empty(gib * 2**30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    return block

a = hold(8); print("holding 8 GiB", flush=True); time.sleep(4)
b = hold(16); print("holding 24 GiB", flush=True); time.sleep(4)
child = subprocess.Popen([sys.executable, "-c", "import time, torch; x = torch.empty(4 * 2**30, dtype=torch.uint8, "
                          "device='cuda'); torch.cuda.synchronize(); print('child holds 4 GiB', flush=True); "
                          "time.sleep(600)"])
time.sleep(8)
print("main process exits; its child stays", flush=True)
PY
run=$(python3 -m eaglewatch launch local --no-tui --name history -- python3 /tmp/hist_job.py)
echo "run $run"
dir=/tmp/hist-runs/$run
for _ in $(seq 1 90); do
    sleep 1
    [ -e "$dir/exit.json" ] && ! kill -0 "$(cat "$dir/supervisor.pid")" 2>/dev/null && break
done
cat "$dir/log"; cat "$dir/exit.json"; echo
python3 - "$dir" <<'PY'
import json, sys
for line in open(sys.argv[1] + "/gpu_history.jsonl"):
    s = json.loads(line)
    print(f"{s['t']:.1f}", " ".join(f"GPU{g['index']} {g['mem_used'] / 2**30:6.2f} GiB {g['util_gpu']:3}%" for g in s["gpus"]))
PY
python3 -c "
import json, sys
from eaglewatch.tui.connection import Connection
with Connection('local') as c:
    samples = c.gpu_history(sys.argv[1], limit=1000)
json.dump(samples, open(sys.argv[2], 'w'))
print(len(samples), 'samples served by the agent')
" "$run" "$OUT/served.json"
tar -C "$dir" -czf "$OUT/run.tar.gz" .
