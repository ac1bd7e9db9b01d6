"""The miniature's own process: build the toy model, extract with it, check its files.

One process for all three, so that torch, transformers and vLLM are imported once: on an H200 those imports are
most of the miniature's minute, and the process that runs ``eaglewatch preflight`` or ``extract`` never needs them
for the miniature's sake. Its engine core runs in this process too (on a GPU, ``--no-engine-core-process``): the same
engine code, without a second process importing it all again.

    python -m eaglewatch.pipeline.miniature_child SPEC.json

SPEC.json (written by ``miniature.prepare_miniature``): the folder, the planned config and quantization, the dtype,
and the ``eaglewatch extract`` arguments. The exit code is the verdict's input: 0, extract's own code, or
``BUILD_FAILED`` (the factory's limit: a warning, not the job's failure) or ``BAD_OUTPUT`` (files not whole).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from eaglewatch.pipeline.preflight.miniature import BAD_OUTPUT, BUILD_FAILED, DATA, DATA_RAW

# (This module is beside extract, not in preflight, which extract imports: it runs extract in itself.)


def fold_data(base: Path, vocab_size: int) -> None:
    """The samples the parent wrote, their token ids folded into the built model's vocabulary."""
    with open(base / DATA_RAW) as src, open(base / DATA, "w") as dst:
        for line in src:
            sample = json.loads(line)
            sample["input_ids"] = [t % vocab_size for t in sample["input_ids"]]
            dst.write(json.dumps(sample) + "\n")


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    base = Path(spec["base"])
    print("[eaglewatch] miniature: building", flush=True)
    try:
        from eaglewatch.pipeline.tiny_model import make_tiny_model

        model = make_tiny_model(base / "model", spec["config"], shards=2, dtype=spec["dtype"],
                                quantization=spec["quantization"])
    except Exception as exc:
        print(f"[eaglewatch] miniature: could not build: {type(exc).__name__}: {exc}", flush=True)
        return BUILD_FAILED
    fold_data(base, json.loads((model / "config.json").read_text())["vocab_size"])
    code = _extract(spec["extract"][1:])
    if code:
        return code
    from eaglewatch.pipeline.verify import verify

    report = verify(base / "out")
    problems = report.problems or [f"missing {m}" for m in report.missing]
    if problems:
        problem = problems[0]
        print(f"[eaglewatch] miniature: bad output: {problem}", flush=True)
        return BAD_OUTPUT
    return 0


def _extract(argv: list[str]) -> int:
    """``eaglewatch extract ARGV`` in this process (as the CLI runs it: a UserError is one line and its code)."""
    import argparse

    from eaglewatch.errors import UserError
    from eaglewatch.pipeline import extract

    parser = argparse.ArgumentParser(prog="eaglewatch extract")
    extract.add_arguments(parser)
    try:
        return int(extract.run(parser.parse_args(argv)) or 0)
    except UserError as exc:
        print(f"eaglewatch extract: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
