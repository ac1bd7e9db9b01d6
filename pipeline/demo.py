"""``eaglewatch demo``: a real extraction on this machine, with the bundled tiny model and sample data.

Steps: build the tiny Llama (8 shards) once, tokenize the bundled chat data, extract with vLLM (the transformers
engine when vLLM is not installed), then verify against transformers. Everything lives under ``--workdir``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from eaglewatch.assets import SAMPLE_CHAT_DATA

HELP = "run a real local extraction on the bundled tiny model and data"
DEFAULT_WORKDIR = Path(os.environ.get("EAGLEWATCH_DEMO_DIR", Path.home() / ".cache" / "eaglewatch" / "demo"))
DEMO_LAYER_IDS = [1, 2, 4]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", default=str(DEFAULT_WORKDIR), help=f"default {DEFAULT_WORKDIR}")
    parser.add_argument("--engine", choices=("auto", "vllm", "hf"), default="auto")
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--fresh", action="store_true", help="start the extraction over (--force-new)")


def vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def ensure_tiny_model(workdir: Path) -> Path:
    from eaglewatch.pipeline.tiny_model import BASE_CONFIGS, make_tiny_model

    model_dir = workdir / "tiny-llama"
    if not (model_dir / "model.safetensors.index.json").exists():
        make_tiny_model(model_dir, dict(BASE_CONFIGS["llama"]), shards=8)
    return model_dir


def run(args: argparse.Namespace) -> int:
    from eaglewatch.pipeline.extract import ExtractConfig, run_extract
    from eaglewatch.pipeline.prepare import load_tokenizer, prepare
    from eaglewatch.pipeline.verify import verify

    workdir = Path(args.workdir).expanduser()
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_CACHE_ROOT", str(workdir / "vllm-cache"))
    engine = args.engine if args.engine != "auto" else ("vllm" if vllm_installed() else "hf")
    model_dir = ensure_tiny_model(workdir)
    prepared = workdir / "prepared.jsonl"
    report = prepare(SAMPLE_CHAT_DATA, prepared, load_tokenizer(str(model_dir)), max_length=512)
    print(f"[demo] prepared {report.written} samples ({report.tokens} tokens) from {SAMPLE_CHAT_DATA.name}",
          file=sys.stderr)
    out = workdir / f"hidden-states-{engine}"
    cfg = ExtractConfig(model_path=str(model_dir), prepared_data=str(prepared), output_dir=str(out),
                        layer_ids=DEMO_LAYER_IDS, engine=engine, batch_size=8, max_seq_len=512,
                        tp_size=args.tp_size, force_new=args.fresh)
    manifest = run_extract(cfg)
    result = verify(out, against_hf=2 if engine == "vllm" else 0)
    print(f"[demo] {manifest.get('samples_done', manifest.get('samples_total'))} samples in {out}; "
          f"verify: {'PASS' if result.passed else 'FAIL'}"
          + (f" (max diff against HF {result.against_hf['max_abs_diff']:.2g})" if result.against_hf else ""),
          file=sys.stderr)
    return 0 if result.passed else 1
