#!/usr/bin/env bash
# GPU telemetry through the driver's NVML with a Python that has no pynvml or psutil (python3 -S: no site
# packages), under a real GPU load (20 GiB held, matmuls for 14 s), beside the same with the machine's own Python.
#   OUT=/some/dir bash bench/gpu_nvml_without_pynvml.sh
set -u
mkdir -p /tmp/ew && cp -rL eaglewatch /tmp/ew/ && cd /tmp
{ echo "== python3 -S: pynvml importable?"; python3 -S -c "import importlib.util as u; print('pynvml' , u.find_spec('pynvml'), 'psutil', u.find_spec('psutil'))"
  echo "== python3 (site): pynvml importable?"; python3 -c "import importlib.util as u; print('pynvml', u.find_spec('pynvml') is not None)"; } > $OUT/pythons.txt 2>&1
python3 -c "
import torch, time
x = torch.empty(20 * 2**30, dtype=torch.uint8, device='cuda')
y = torch.randn(8192, 8192, device='cuda')
t = time.time()
while time.time() - t < 14:
    z = y @ y
torch.cuda.synchronize()
" > $OUT/load.txt 2>&1 &
LOAD=$!
sleep 4
PYTHONPATH=/tmp/ew timeout 30 python3 -S -m eaglewatch.pipeline.telemetry --count 4 --interval 1 --job-pid $LOAD > $OUT/no-pynvml.jsonl 2> $OUT/no-pynvml.err
PYTHONPATH=/tmp/ew timeout 30 python3 -S -m eaglewatch.pipeline.telemetry --count 2 --interval 1 --job-pid $LOAD --text > $OUT/no-pynvml.txt 2>&1
PYTHONPATH=/tmp/ew timeout 30 python3 -m eaglewatch.pipeline.telemetry --count 2 --interval 1 --job-pid $LOAD --text > $OUT/with-site.txt 2>&1
wait $LOAD
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/nvidia-smi.txt
cat $OUT/pythons.txt $OUT/no-pynvml.txt $OUT/with-site.txt | cut -c1-200
