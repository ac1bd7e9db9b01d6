# Sourced by the bench/gpu_*.sh scripts: the package as a plain folder (the repository's eaglewatch/ links tui/ and
# pipeline/, which a device call carries as links) first on PYTHONPATH, vLLM 0.26 from /tmp/site (bench/gpu_wheels.sh),
# offline, and spawned workers. REPO must be set.
LAYOUT=/tmp/ew
rm -rf "$LAYOUT" && mkdir -p "$LAYOUT" && cp -rL "$REPO/eaglewatch" "$LAYOUT/"
export PYTHONPATH=$LAYOUT:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export VLLM_WORKER_MULTIPROC_METHOD=spawn
