"""Setup shared by the CPU benchmarks: a work folder, a tiny Llama built once, the bundled data tokenized for it."""

from __future__ import annotations

import os
from pathlib import Path


def work_folder(path: str) -> Path:
    work = Path(path).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_CACHE_ROOT", str(work / "vllm-cache"))
    return work


def tiny_llama_with_data(work: Path, name: str, shards: int, **config_overrides: int) -> tuple[Path, Path]:
    """The model folder (built on first use) and the bundled chat data prepared for it."""
    from eaglewatch.assets import SAMPLE_CHAT_DATA
    from eaglewatch.pipeline.prepare import load_tokenizer, prepare
    from eaglewatch.pipeline.tiny_model import BASE_CONFIGS, make_tiny_model

    model = work / name
    if not (model / "config.json").exists():
        make_tiny_model(model, dict(BASE_CONFIGS["llama"], **config_overrides), shards=shards)
    data = work / f"{name}.prepared.jsonl"
    prepare(SAMPLE_CHAT_DATA, data, load_tokenizer(str(model)), max_length=512)
    return model, data
