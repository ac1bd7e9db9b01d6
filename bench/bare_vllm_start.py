"""Bare vLLM's own start on a model folder, for comparison with the miniature's first sign.

    python bench/bare_vllm_start.py MODEL RESULT.json [--kv-cache-memory-bytes N] [--gpu-memory-utilization F]

In a fresh process: the seconds from the launch to ``import vllm`` done, to ``LLM(...)`` ready (eager, as the
miniature runs), and to four short prompts generated; nothing of eaglewatch is imported.
"""

from __future__ import annotations

import argparse
import json
import time

STARTED = time.monotonic()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=256 * 1024**2)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.04)
    a = parser.parse_args()
    from vllm import LLM, SamplingParams

    imported = time.monotonic() - STARTED
    llm = LLM(model=a.model, enforce_eager=True, max_model_len=264, skip_tokenizer_init=True,
              kv_cache_memory_bytes=a.kv_cache_memory_bytes, gpu_memory_utilization=a.gpu_memory_utilization)
    ready = time.monotonic() - STARTED
    prompts = [{"prompt_token_ids": [(7 * i + j) % 1000 + 1 for j in range(200)]} for i in range(4)]
    llm.generate(prompts, SamplingParams(max_tokens=1, detokenize=False))
    done = time.monotonic() - STARTED
    with open(a.out, "w") as fh:
        json.dump({"import_s": round(imported, 2), "engine_ready_s": round(ready, 2), "generated_s": round(done, 2)},
                  fh, indent=1)
    print(json.dumps({"import_s": imported, "engine_ready_s": ready, "generated_s": done}), flush=True)


if __name__ == "__main__":
    main()
