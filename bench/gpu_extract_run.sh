#!/usr/bin/env bash
# Extraction on a real GPU machine, in one go (BENCHMARKS.md, "Extraction on an H200"):
#
#   1. install vLLM and the packages the machine lacks from wheels in $WHEELS (vLLM's own may come split into
#      vllm.whl.part-*, joined once all VLLM_PARTS parts are there) into /tmp/site;
#   2. build a ~1 B random Llama in bf16, 9 shards, with the project's tiny-model factory, and synthesise prepared
#      data: SAMPLES samples of SEQ random token ids, loss mask on the last three quarters;
#   3. `eaglewatch extract --engine vllm` on GPU 0, with the telemetry sampler recording beside it;
#   4. bare vLLM on the same model and prompts: the same LLM arguments and speculative config, vLLM's stock
#      ExampleHiddenStatesConnector writing to a scratch folder, timed until every file is written. With two GPUs
#      it loads on GPU 1 while eaglewatch loads on GPU 0, and starts its timed part once eaglewatch has finished;
#   5. `eaglewatch extract --engine hf` (tokens/s), `eaglewatch verify --against-hf 4`;
#   6. with two GPUs, the same extraction at --tp-size 2 (vLLM 0.25.1-0.26 may stop at start-up: vLLM #51016).
#
#   OUT=/some/dir [WHEELS=/tmp/w] bash bench/gpu_extract_run.sh [prep|install|all|nofsync]
#
# `nofsync` ("Without the per-file fsync"), one GPU: bare vLLM as in 4, then `eaglewatch extract --engine vllm
# --no-fsync`, with the default in-process engine core and with --engine-core-process, one after another on GPU 0
# (each output removed and synced away before the next run); no HF engine, no verify. Results in
# $OUT/summary_nofsync.json and the three logs. Start `prep` early with SKIP_HF=1 to leave the HF engine out.
#
# `prep` (model, data, disk check, HF engine) and `install` need no vLLM run and may be started early, in the
# background; `all` (the default) waits for a running prep, does whatever is not done yet, and runs the rest.
# A copy of this script run from outside the checkout needs EW_REPO=<checkout>.
# Results in $OUT: summary.json, ew_vllm.log (eaglewatch's run: its own lines and vLLM's), bare_vllm.log,
# tp2.log, telemetry.jsonl (the sampler's stream during the eaglewatch run), results.tar.gz (the other logs,
# manifests, events, raw NVML readings, verify's report), console.txt.
set -u
STAGE=${1:-all}
WHEELS=${WHEELS:-/tmp/w}
W=${WORKDIR:-/tmp/gx}
SAMPLES=${SAMPLES:-512}
SEQ=${SEQ:-1024}
BATCH=${BATCH:-64}
LAYERS=(2 8 13 16)
DEADLINE_S=${DEADLINE_S:-570}   # the whole `all` stage, from its start
T_START=$(date +%s)
REPO=$(cd "$(dirname "$0")/.." && pwd)
REPO=${EW_REPO:-$REPO}
mkdir -p "$W"
# Not from the checkout's root, so that the copy laid out in /tmp/ew is the one imported.
cd /tmp
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_WORKER_MULTIPROC_METHOD=spawn
# Keep NVLink multicast off on multi-GPU hosts that share their GPUs.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

left() { echo $(( DEADLINE_S - ($(date +%s) - T_START) )); }
say() { echo "[gpu-run +$(( $(date +%s) - T_START ))s] $*"; }

layout() {
    # The package maps pipeline/, tui/ and assets/ into eaglewatch/; lay that out instead of installing.
    rm -rf /tmp/ew.new && mkdir -p /tmp/ew.new
    # eaglewatch/{pipeline,tui,assets} are links to the top-level folders: -L copies what they point to.
    cp -rL "$REPO/eaglewatch" /tmp/ew.new/
    rm -rf /tmp/ew && mv /tmp/ew.new /tmp/ew
}

