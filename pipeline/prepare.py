"""``eaglewatch prepare``: chat JSONL to token ids and loss masks, with the model's own tokenizer and template.

Input lines are ShareGPT style (``{"conversations": [{"from", "value"}]}``) or OpenAI style
(``{"messages": [{"role", "content"}]}``). The loss mask is 1 on the tokens the assistant wrote (its content and
the end-of-turn marker the template puts after it) and 0 elsewhere. It is found by rendering the template on
growing prefixes of the conversation: the assistant's span is what its message adds after the generation prompt.

Also writes a frequency table of the loss-masked tokens (``--freq-out``), from which the trainer picks the draft
vocabulary (d2t/t2d).

Paths and arguments are checked before transformers is imported (seconds) and before any tokenizing; the outputs
are written under ``NAME.tmp`` and renamed only when everything succeeded, so a failed run leaves nothing behind.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import stat
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from eaglewatch.errors import UserError
from eaglewatch.pipeline.prepared_data import SAFE_ID

HELP = "tokenize chat data (ShareGPT or OpenAI style) into input_ids and assistant-only loss masks"

ROLE_ALIASES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "model": "assistant",
    "bot": "assistant", "chatgpt": "assistant", "system": "system", "tool": "tool", "function": "tool",
}
MAX_LENGTH_LIMIT = 1 << 24  # 16M tokens: beyond any model's context, so a larger value is a typo
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# Tokenizing a long text is cut short: first this many characters per wanted token, doubled while too few.
CHARS_PER_TOKEN_GUESS = 8
MIN_GUARD_CHARS = 1024
SHOWN = 20  # skip reasons and dropped ids kept for the summary
UTF8_BOM = b"\xef\xbb\xbf"
SURROGATE = re.compile("[\ud800-\udfff]")
NOT_TEXT = {b"\x1f\x8b": "gzip-compressed", b"BZh": "bzip2-compressed", b"\xfd7zXZ": "xz-compressed",
            b"\x28\xb5\x2f\xfd": "zstd-compressed", b"PK\x03\x04": "a zip archive", b"PAR1": "Parquet"}


class BadRecord(ValueError):
    """A line that cannot become a sample; the message says why."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", required=True, help="model folder holding the tokenizer and chat template")
    parser.add_argument("--input", required=True, help="chat data, JSONL")
    parser.add_argument("--output", required=True, help="prepared JSONL to write")
    parser.add_argument("--max-length", type=int, default=2048, help="truncate samples to this many tokens")
    parser.add_argument("--max-samples", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None, help="shuffle the samples with this seed")
    parser.add_argument("--strict", action="store_true", help="stop at the first malformed line")
    parser.add_argument("--freq-out", default=None, help="token frequency table (default: OUTPUT.token_freq.json)")
    parser.add_argument("--trust-remote-code", action="store_true")


@dataclass
class PrepareReport:
    written: int = 0
    skipped: int = 0
    truncated: int = 0
    dropped: int = 0  # no loss token left after truncation: nothing to train on
    tokens: int = 0
    masked_tokens: int = 0
    lines: int = 0  # non-blank input lines
    skip_reasons: list[str] = field(default_factory=list)  # first few, "file:line: why"
    dropped_ids: list[str] = field(default_factory=list)  # first few


# ---- checks that need no tokenizer ---------------------------------------------------------------------------

def check_model_path(model_path: str | Path) -> Path:
    """The model folder exists and holds a tokenizer's files (before transformers is imported)."""
    path = Path(model_path).expanduser()
    if not path.exists():
        raise UserError(f"model folder {path} does not exist")
    if not path.is_dir():
        raise UserError(f"model path {path} is not a folder")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise UserError(f"{path} holds no tokenizer ({' or '.join(TOKENIZER_FILES[:2])}): is it the model's folder?")
    return path


