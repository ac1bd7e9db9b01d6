"""``eaglewatch prepare``: chat JSONL to token ids and loss masks, with the model's own tokenizer and template.

Input lines are ShareGPT style (``{"conversations": [{"from", "value"}]}``) or OpenAI style
(``{"messages": [{"role", "content"}]}``). The loss mask is 1 on the tokens the assistant wrote (its content and
the end-of-turn marker the template puts after it) and 0 elsewhere. It is found by rendering the template on
growing prefixes of the conversation: the assistant's span is what its message adds after the generation prompt.

Also writes a frequency table of the loss-masked tokens (``--freq-out``), from which the trainer picks the draft
vocabulary (d2t/t2d).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglewatch.errors import UserError

HELP = "tokenize chat data (ShareGPT or OpenAI style) into input_ids and assistant-only loss masks"

ROLE_ALIASES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "model": "assistant",
    "bot": "assistant", "chatgpt": "assistant", "system": "system", "tool": "tool", "function": "tool",
}


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
    tokens: int = 0
    masked_tokens: int = 0
    skip_reasons: list[str] = field(default_factory=list)  # first few, "file:line: why"


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
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise BadRecord(f"turn {n} content is {type(content).__name__}, not text")
        messages.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" for m in messages):
        raise BadRecord("no assistant turn, so nothing to train on")
    return messages


def assistant_spans(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans written by the assistant."""
    def render(msgs: list[dict[str, str]], gen: bool) -> str:
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

    full = render(messages, False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(messages[:i], True)
        through = render(messages[: i + 1], False)
        if not (through.startswith(before) and full.startswith(through)):
            raise BadRecord("the chat template does not render prefixes consistently; cannot place the loss mask")
        spans.append((len(before), len(through)))
    return full, spans


def tokenize_conversation(tokenizer: Any, messages: list[dict[str, str]],
                          max_length: int) -> tuple[list[int], list[int], bool]:
    text, spans = assistant_spans(tokenizer, messages)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids: list[int] = list(encoded["input_ids"])
    mask = [0] * len(ids)
    span_iter = iter(sorted(spans))
    span = next(span_iter, None)
    for t, (start, _end) in enumerate(encoded["offset_mapping"]):
        while span is not None and start >= span[1]:
            span = next(span_iter, None)
        if span is not None and span[0] <= start < span[1]:
            mask[t] = 1
    truncated = len(ids) > max_length
    return ids[:max_length], mask[:max_length], truncated


def load_tokenizer(model_path: str, trust_remote_code: bool = False) -> Any:
    from transformers import AutoTokenizer

    path = Path(model_path)
    if not path.is_dir():
        raise UserError(f"model folder {path} does not exist")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot load a tokenizer from {path}: {exc}") from None
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"the tokenizer in {path} has no chat template")
    if not getattr(tokenizer, "is_fast", False):
        raise UserError(f"the tokenizer in {path} is not a fast tokenizer; loss masks need its offset mapping")
    return tokenizer


def prepare(input_path: str | Path, output_path: str | Path, tokenizer: Any, *, max_length: int = 2048,
            max_samples: int | None = None, seed: int | None = None, strict: bool = False,
            freq_out: str | Path | None = None) -> PrepareReport:
    input_path, output_path = Path(input_path), Path(output_path)
    if max_length < 1:
        raise UserError("--max-length must be at least 1")
    try:
        lines = input_path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UserError(f"input {input_path} does not exist") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{input_path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    report = PrepareReport()
    records: list[tuple[int, str, list[dict[str, str]]]] = []
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise BadRecord(f"not valid JSON ({exc.args[0] if exc.args else exc})") from None
            messages = to_messages(record)
            sample_id = str(record.get("id", f"line{line_no}"))
            records.append((line_no, sample_id, messages))
        except BadRecord as exc:
            if strict:
                raise UserError(f"{input_path}:{line_no}: {exc}") from None
            report.skipped += 1
            if len(report.skip_reasons) < 20:
                report.skip_reasons.append(f"{input_path}:{line_no}: {exc}")
    if seed is not None:
        random.Random(seed).shuffle(records)
    if max_samples is not None:
        records = records[:max_samples]

    freq: Counter[int] = Counter()
    output_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = output_path.with_name(output_path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        for line_no, sample_id, messages in records:
            try:
                ids, mask, truncated = tokenize_conversation(tokenizer, messages, max_length)
            except BadRecord as exc:
                if strict:
                    raise UserError(f"{input_path}:{line_no}: {exc}") from None
                report.skipped += 1
                report.skip_reasons.append(f"{input_path}:{line_no}: {exc}")
                continue
            report.truncated += truncated
            report.written += 1
            report.tokens += len(ids)
            report.masked_tokens += sum(mask)
            freq.update(t for t, m in zip(ids, mask) if m)
            out.write(json.dumps({"id": sample_id, "input_ids": ids, "loss_mask": mask}, separators=(",", ":")) + "\n")
    tmp.replace(output_path)
    freq_path = Path(freq_out) if freq_out else output_path.with_name(output_path.name + ".token_freq.json")
    write_token_frequencies(freq_path, freq, len(tokenizer))
    return report


def write_token_frequencies(path: Path, freq: Counter, vocab_size: int) -> None:
    """Counts of loss-masked tokens, most frequent first: what the trainer's d2t/t2d mapping is built from."""
    table = {
        "vocab_size": vocab_size,
        "total": sum(freq.values()),
        "counts": [[int(t), int(c)] for t, c in freq.most_common()],
    }
    path.write_text(json.dumps(table) + "\n")


def run(args: argparse.Namespace) -> int:
    tokenizer = load_tokenizer(args.model_path, args.trust_remote_code)
    report = prepare(args.input, args.output, tokenizer, max_length=args.max_length, max_samples=args.max_samples,
                     seed=args.seed, strict=args.strict, freq_out=args.freq_out)
    print(f"wrote {report.written} samples ({report.tokens} tokens, {report.masked_tokens} in the loss) to "
          f"{args.output}; skipped {report.skipped}, truncated {report.truncated}")
    for reason in report.skip_reasons:
        print(f"  skipped {reason}", file=sys.stderr)
    return 0