install_wheels() {
    (
        flock 9
        cd "$WHEELS" || exit 1
        parts=$(ls vllm.whl.part-* 2>/dev/null | wc -l)
        if [ "$parts" -ge "${VLLM_PARTS:-5}" ]; then
            cat vllm.whl.part-* > vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl && rm -f vllm.whl.part-*
        fi
        todo=()
        for f in *.whl; do [ -e "$f" ] && [ ! -e ".done.$f" ] && todo+=("$f"); done
        if [ ${#todo[@]} -gt 0 ]; then
            echo "installing ${#todo[@]} wheels"
            python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
                "${todo[@]}" 2>&1 | grep -v "^WARNING: Target directory" || true
            for f in "${todo[@]}"; do touch ".done.$f"; done
        fi
    ) 9>"$WHEELS/.pip.lock"
}

make_model_and_data() {
    [ -e "$W/model/model.safetensors.index.json" ] && [ -e "$W/data.jsonl" ] && return 0
    PYTHONPATH=/tmp/ew python3 - "$W" "$SAMPLES" "$SEQ" <<'EOF'
import json, random, sys, time
from pathlib import Path
from eaglewatch.pipeline.tiny_model import BASE_CONFIGS, make_tiny_model

work, samples, seq = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
config = dict(BASE_CONFIGS["llama"], hidden_size=2048, num_hidden_layers=16, num_attention_heads=16,
              num_key_value_heads=8, head_dim=128, intermediate_size=8192, max_position_embeddings=4096)
t = time.time()
make_tiny_model(work / "model", config, shards=9, dtype="bfloat16")
vocab = json.loads((work / "model" / "config.json").read_text())["vocab_size"]
size = sum(p.stat().st_size for p in (work / "model").glob("*.safetensors"))
print(f"model: {size / 2**30:.2f} GiB bf16 in 9 shards, vocabulary {vocab}, made in {time.time() - t:.1f} s")
rng = random.Random(0)
with open(work / "data.jsonl.tmp", "w") as f:
    for i in range(samples):
        ids = [rng.randrange(5, vocab) for _ in range(seq)]
        mask = [0] * (seq // 4) + [1] * (seq - seq // 4)
        f.write(json.dumps({"id": f"s{i:05d}", "input_ids": ids, "loss_mask": mask}) + "\n")
(work / "data.jsonl.tmp").rename(work / "data.jsonl")
print(f"data: {samples} samples of {seq} tokens")
EOF
}

preflight_flag() {
    PYTHONPATH=/tmp/ew python3 -m eaglewatch extract --help 2>/dev/null | grep -q -- "--no-preflight" && echo "--no-preflight"
}

run_hf() {
    [ -e "$W/out-hf/manifest.json" ] && grep -q '"status": "done"' "$W/out-hf/manifest.json" && return 0
    say "HF engine"
    CUDA_VISIBLE_DEVICES=0 PYTHONPATH=/tmp/ew python3 -m eaglewatch extract --engine hf --model-path "$W/model" \
        --prepared-data "$W/data.jsonl" --output-dir "$W/out-hf" --layer-ids "${LAYERS[@]}" --max-seq-len "$SEQ" \
        --batch-size 16 --force-new $(preflight_flag) > "$W/hf.log" 2>&1
    echo $? > "$W/hf.rc"
    rm -f "$W"/out-hf/hs_*.safetensors   # only its speed is wanted here; free the disk
}

prep() {
    layout
    make_model_and_data
    say "disk: 2 GiB with fsync"
    dd if=/dev/zero of="$W/ddtest" bs=16M count=128 conv=fsync 2>&1 | tail -1 | tee "$W/dd.txt"
    rm -f "$W/ddtest"
    [ "${SKIP_HF:-0}" = 1 ] || run_hf
    touch "$W/prep.done"
}

write_bare_script() {
    cat > "$W/bare.py" <<'EOF'
"""Bare vLLM native extraction: vLLM's stock ExampleHiddenStatesConnector, timed until its files are written."""
import argparse, fcntl, json, os, sys, time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model"); ap.add_argument("--data"); ap.add_argument("--out-dir"); ap.add_argument("--result")
    ap.add_argument("--layer-ids", type=int, nargs="+"); ap.add_argument("--max-seq-len", type=int)
    ap.add_argument("--gate", default=None, help="start the timed part once this file exists")
    args = ap.parse_args()
    from eaglewatch.pipeline.engines.vllm_engine import extraction_llm_kwargs
    from vllm import LLM, SamplingParams

    kwargs = extraction_llm_kwargs(args.model, args.layer_ids, tp_size=1, dtype="bfloat16",
                                   max_seq_len=args.max_seq_len, gpu_memory_utilization=0.9,
                                   kv_cache_memory_bytes=None, enforce_eager=True, trust_remote_code=False)
    kwargs["kv_transfer_config"] = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                                    "kv_connector_extra_config": {"shared_storage_path": args.out_dir}}
    rows = [json.loads(line) for line in open(args.data)]
    prompts = [{"prompt_token_ids": r["input_ids"][: args.max_seq_len]} for r in rows]
    tokens = sum(len(p["prompt_token_ids"]) for p in prompts)
    t = time.perf_counter()
    llm = LLM(seed=0, **kwargs)
    load_s = time.perf_counter() - t
    print(f"[bare] LLM() took {load_s:.1f} s", flush=True)
    waited = 0.0
    if args.gate:
        t = time.perf_counter()
        while not os.path.exists(args.gate) and time.perf_counter() - t < 900:
            time.sleep(0.1)
        waited = time.perf_counter() - t
    t0 = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=1, detokenize=False), use_tqdm=True)
    t_gen = time.perf_counter()
    paths = [o.kv_transfer_params["hidden_states_path"] for o in outs]
    for p in paths:  # the writer holds an exclusive lock on <file>.lock until the file is complete
        if os.path.exists(p + ".lock"):
            with open(p + ".lock") as f:
                fcntl.flock(f, fcntl.LOCK_SH)
        else:
            while not os.path.exists(p):
                time.sleep(0.001)
    t1 = time.perf_counter()
    sizes = [os.path.getsize(p) for p in paths]
    from safetensors import safe_open
    with safe_open(paths[0], "pt") as f:
        shape = list(f.get_slice("hidden_states").get_shape())
    result = {"samples": len(paths), "tokens": tokens, "load_s": round(load_s, 2), "gate_wait_s": round(waited, 2),
              "generate_s": round(t_gen - t0, 3), "extract_s": round(t1 - t0, 3),
              "tokens_per_s": round(tokens / (t1 - t0), 1), "bytes": sum(sizes), "file_shape": shape,
              "engine_core": "own process (vLLM default)"}
    print("[bare] " + json.dumps(result), flush=True)
    with open(args.result, "w") as f:
        json.dump(result, f)
    llm.llm_engine.shutdown() if hasattr(llm.llm_engine, "shutdown") else None


if __name__ == "__main__":
    main()
EOF
}

