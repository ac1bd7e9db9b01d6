"""Reading and checking the prepared (tokenized) JSONL that ``extract`` consumes.

One JSON object a line: ``{"id": str, "input_ids": [int], "loss_mask": [0|1]}``. Every problem names the file
and the line, and is found before any model is loaded.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Generator

from eaglewatch.errors import UserError

SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
LONG_POLICIES = ("truncate", "reject")


@dataclass(frozen=True)
class Sample:
    id: str
    input_ids: list[int]
    loss_mask: list[int]
    line_no: int

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


@dataclass
class DataReport:
    samples: list[Sample]
    truncated: int = 0
    total_tokens: int = 0


def _parse_line(path: Path, line_no: int, line: str) -> Sample:
    where = f"{path}:{line_no}"
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise UserError(f"{where}: not valid JSON ({exc.args[0] if exc.args else exc})") from None
    except RecursionError:
        raise UserError(f"{where}: not a prepared sample (JSON nested too deeply)") from None
    if not isinstance(record, dict):
        raise UserError(f"{where}: expected a JSON object, got {type(record).__name__}")
    missing = [k for k in ("id", "input_ids", "loss_mask") if k not in record]
    if missing:
        raise UserError(f"{where}: missing field(s) {', '.join(missing)} (is this the output of `eaglewatch prepare`?)")
    sample_id = str(record["id"])
    if not SAFE_ID.match(sample_id):
        raise UserError(f"{where}: id {sample_id!r} cannot name a file; use letters, digits, '.', '_' and '-'")
    ids, mask = record["input_ids"], record["loss_mask"]
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise UserError(f"{where}: input_ids must be a list of integers")
    if not ids:
        raise UserError(f"{where}: input_ids is empty")
    if not isinstance(mask, list) or any(m not in (0, 1) for m in mask):
        raise UserError(f"{where}: loss_mask must be a list of 0 and 1")
    if len(mask) != len(ids):
        raise UserError(f"{where}: loss_mask has {len(mask)} entries but input_ids has {len(ids)}")
    return Sample(sample_id, ids, [int(m) for m in mask], line_no)


def iter_prepared(path: str | Path) -> Generator[Sample, None, None]:
    path = Path(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            kind = "a folder" if path.is_dir() else "not a regular file (a pipe or device cannot be read twice)"
            raise UserError(f"prepared data {path} is {kind}, not a JSONL file")
        handle = open(path, "rb")
    except FileNotFoundError:
        if path.is_symlink():
            raise UserError(f"prepared data {path} is a symbolic link to {os.readlink(path)!r}, which does not "
                            "exist") from None
        raise UserError(f"prepared data {path} does not exist") from None
    except OSError as exc:
        raise UserError(f"cannot read prepared data {path}: {exc.strerror or exc}") from None
    with handle:
        line_no = 0
        try:
            for line_no, raw in enumerate(handle, start=1):
                try:
                    line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
                except UnicodeDecodeError as exc:
                    raise UserError(f"{path}:{line_no}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column "
                                    f"{exc.start + 1})") from None
                if line.strip():
                    yield _parse_line(path, line_no, line)
        except OSError as exc:
            raise UserError(f"cannot read prepared data {path} after line {line_no}: {exc.strerror or exc}") from None


def load_prepared(
    path: str | Path,
    *,
    vocab_size: int,
    max_seq_len: int,
    long_samples: str = "truncate",
    max_samples: int | None = None,
) -> DataReport:
    """Parse and check every line; apply the long-sample policy and the sample limit."""
    if long_samples not in LONG_POLICIES:
        raise UserError(f"unknown long-sample policy {long_samples!r}")
    if max_seq_len < 1:
        raise UserError("--max-seq-len must be at least 1")
    report = DataReport(samples=[])
    seen: dict[str, int] = {}
    for sample in iter_prepared(path):
        where = f"{path}:{sample.line_no}"
        if sample.id in seen:
            raise UserError(f"{where}: id {sample.id!r} already used on line {seen[sample.id]}")
        seen[sample.id] = sample.line_no
        out_of_vocab = [t for t in sample.input_ids if t < 0 or t >= vocab_size]
        if out_of_vocab:
            raise UserError(
                f"{where}: token id {out_of_vocab[0]} is outside the model's vocabulary (size {vocab_size}); "
                "was the data prepared with another model's tokenizer?"
            )
        if sample.num_tokens > max_seq_len:
            if long_samples == "reject":
                raise UserError(
                    f"{where}: {sample.num_tokens} tokens is longer than --max-seq-len {max_seq_len} "
                    "(use --long-samples truncate to cut it)"
                )
            sample = Sample(sample.id, sample.input_ids[:max_seq_len], sample.loss_mask[:max_seq_len], sample.line_no)
            report.truncated += 1
        report.samples.append(sample)
        report.total_tokens += sample.num_tokens
        if max_samples is not None and len(report.samples) >= max_samples:
            break
    if not report.samples:
        raise UserError(f"{path} holds no samples")
    return report
