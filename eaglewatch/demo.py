"""``eaglewatch demo``: a real extraction on this machine, with the bundled tiny model and sample data.

Steps: build the tiny Llama (8 shards) once, tokenize the bundled chat data, extract with vLLM (the transformers
engine when vLLM is not installed), then verify against transformers. Everything lives under ``--workdir``.

On a terminal (and without ``--no-tui``) the same steps run as a supervised local run, with the dashboard open on
it; the dashboard lives on the operator side and is imported only then. ``--fault`` makes the vLLM worker fail a
bare ``assert`` after 20 samples, so that the failure panel has something real to show.

The demo is the one command that uses both halves (the pipeline for the steps, the dashboard to watch them), so it
lives at the top of the package, which may import both; ``eaglewatch.pipeline`` never imports the operator side.
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
FAULT_SPEC = "worker_assert:20"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", default=str(DEFAULT_WORKDIR), help=f"default {DEFAULT_WORKDIR}")
    parser.add_argument("--engine", choices=("auto", "vllm", "hf"), default="auto")
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--fresh", action="store_true", help="start the extraction over (--force-new)")
    parser.add_argument("--fault", action="store_true",
                        help="inject a worker fault (a bare assert after 20 samples; vLLM engine, separate "
                             "engine-core and worker processes, no miniature), to see the failure panel at work")
    parser.add_argument("--no-tui", action="store_true",
                        help="print the steps instead of opening the dashboard (the default when not on a terminal)")


def vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def ensure_tiny_model(workdir: Path) -> Path:
    from eaglewatch.pipeline.tiny_model import BASE_CONFIGS, make_tiny_model

    model_dir = workdir / "tiny-llama"
    if not (model_dir / "model.safetensors.index.json").exists():
        make_tiny_model(model_dir, dict(BASE_CONFIGS["llama"]), shards=8)
    return model_dir


def wants_dashboard(args: argparse.Namespace) -> bool:
    return not args.no_tui and sys.stdin.isatty() and sys.stdout.isatty()


def shadows_the_package(folder: str) -> bool:
    """Whether ``folder`` holds a folder named ``eaglewatch`` that is not this package (the top of a checkout named
    so, as ``git clone … eaglewatch`` makes): ``python -m eaglewatch`` started there imports that folder instead of
    the installed package when the installation is an editable one (its finder comes after the working folder)."""
    candidate = os.path.join(folder, "eaglewatch")
    if not os.path.isdir(candidate):
        return False
    import eaglewatch

    try:
        return not os.path.samefile(candidate, os.path.dirname(os.path.abspath(eaglewatch.__file__)))
    except OSError:
        return True


def run(args: argparse.Namespace) -> int:
    if wants_dashboard(args):
        try:
            from eaglewatch.tui.app.embedded import run_demo_dashboard
        except ImportError as exc:  # the operator side (textual) is not installed: plain output
            print(f"[demo] no dashboard ({exc}); printing the steps instead", file=sys.stderr)
        else:
            if shadows_the_package(os.getcwd()):
                # The demo's job is a `python -m eaglewatch demo` started in this process's working folder: run it
                # from the demo's own folder, where nothing can stand in for the package.
                workdir = os.path.abspath(os.path.expanduser(args.workdir))
                os.makedirs(workdir, exist_ok=True)
                args.workdir = workdir  # a relative --workdir keeps naming the folder it named
                os.chdir(workdir)
            return run_demo_dashboard(args)
    return run_steps(args)


def run_steps(args: argparse.Namespace) -> int:
    from eaglewatch import protocol
    from eaglewatch.errors import UserError
    from eaglewatch.pipeline.events import EventLog
    from eaglewatch.pipeline.extract import run_extract
    from eaglewatch.pipeline.plan import ExtractConfig
    from eaglewatch.pipeline.prepare import load_tokenizer, prepare
    from eaglewatch.pipeline.verify import verify

    workdir = Path(os.path.abspath(os.path.expanduser(args.workdir)))
    # Where the demo writes (model, data, outputs), said before the model is built: only the agent's copy of the
    # events is written to (there is none when no agent launched this); the extraction says its own folder later.
    with EventLog(echo=None) as events:
        events.emit(protocol.EVENT_INFO, output_dir=str(workdir))
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_CACHE_ROOT", str(workdir / "vllm-cache"))
    engine = args.engine if args.engine != "auto" else ("vllm" if vllm_installed() else "hf")
    if args.fault:
        if engine != "vllm" or not vllm_installed():
            raise UserError("--fault injects the fault into the vLLM worker: it needs vLLM and --engine vllm")
        from eaglewatch.pipeline.engines.vllm_connector import FAULT_ENV

        os.environ[FAULT_ENV] = FAULT_SPEC
        print(f"[demo] fault injected: {FAULT_ENV}={FAULT_SPEC}", file=sys.stderr)
    model_dir = ensure_tiny_model(workdir)
    prepared = workdir / "prepared.jsonl"
    report = prepare(SAMPLE_CHAT_DATA, prepared, load_tokenizer(str(model_dir)), max_length=512)
    print(f"[demo] prepared {report.written} samples ({report.tokens} tokens) from {SAMPLE_CHAT_DATA.name}",
          file=sys.stderr)
    out = workdir / f"hidden-states-{engine}"
    cfg = ExtractConfig(model_path=str(model_dir), prepared_data=str(prepared), output_dir=str(out),
                        layer_ids=DEMO_LAYER_IDS, engine=engine, batch_size=8, max_seq_len=512,
                        tp_size=args.tp_size, force_new=args.fresh or args.fault,
                        engine_core_process=args.fault,
                        # The fault is the real run's (its 20th sample): the miniature's four would not meet it, so
                        # the fault demo goes straight to the load and shows the crash half a minute sooner.
                        no_miniature=args.fault)
    manifest = run_extract(cfg)
    # The reference load's bar would read as a second loading bar of the run, after its real one.
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    result = verify(out, against_hf=2 if engine == "vllm" else 0)
    # The verdict first: the dashboard's log at 80 columns cuts the long path at the end, not the verdict.
    print(f"[demo] verify: {'PASS' if result.passed else 'FAIL'}"
          + (f" (max diff against HF {result.against_hf['max_abs_diff']:.2g})" if result.against_hf else "")
          + f"; {manifest.get('samples_done', manifest.get('samples_total'))} samples in {out}",
          file=sys.stderr)
    return 0 if result.passed else 1
