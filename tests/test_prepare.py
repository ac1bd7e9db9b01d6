"""`eaglewatch prepare` with the tiny model's real tokenizer and chat template."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from eaglewatch.errors import UserError
from eaglewatch.pipeline.prepare import load_tokenizer, prepare


@pytest.fixture(scope="module")
def tokenizer(tiny_llama):
    return load_tokenizer(str(tiny_llama))


def write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


SHAREGPT = {"id": "a", "conversations": [
    {"from": "system", "value": "Be brief."},
    {"from": "human", "value": "What is a shard?"},
    {"from": "gpt", "value": "One file of the weights."},
    {"from": "human", "value": "And TP?"},
    {"from": "gpt", "value": "Splitting layers across GPUs."},
]}
OPENAI = {"id": "b", "messages": [
    {"role": "user", "content": "What is a shard?"},
    {"role": "assistant", "content": [{"type": "text", "text": "One file of the weights."}]},
]}


def test_loss_mask_covers_exactly_the_assistant_turns(tmp_path, tokenizer):
    src = write_jsonl(tmp_path / "chat.jsonl", [SHAREGPT, OPENAI])
    report = prepare(src, tmp_path / "out.jsonl", tokenizer)
    assert report.written == 2 and report.skipped == 0
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    first = rows[0]
    assert len(first["input_ids"]) == len(first["loss_mask"])
    trained = tokenizer.decode([t for t, m in zip(first["input_ids"], first["loss_mask"]) if m])
    assert trained == "One file of the weights.<|im_end|>\nSplitting layers across GPUs.<|im_end|>\n"
    context = tokenizer.decode([t for t, m in zip(first["input_ids"], first["loss_mask"]) if not m])
    assert "What is a shard?" in context and "Be brief." in context and "One file" not in context
    # OpenAI style with content parts gives the same assistant tokens.
    second = rows[1]
    assert tokenizer.decode([t for t, m in zip(second["input_ids"], second["loss_mask"]) if m]) == \
        "One file of the weights.<|im_end|>\n"


def test_frequency_table_counts_loss_masked_tokens(tmp_path, tokenizer):
    src = write_jsonl(tmp_path / "chat.jsonl", [SHAREGPT, OPENAI])
    report = prepare(src, tmp_path / "out.jsonl", tokenizer)
    table = json.loads((tmp_path / "out.jsonl.token_freq.json").read_text())
    assert table["total"] == report.masked_tokens == sum(c for _, c in table["counts"])
    counts = [c for _, c in table["counts"]]
    assert counts == sorted(counts, reverse=True)


def test_strict_mode_names_file_and_line(tmp_path, tokenizer):
    src = write_jsonl(tmp_path / "chat.jsonl", [SHAREGPT, "{broken json", OPENAI])
    with pytest.raises(UserError, match=r"chat\.jsonl:2: not valid JSON"):
        prepare(src, tmp_path / "out.jsonl", tokenizer, strict=True)


@pytest.mark.parametrize("bad, why", [
    ({"conversations": []}, "empty"),
    ({"text": "hello"}, "no 'conversations'"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant turn"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "unknown role"),
    ({"conversations": [{"from": "human"}]}, "lacks"),
])
def test_lenient_mode_skips_and_reports(tmp_path, tokenizer, bad, why):
    src = write_jsonl(tmp_path / "chat.jsonl", [SHAREGPT, bad, OPENAI])
    report = prepare(src, tmp_path / "out.jsonl", tokenizer)
    assert (report.written, report.skipped) == (2, 1)
    assert report.skip_reasons[0].startswith(f"{src}:2: ") and why in report.skip_reasons[0]


def test_truncation_max_samples_and_seeded_shuffle(tmp_path, tokenizer):
    records = [dict(SHAREGPT, id=f"s{i}") for i in range(10)]
    src = write_jsonl(tmp_path / "chat.jsonl", records)
    report = prepare(src, tmp_path / "a.jsonl", tokenizer, max_length=40, max_samples=4, seed=3)
    rows = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert report.truncated == 4 and all(len(r["input_ids"]) == 40 for r in rows)
    prepare(src, tmp_path / "b.jsonl", tokenizer, max_length=40, max_samples=4, seed=3)
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()
    assert [r["id"] for r in rows] != ["s0", "s1", "s2", "s3"]


def test_cli_reports_counts(tmp_path, tiny_llama):
    src = write_jsonl(tmp_path / "chat.jsonl", [SHAREGPT, "nope", OPENAI])
    proc = run_cli("prepare", "--model-path", tiny_llama, "--input", src, "--output", tmp_path / "o.jsonl")
    assert proc.returncode == 0, proc.stderr
    assert "wrote 2 samples" in proc.stdout and "skipped 1" in proc.stdout
    assert f"{src}:2" in proc.stderr
    strict = run_cli("prepare", "--model-path", tiny_llama, "--input", src, "--output", tmp_path / "o.jsonl",
                     "--strict")
    assert strict.returncode == 2 and f"{src}:2: not valid JSON" in strict.stderr