# What every measuring stage does first: results folder and console copy, wait for a background prep, install.
begin_stage() {
    OUT=${OUT:?set OUT to the folder for the results}
    mkdir -p "$OUT"
    exec > >(tee "$OUT/console.txt") 2>&1
    if [ -e "$W/prep.started" ] && [ ! -e "$W/prep.done" ]; then
        say "waiting for the prep started earlier"
        for _ in $(seq 1 300); do [ -e "$W/prep.done" ] && break; sleep 1; done
    fi
    layout
    install_wheels
}

run_all() {
    begin_stage
    [ -e "$W/prep.done" ] || prep
    export PYTHONPATH=/tmp/ew:/tmp/site
    say "software"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
    python3 -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1 | tail -1
    NGPU=$(nvidia-smi -L | wc -l)
    NOPRE=$(preflight_flag)
    COMMON=(--model-path "$W/model" --prepared-data "$W/data.jsonl" --layer-ids "${LAYERS[@]}" --max-seq-len "$SEQ"
            --batch-size "$BATCH" --enforce-eager --force-new $NOPRE)
    write_bare_script
    rm -rf "$W/out-vllm" "$W/out-bare" "$W/out-tp2" "$W/ew.finished" && mkdir -p "$W/out-vllm" "$W/out-bare"

    say "eaglewatch extract --engine vllm on GPU 0, telemetry beside it ($NGPU GPUs)"
    : > "$W/ew.pid"
    python3 -m eaglewatch.pipeline.telemetry --interval 1 --count 900 --output-dir "$W/out-vllm" \
        --job-pid-file "$W/ew.pid" --log "$W/ew_vllm.log" --events "$W/out-vllm/events.jsonl" \
        --raw-out "$W/telemetry_raw.jsonl" --out "$W/telemetry.jsonl" 2> "$W/telemetry.err" &
    TEL=$!
    CUDA_VISIBLE_DEVICES=0 python3 -m eaglewatch extract --engine vllm --output-dir "$W/out-vllm" "${COMMON[@]}" \
        > "$W/ew_vllm.log" 2>&1 &
    EW=$!
    echo "$EW" > "$W/ew.pid"
    BARE_ARGS=(--model "$W/model" --data "$W/data.jsonl" --out-dir "$W/out-bare" --result "$W/bare.json"
               --layer-ids "${LAYERS[@]}" --max-seq-len "$SEQ")
    if [ "$NGPU" -ge 2 ]; then
        CUDA_VISIBLE_DEVICES=1 timeout -k 5 $(( $(left) - 60 )) python3 "$W/bare.py" "${BARE_ARGS[@]}" \
            --gate "$W/ew.finished" > "$W/bare_vllm.log" 2>&1 &
        BARE=$!
    fi
    wait "$EW"; echo $? > "$W/ew_vllm.rc"
    touch "$W/ew.finished"
    say "eaglewatch vllm exit $(cat "$W/ew_vllm.rc")"; tail -3 "$W/ew_vllm.log"
    sleep 3; kill "$TEL" 2>/dev/null; wait "$TEL" 2>/dev/null
    if [ "$NGPU" -ge 2 ]; then
        wait "$BARE"; echo $? > "$W/bare.rc"
    else
        say "bare vLLM on GPU 0"
        CUDA_VISIBLE_DEVICES=0 timeout -k 5 $(( $(left) - 90 )) python3 "$W/bare.py" "${BARE_ARGS[@]}" \
            > "$W/bare_vllm.log" 2>&1; echo $? > "$W/bare.rc"
    fi
    say "bare vLLM exit $(cat "$W/bare.rc")"; grep '^\[bare\]' "$W/bare_vllm.log" | tail -2
    rm -rf "$W/out-bare"

    if [ "$NGPU" -ge 2 ] && [ "$(left)" -gt 150 ]; then
        say "eaglewatch extract --engine vllm --tp-size 2 (GPUs 0 and 1), $(( $(left) - 25 )) s at most"
        # 0.6: verify's HF model shares GPU 0 while this one starts.
        CUDA_VISIBLE_DEVICES=0,1 timeout -k 5 $(( $(left) - 25 )) python3 -m eaglewatch extract --engine vllm \
            --tp-size 2 --gpu-memory-utilization 0.6 --output-dir "$W/out-tp2" "${COMMON[@]}" > "$W/tp2.log" 2>&1 &
        TP2=$!
    fi
    say "verify --against-hf 4"
    CUDA_VISIBLE_DEVICES=0 python3 -m eaglewatch verify "$W/out-vllm" --against-hf 4 --json > "$W/verify.json" \
        2> "$W/verify.err"; echo $? > "$W/verify.rc"
    say "verify exit $(cat "$W/verify.rc")"
    [ -e "$W/out-hf/manifest.json" ] || run_hf
    if [ -n "${TP2:-}" ]; then
        wait "$TP2"; echo $? > "$W/tp2.rc"
        say "TP=2 exit $(cat "$W/tp2.rc")"; tail -5 "$W/tp2.log"
    fi
    summarise
    say "done"
}

