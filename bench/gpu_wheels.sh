#!/usr/bin/env bash
# The wheels that put vLLM 0.26.0 (the last release built for torch 2.11, the H200 machine's torch) on the GPU
# machine, which reaches no package index: downloaded here, packed into folders small enough for one device call.
#
#   bash bench/gpu_wheels.sh .vgpu2        (a folder git ignores)
#
# A call carries the working tree (about 7 MiB) and one folder, 64 MiB in all, so the folders are at most 46 MiB
# and the vLLM wheel travels in 45 MiB parts. Send them one call each, back to back (the machine goes back after
# 30 s idle), each call copying its folder out first: `mkdir -p /tmp/w && cp .vgpu2/dN/* /tmp/w/`. In the last:
#   cd /tmp/w && cat vllm.whl.part-* > vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl && rm vllm.whl.part-*
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site ./*.whl
# then run with PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 VLLM_WORKER_MULTIPROC_METHOD=spawn (the bench/gpu_*.sh
# scripts set these). Every folder is needed: the small wheels (pydantic among them) are in the last ones.
set -euo pipefail
dest=${1:?usage: gpu_wheels.sh DEST}
here=$(cd "$(dirname "$0")" && pwd)
dl=$(mktemp -d)
platforms=()
for p in manylinux_2_31_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do platforms+=(--platform "$p"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$dl" -r "$here/gpu-vllm026-wheels.txt"
(cd "$dl" && split -b 45m -a 2 vllm-0.26.0-*.whl vllm.whl.part- && rm vllm-0.26.0-*.whl)
limit=$((46 * 1024 * 1024)) folder=0 used=0
for f in $(ls -S "$dl"); do
    size=$(stat -c %s "$dl/$f")
    if [ "$folder" = 0 ] || [ $((used + size)) -gt "$limit" ]; then
        folder=$((folder + 1)); used=0; mkdir -p "$dest/d$folder"
    fi
    mv "$dl/$f" "$dest/d$folder/"; used=$((used + size))
done
rm -rf "$dl"
du -sh "$dest"/d*