def check_arguments(input_path: str | Path, output_path: str | Path, *, max_length: int,
                    max_samples: int | None = None, freq_out: str | Path | None = None) -> tuple[Path, Path, Path]:
    """Everything that can be checked without the tokenizer, in milliseconds; returns the input, the output and
    the frequency table's path."""
    if max_length < 1:
        raise UserError("--max-length must be at least 1")
    if max_length > MAX_LENGTH_LIMIT:
        raise UserError(f"--max-length {max_length} is beyond any model's context; use at most {MAX_LENGTH_LIMIT}")
    if max_samples is not None and max_samples < 1:
        raise UserError("--max-samples must be at least 1")
    source = Path(input_path).expanduser()
    check_input(source)
    output = Path(output_path).expanduser()
    freq = Path(freq_out).expanduser() if freq_out else output.with_name(output.name + ".token_freq.json")
    for flag, path in (("--output", output), ("--freq-out", freq)):
        for written in (path, _staging_name(path)):
            if _same_file(written, source):
                raise UserError(f"{flag} {path} would overwrite the input {source}; choose another file")
        _check_writable(flag, path)
    if _same_file(output, freq):
        raise UserError(f"--freq-out {freq} is the --output file; choose another file")
    return source, output, freq


def check_input(path: Path) -> None:
    try:
        info = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(f"input {path} does not exist") from None
    except OSError as exc:
        raise UserError(f"cannot read input {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        inside = sorted(p.name for p in path.glob("*.jsonl"))[:3]
        raise UserError(f"input {path} is a folder, not a JSONL file"
                        + (f" (it holds {', '.join(inside)})" if inside else ""))
    if not os.access(path, os.R_OK):
        raise UserError(f"cannot read input {path}: permission denied")
    if stat.S_ISREG(info.st_mode):  # a pipe (/dev/stdin) is read as it comes
        if info.st_size == 0:
            raise UserError(f"input {path} is empty")
        try:
            with open(path, "rb") as f:
                head = f.read(8)
        except OSError as exc:
            raise UserError(f"cannot read input {path}: {exc.strerror or exc}") from None
        kind = next((what for magic, what in NOT_TEXT.items() if head.startswith(magic)), None)
        if kind:
            raise UserError(f"input {path} is {kind}, not JSONL text: convert it to JSON Lines (one object a line)")


def _check_writable(flag: str, path: Path) -> None:
    """The file can be created: not a folder, and its nearest existing folder is writable (made if missing)."""
    if path.is_dir():
        raise UserError(f"{flag} {path} is a folder; name a file in it, e.g. {path / 'prepared.jsonl'}")
    existing = path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"cannot write {flag} {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"cannot write {flag} {path}: the folder {existing} is not writable")


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def _staging_name(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def _one_line(exc: BaseException) -> str:
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "") or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


# ---- records -------------------------------------------------------------------------------------------------

def to_messages(record: Any) -> list[dict[str, str]]:
    """Normalise one record to [{"role", "content"}], or raise BadRecord."""
    if not isinstance(record, dict):
        raise BadRecord(f"expected a JSON object, got {type(record).__name__}")
    if "conversations" in record:
        turns, role_key, text_key = record["conversations"], "from", "value"
    elif "messages" in record:
        turns, role_key, text_key = record["messages"], "role", "content"
    else:
        raise BadRecord("no 'conversations' (ShareGPT) or 'messages' (OpenAI) field")
    if not isinstance(turns, list) or not turns:
        raise BadRecord("the conversation is empty or not a list")
    messages = []
    for n, turn in enumerate(turns):
        if not isinstance(turn, dict) or role_key not in turn or text_key not in turn:
            raise BadRecord(f"turn {n} lacks '{role_key}' or '{text_key}'")
        role = ROLE_ALIASES.get(str(turn[role_key]).lower())
        if role is None:
            raise BadRecord(f"turn {n} has unknown role {turn[role_key]!r}")
        content = turn[text_key]
        if isinstance(content, list):  # OpenAI content parts
            texts = [p.get("text", "") for p in content if isinstance(p, dict)]
            odd = next((t for t in texts if not isinstance(t, str)), None)
            if odd is not None:
                raise BadRecord(f"turn {n} has a content part whose text is {type(odd).__name__}, not text")
            content = "".join(texts)
        if not isinstance(content, str):
            raise BadRecord(f"turn {n} content is {type(content).__name__}, not text")
        bad = SURROGATE.search(content)
        if bad:
            raise BadRecord(f"turn {n} holds invalid Unicode (a lone surrogate \\u{ord(bad.group()):04x} at "
                            f"character {bad.start()})")
        messages.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" for m in messages[1:]):
        if messages[0]["role"] == "assistant":
            raise BadRecord("the only assistant turn opens the conversation, answering no prompt: nothing to train on")
        raise BadRecord("no assistant turn, so nothing to train on")
    return messages


def sample_id_of(record: dict[str, Any], line_no: int) -> str:
    """The record's id, which names its hidden-states file; ``line<N>`` when it has none."""
    raw = record.get("id")
    if raw is None:
        return f"line{line_no}"
    sample_id = str(raw)
    if not SAFE_ID.match(sample_id):
        raise BadRecord(f"id {sample_id[:80]!r} cannot name a sample file: use at most 128 letters, digits, '.', "
                        "'_' and '-', starting with a letter or digit")
    return sample_id


def parse_line(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRecord(f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line); "
                        "re-encode the file as UTF-8") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise BadRecord("JSON nested too deeply") from None
    except ValueError as exc:
        raise BadRecord(f"not valid JSON ({exc.args[0] if exc.args else exc})") from None


def read_records(path: Path, report: PrepareReport, strict: bool) -> list[tuple[int, str, list[dict[str, str]]]]:
    """Every line that can become a sample, as (line number, id, messages); the others are counted in the report
    (or stop the run with ``--strict``). Lines split on newline bytes only: U+2028 inside a JSON string is text."""
    records: list[tuple[int, str, list[dict[str, str]]]] = []
    seen: dict[str, int] = {}
    try:
        with open(path, "rb") as f:
            for line_no, raw in enumerate(f, start=1):
                if line_no == 1 and raw.startswith(UTF8_BOM):
                    raw = raw[len(UTF8_BOM):]
                if not raw.strip():
                    continue
                report.lines += 1
                try:
                    record = parse_line(raw)
                    messages = to_messages(record)
                    sample_id = sample_id_of(record, line_no)
                    if sample_id in seen:
                        raise BadRecord(f"id {sample_id!r} is already used on line {seen[sample_id]}")
                except BadRecord as exc:
                    _reject(report, f"{path}:{line_no}", exc, strict)
                    continue
                seen[sample_id] = line_no
                records.append((line_no, sample_id, messages))
    except OSError as exc:
        raise UserError(f"cannot read input {path}: {exc.strerror or exc}") from None
    return records


def _reject(report: PrepareReport, where: str, exc: BadRecord, strict: bool) -> None:
    if strict:
        raise UserError(f"{where}: {exc}") from None
    report.skipped += 1
    if len(report.skip_reasons) < SHOWN:
        report.skip_reasons.append(f"{where}: {exc}")


# ---- tokenizing ----------------------------------------------------------------------------------------------

def render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception as exc:  # the template is the model's code: raise_exception(), a missing key, a type error
        raise BadRecord(f"the chat template fails on this conversation: {_one_line(exc)}") from None
    if not isinstance(text, str):
        raise BadRecord("the chat template did not render text")
    return text


def assistant_spans(tokenizer: Any, messages: list[dict[str, str]], full: str,
                    upto: int | None = None) -> list[tuple[int, int]]:
    """The character spans of ``full`` (the rendered conversation) that the assistant wrote. Spans that would start
    after character ``upto`` (cut off by truncation) are not rendered. An assistant turn that opens the
    conversation answers no prompt: it stays context."""
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or i == 0:
            continue
        before = render(tokenizer, messages[:i], True)
        if upto is not None and len(before) > upto:
            break
        through = render(tokenizer, messages[: i + 1], False)
        if not (through.startswith(before) and full.startswith(through)):
            raise BadRecord("the chat template does not render prefixes consistently; cannot place the loss mask")
        spans.append((len(before), len(through)))
    return spans


def encode(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    return list(encoded["input_ids"]), [tuple(o) for o in encoded["offset_mapping"]]


def encode_bounded(tokenizer: Any, text: str, max_length: int) -> tuple[list[int], list[tuple[int, int]], bool]:
    """The first ``max_length`` tokens of ``text`` (ids, character offsets) and whether it had more, tokenizing
    only about as much text as they need: a 15 MB line costs what its first ``max_length`` tokens cost.

    A prefix is tokenized; its tokens that end well before the cut (a guard of a quarter of it, at least
    ``MIN_GUARD_CHARS``) are those of the whole text, since only the pieces near the cut can merge differently.
    When the prefix gives too few such tokens it is doubled; a text that fits is always tokenized whole, so its
    tokens are exactly the same as without the bound."""
    budget = CHARS_PER_TOKEN_GUESS * (max_length + 1) + MIN_GUARD_CHARS
    while budget < len(text):
        ids, offsets = encode(tokenizer, text[:budget])
        safe_end = budget - max(MIN_GUARD_CHARS, budget // 4)
        if len(ids) > max_length and max(end for _, end in offsets[: max_length + 1]) <= safe_end:
            return ids[:max_length], offsets[:max_length], True
        budget *= 2
    ids, offsets = encode(tokenizer, text)
    return ids[:max_length], offsets[:max_length], len(ids) > max_length


def tokenize_conversation(tokenizer: Any, messages: list[dict[str, str]],
                          max_length: int) -> tuple[list[int], list[int], bool]:
    """Token ids, loss mask and whether the sample was cut to ``max_length``."""
    full = render(tokenizer, messages, False)
    ids, offsets, truncated = encode_bounded(tokenizer, full, max_length)
    kept = max((end for _, end in offsets), default=0) if truncated else None
    spans = sorted(assistant_spans(tokenizer, messages, full, kept))
    mask = [0] * len(ids)
    span_iter = iter(spans)
    span = next(span_iter, None)
    for t, (start, _end) in enumerate(offsets):
        while span is not None and start >= span[1]:
            span = next(span_iter, None)
        if span is not None and span[0] <= start < span[1]:
            mask[t] = 1
    return ids, mask, truncated


def load_tokenizer(model_path: str, trust_remote_code: bool = False) -> Any:
    path = check_model_path(model_path)
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise UserError(f"prepare needs transformers, which does not import here: {_one_line(exc)}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as exc:  # a broken or foreign tokenizer folder fails in many ways, each the operator's to fix
        raise UserError(f"cannot load a tokenizer from {path}: {_one_line(exc)}") from None
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"the tokenizer in {path} has no chat template")
    if not getattr(tokenizer, "is_fast", False):
        raise UserError(f"the tokenizer in {path} is not a fast tokenizer; loss masks need its offset mapping")
    return tokenizer


# ---- the run -------------------------------------------------------------------------------------------------

class StagedFile:
    """A text file written as ``NAME.tmp`` and renamed over ``NAME`` only when its block ends without an error;
    otherwise the temporary (and any folder made for it) is removed. OS errors become one-line UserErrors."""

    def __init__(self, path: Path, flag: str) -> None:
        self.path, self.flag = path, flag
        self.tmp = _staging_name(path)
        self.handle: IO[str] | None = None
        self.made: list[Path] = []

    def _error(self, exc: OSError) -> UserError:
        return UserError(f"cannot write {self.flag} {self.path}: {exc.strerror or exc}")

    def __enter__(self) -> StagedFile:
        missing = self.path.parent
        while not missing.exists() and missing != missing.parent:
            self.made.append(missing)
            missing = missing.parent
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.handle = open(self.tmp, "w", encoding="utf-8")
        except OSError as exc:
            self._discard()
            raise self._error(exc) from None
        return self

    def write(self, text: str) -> None:
        assert self.handle is not None
        try:
            self.handle.write(text)
        except OSError as exc:
            raise self._error(exc) from None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:  # the run failed: its own error is the one to report
            self._discard()
            return
        try:
            assert self.handle is not None
            self.handle.close()
            self.tmp.replace(self.path)
        except OSError as err:
            self._discard()
            raise self._error(err) from None

    def _discard(self) -> None:
        if self.handle is not None and not self.handle.closed:
            try:
                self.handle.close()
            except OSError:
                pass
        try:
            self.tmp.unlink(missing_ok=True)
        except OSError:
            pass
        for folder in self.made:  # innermost first; only the ones made here, and only while empty
            try:
                folder.rmdir()
            except OSError:
                break


def prepare(input_path: str | Path, output_path: str | Path, tokenizer: Any, *, max_length: int = 2048,
            max_samples: int | None = None, seed: int | None = None, strict: bool = False,
            freq_out: str | Path | None = None) -> PrepareReport:
    source, output, freq_path = check_arguments(input_path, output_path, max_length=max_length,
                                                max_samples=max_samples, freq_out=freq_out)
    report = PrepareReport()
    with StagedFile(output, "--output") as out, StagedFile(freq_path, "--freq-out") as freq_file:
        records = read_records(source, report, strict)
        if seed is not None:
            random.Random(seed).shuffle(records)
        if max_samples is not None:
            records = records[:max_samples]
        freq: Counter[int] = Counter()
        for line_no, sample_id, messages in records:
            try:
                ids, mask, truncated = tokenize_conversation(tokenizer, messages, max_length)
            except BadRecord as exc:
                _reject(report, f"{source}:{line_no}", exc, strict)
                continue
            if not any(mask):
                report.dropped += 1
                if len(report.dropped_ids) < SHOWN:
                    report.dropped_ids.append(sample_id)
                continue
            report.truncated += truncated
            report.written += 1
            report.tokens += len(ids)
            report.masked_tokens += sum(mask)
            freq.update(t for t, m in zip(ids, mask) if m)
            out.write(json.dumps({"id": sample_id, "input_ids": ids, "loss_mask": mask}, separators=(",", ":")) + "\n")
        if not report.written:
            raise UserError(nothing_written(source, report, max_length))
        freq_file.write(json.dumps(token_frequency_table(freq, len(tokenizer))) + "\n")
    return report


def nothing_written(source: Path, report: PrepareReport, max_length: int) -> str:
    if not report.lines:
        return f"input {source} holds no samples, only blank lines"
    if not report.skipped:
        return (f"no sample of {source} has a loss token within --max-length {max_length} (the assistant turns "
                "start later): raise --max-length")
    first = report.skip_reasons[0]
    hint = " (a JSON array? prepare reads JSON Lines: one object a line)" if first.endswith("got list") else ""
    dropped = f", {report.dropped} without a loss token within --max-length" if report.dropped else ""
    return f"no usable samples in {source}: {report.skipped} lines skipped{dropped}; the first: {first}{hint}"


def token_frequency_table(freq: Counter[int], vocab_size: int) -> dict[str, Any]:
    """Counts of loss-masked tokens, most frequent first: what the trainer's d2t/t2d mapping is built from."""
    return {
        "vocab_size": vocab_size,
        "total": sum(freq.values()),
        "counts": [[int(t), int(c)] for t, c in freq.most_common()],
    }


def run(args: argparse.Namespace) -> int:
    # Every path and number first: a typo fails in milliseconds, before transformers' seconds of imports.
    check_model_path(args.model_path)
    check_arguments(args.input, args.output, max_length=args.max_length, max_samples=args.max_samples,
                    freq_out=args.freq_out)
    tokenizer = load_tokenizer(args.model_path, args.trust_remote_code)
    model_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(model_max, int) and args.max_length > model_max and model_max < 10**9:  # 10**30: not set
        print(f"warning: --max-length {args.max_length} is more than the tokenizer's model_max_length {model_max}",
              file=sys.stderr)
    report = prepare(args.input, args.output, tokenizer, max_length=args.max_length, max_samples=args.max_samples,
                     seed=args.seed, strict=args.strict, freq_out=args.freq_out)
    print(f"wrote {report.written} samples ({report.tokens} tokens, {report.masked_tokens} in the loss) to "
          f"{args.output}; skipped {report.skipped}, truncated {report.truncated}, dropped {report.dropped} "
          "without loss tokens")
    for reason in report.skip_reasons:
        print(f"  skipped {reason}", file=sys.stderr)
    if report.skipped > len(report.skip_reasons):
        print(f"  ... and {report.skipped - len(report.skip_reasons)} more skipped", file=sys.stderr)
    if report.dropped:
        unnamed = report.dropped - len(report.dropped_ids)
        more = f" and {unnamed} more" if unnamed else ""
        print(f"warning: dropped {report.dropped} sample(s) with no loss token within --max-length "
              f"{args.max_length}, nothing to train on: {', '.join(report.dropped_ids)}{more}", file=sys.stderr)
    return 0