summarise() {
    python3 - "$W" "$OUT" <<'EOF'
import json, re, sys
from pathlib import Path

w, out = Path(sys.argv[1]), Path(sys.argv[2])
def js(p):
    try:
        return json.loads(Path(p).read_text())
    except Exception:
        return None
def rc(name):
    p = w / f"{name}.rc"
    return int(p.read_text()) if p.exists() else None
keep = ("engine", "tp_size", "status", "samples_written", "tokens_written", "bytes_written", "extract_s",
        "tokens_per_s", "load_s", "versions", "gpus", "batch_size", "layer_ids", "dtype")
def manifest(d):
    m = js(w / d / "manifest.json") or {}
    return {k: m.get(k) for k in keep if k in m}
ew, hf, tp2 = manifest("out-vllm"), manifest("out-hf"), manifest("out-tp2")
bare = js(w / "bare.json") or {}
verify = js(w / "verify.json") or {}
tp2_log = (w / "tp2.log").read_text(errors="replace") if (w / "tp2.log").exists() else ""
summary = {
    "eaglewatch_vllm": {**ew, "exit": rc("ew_vllm")},
    "bare_vllm": {**bare, "exit": rc("bare")},
    "ratio_eaglewatch_over_bare": round(ew["tokens_per_s"] / bare["tokens_per_s"], 3)
        if ew.get("tokens_per_s") and bare.get("tokens_per_s") else None,
    "hf": {**hf, "exit": rc("hf")},
    "verify": {"exit": rc("verify"), "passed": verify.get("passed"), "files": verify.get("files"),
               "ok": verify.get("ok"), "against_hf": {k: v for k, v in (verify.get("against_hf") or {}).items()
                                                       if k != "per_sample"}},
    "tp2": {**tp2, "exit": rc("tp2"), "ran": (w / "tp2.log").exists(),
            "page_size_assertion": bool(re.search(r"page_size_padded\s*>=", tp2_log))},
    "disk_dd_fsync": (w / "dd.txt").read_text().strip() if (w / "dd.txt").exists() else None,
}
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
EOF
    cp "$W/ew_vllm.log" "$W/telemetry.jsonl" "$OUT/" 2>/dev/null
    cp "$W/bare_vllm.log" "$OUT/" 2>/dev/null
    [ -e "$W/tp2.log" ] && cp "$W/tp2.log" "$OUT/"
    mkdir -p "$W/pack"
    for f in hf.log verify.json verify.err telemetry_raw.jsonl telemetry.err dd.txt bare.json prep.log; do
        [ -e "$W/$f" ] && cp "$W/$f" "$W/pack/"
    done
    for d in out-vllm out-hf out-tp2; do
        mkdir -p "$W/pack/$d"
        cp "$W/$d"/manifest*.json "$W/$d"/events*.jsonl "$W/pack/$d/" 2>/dev/null
    done
    tar -C "$W/pack" -czf "$OUT/results.tar.gz" .
    ls -la "$OUT"
}

run_nofsync() {
    begin_stage
    [ -e "$W/prep.done" ] || SKIP_HF=1 prep
    export PYTHONPATH=/tmp/ew:/tmp/site
    say "software"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
    python3 -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1 | tail -1
    df -h "$W" | tail -1; cat "$W/dd.txt" 2>/dev/null
    COMMON=(--model-path "$W/model" --prepared-data "$W/data.jsonl" --layer-ids "${LAYERS[@]}" --max-seq-len "$SEQ"
            --batch-size "$BATCH" --enforce-eager --force-new --no-preflight --no-fsync)
    write_bare_script
    rm -rf "$W/out-bare" && mkdir -p "$W/out-bare"
    say "bare vLLM on GPU 0"
    CUDA_VISIBLE_DEVICES=0 timeout -k 5 $(( $(left) - 30 )) python3 "$W/bare.py" --model "$W/model" \
        --data "$W/data.jsonl" --out-dir "$W/out-bare" --result "$W/bare.json" --layer-ids "${LAYERS[@]}" \
        --max-seq-len "$SEQ" > "$W/bare_vllm.log" 2>&1; echo $? > "$W/bare.rc"
    say "bare vLLM exit $(cat "$W/bare.rc")"; grep '^\[bare\]' "$W/bare_vllm.log" | tail -2
    rm -rf "$W/out-bare"; sync
    for run in inproc coreproc; do
        extra=(); [ "$run" = coreproc ] && extra=(--engine-core-process)
        rm -rf "$W/out-$run"
        say "eaglewatch extract --engine vllm --no-fsync ${extra[*]} on GPU 0, $(( $(left) - 20 )) s at most"
        CUDA_VISIBLE_DEVICES=0 timeout -k 5 $(( $(left) - 20 )) python3 -m eaglewatch extract --engine vllm \
            --output-dir "$W/out-$run" "${COMMON[@]}" "${extra[@]}" > "$W/ew_$run.log" 2>&1; echo $? > "$W/ew_$run.rc"
        say "exit $(cat "$W/ew_$run.rc")"; tail -2 "$W/ew_$run.log"
        mkdir -p "$W/keep-$run"; cp "$W/out-$run"/manifest*.json "$W/keep-$run/" 2>/dev/null
        rm -rf "$W/out-$run"; sync
    done
    python3 - "$W" "$OUT" <<'EOF'
import json, sys
from pathlib import Path

w, out = Path(sys.argv[1]), Path(sys.argv[2])
def js(p):
    try:
        return json.loads(Path(p).read_text())
    except Exception:
        return {}
def rc(name):
    p = w / f"{name}.rc"
    return int(p.read_text()) if p.exists() else None
keep = ("engine", "status", "samples_written", "tokens_written", "bytes_written", "extract_s", "tokens_per_s",
        "load_s", "versions", "batch_size", "fsync", "engine_core_process", "deterministic")
bare = {**js(w / "bare.json"), "exit": rc("bare")}
summary = {"bare_vllm": bare}
for run in ("inproc", "coreproc"):
    m = js(w / f"keep-{run}" / "manifest.json")
    r = {k: m.get(k) for k in keep if k in m}
    r["exit"] = rc(f"ew_{run}")
    if r.get("tokens_per_s") and bare.get("tokens_per_s"):
        r["ratio_to_bare"] = round(r["tokens_per_s"] / bare["tokens_per_s"], 3)
    summary[f"eaglewatch_nofsync_{run}"] = r
summary["disk_dd_fsync"] = (w / "dd.txt").read_text().strip() if (w / "dd.txt").exists() else None
(out / "summary_nofsync.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
EOF
    cp "$W/bare_vllm.log" "$W/ew_inproc.log" "$W/ew_coreproc.log" "$OUT/" 2>/dev/null
    say "done"
}

case "$STAGE" in
    prep) touch "$W/prep.started"; prep ;;
    install) install_wheels ;;
    all) run_all ;;
    nofsync) run_nofsync ;;
    *) echo "usage: $0 [prep|install|all|nofsync]" >&2; exit 2 ;;
esac
