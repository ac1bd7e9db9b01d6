"""`eaglewatch prepare` on bad input: each mistake ends in one line (file:line where there is one) and exit code 2,
never a traceback; nothing is left behind; a huge line costs what its first --max-length tokens cost."""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_cli, seeded_rng
from eaglewatch.errors import UserError
from eaglewatch.pipeline import prepare as prep
from eaglewatch.pipeline.prepare import load_tokenizer, prepare

GOOD = {"id": "a", "conversations": [{"from": "human", "value": "What is a shard?"},
                                     {"from": "gpt", "value": "One file of the weights."}]}
GOOD2 = {"id": "b", "messages": [{"role": "user", "content": "And TP?"},
                                 {"role": "assistant", "content": "Splitting layers across GPUs."}]}

# Imports that must not happen before prepare has checked its paths and numbers.
BLOCK_HEAVY = (
    "import sys\n"
    "class Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in {'torch', 'vllm', 'transformers', 'tokenizers', 'jinja2', 'numpy'}:\n"
    "            raise ImportError(f'{name} is blocked in this test')\n"
    "sys.meta_path.insert(0, Block())\n"
)


@pytest.fixture(scope="module")
def tokenizer(tiny_llama):
    return load_tokenizer(str(tiny_llama))


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def user_error(call) -> str:
    """The UserError's message, checked to be one line."""
    with pytest.raises(UserError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and message
    return message


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp"))


# ---- before the tokenizer: paths and numbers, checked without importing transformers ---------------------------

def run_blocked(cases: dict[str, list[str]]) -> dict[str, dict]:
    """Run each argument list through the real CLI entry point in one process with the heavy packages blocked."""
    code = BLOCK_HEAVY + (
        "import io, json, time, contextlib\n"
        "from eaglewatch.cli import main\n"
        f"cases = json.loads({json.dumps(json.dumps(cases))})\n"
        "out = {}\n"
        "for name, argv in cases.items():\n"
        "    err = io.StringIO()\n"
        "    t0 = time.perf_counter()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        rc = main(argv)\n"
        "    out[name] = {'rc': rc, 'stderr': err.getvalue(), 's': time.perf_counter() - t0}\n"
        "out['_transformers_imported'] = 'transformers' in sys.modules\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result.pop("_transformers_imported") is False
    return result


def test_path_and_number_mistakes_fail_at_once_without_importing_transformers(tiny_llama, tmp_path):
    good = write_jsonl(tmp_path / "chat.jsonl", [GOOD])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    (tmp_path / "folder").mkdir()
    write_jsonl(tmp_path / "folder" / "train.jsonl", [GOOD])
    packed = tmp_path / "chat.jsonl.gz"
    packed.write_bytes(gzip.compress(good.read_bytes()))
    a_file = tmp_path / "note.txt"
    a_file.write_text("x")
    no_tokenizer = tmp_path / "weights-only"
    no_tokenizer.mkdir()
    (no_tokenizer / "config.json").write_text("{}")
    out = str(tmp_path / "out.jsonl")
    model = str(tiny_llama)

    def argv(*extra: str, model_path: str = model, src: str | Path = good, output: str = out) -> list[str]:
        return ["prepare", "--model-path", model_path, "--input", str(src), "--output", output, *extra]

    cases = {
        "missing input": (argv(src=tmp_path / "absent.jsonl"), f"input {tmp_path / 'absent.jsonl'} does not exist"),
        "input is a folder": (argv(src=tmp_path / "folder"), f"input {tmp_path / 'folder'} is a folder, not a JSONL "
                              "file (it holds train.jsonl)"),
        "empty input": (argv(src=empty), f"input {empty} is empty"),
        "compressed input": (argv(src=packed), f"input {packed} is gzip-compressed, not JSONL text"),
        "missing model": (argv(model_path=str(tmp_path / "nomodel")), f"model folder {tmp_path / 'nomodel'} does "
                          "not exist"),
        "model is a file": (argv(model_path=str(a_file)), f"model path {a_file} is not a folder"),
        "no tokenizer": (argv(model_path=str(no_tokenizer)), f"{no_tokenizer} holds no tokenizer"),
        "output is the input": (argv(output=str(good)), f"--output {good} would overwrite the input {good}"),
        "freq table is the input": (argv("--freq-out", str(good)), f"--freq-out {good} would overwrite the input"),
        "freq table is the output": (argv("--freq-out", out), f"--freq-out {out} is the --output file"),
        "output is a folder": (argv(output=str(tmp_path / "folder")), f"--output {tmp_path / 'folder'} is a folder"),
        "output under a file": (argv(output=str(a_file / "out.jsonl")), f"cannot write --output {a_file / 'out.jsonl'}:"
                                f" {a_file} is a file, not a folder"),
        "huge max length": (argv("--max-length", str(10**12)), "--max-length 1000000000000 is beyond any model's "
                            "context"),
        "zero max length": (argv("--max-length", "0"), "--max-length must be at least 1"),
        "zero max samples": (argv("--max-samples", "0"), "--max-samples must be at least 1"),
    }
    results = run_blocked({name: args for name, (args, _) in cases.items()})
    for name, (_, expected) in cases.items():
        result = results[name]
        assert result["rc"] == 2, (name, result)
        lines = result["stderr"].splitlines()
        assert len(lines) == 1 and lines[0].startswith("eaglewatch prepare: error: "), (name, result["stderr"])
        assert expected in lines[0], (name, lines[0])
    assert not (tmp_path / "out.jsonl").exists() and leftovers(tmp_path) == []
    assert good.read_text() == json.dumps(GOOD) + "\n"  # never overwritten


def test_a_missing_input_fails_fast_as_a_whole_process(tiny_llama, tmp_path):
    """The operator's view: the whole command, started fresh, says so before transformers could be imported."""
    code = BLOCK_HEAVY + (
        "from eaglewatch.cli import main\n"
        f"sys.exit(main(['prepare', '--model-path', {str(tiny_llama)!r}, '--input', {str(tmp_path / 'no.jsonl')!r},"
        f" '--output', {str(tmp_path / 'o.jsonl')!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"eaglewatch prepare: error: input {tmp_path / 'no.jsonl'} does not exist")


# ---- the output: checked before the work, never left half-written ---------------------------------------------

def test_a_missing_output_folder_is_made(tmp_path, tokenizer):
    src = write_jsonl(tmp_path / "chat.jsonl", [GOOD])
    report = prepare(src, tmp_path / "new" / "deeper" / "out.jsonl", tokenizer,
                     freq_out=tmp_path / "elsewhere" / "freq.json")
    assert report.written == 1 and rows(tmp_path / "new" / "deeper" / "out.jsonl")[0]["id"] == "a"
    assert json.loads((tmp_path / "elsewhere" / "freq.json").read_text())["total"] == report.masked_tokens


def test_a_failure_after_the_start_leaves_nothing_behind(tmp_path, tokenizer):
    src = write_jsonl(tmp_path / "chat.jsonl", [GOOD, GOOD2, "{broken"])
    message = user_error(lambda: prepare(src, tmp_path / "new" / "out.jsonl", tokenizer, strict=True))
    assert message.startswith(f"{src}:3: not valid JSON")
    assert not (tmp_path / "new").exists() and leftovers(tmp_path) == []


def test_an_earlier_output_survives_a_failed_run(tmp_path, tokenizer):
    src = write_jsonl(tmp_path / "chat.jsonl", [GOOD])
    prepare(src, tmp_path / "out.jsonl", tokenizer)
    before = (tmp_path / "out.jsonl").read_text()
    write_jsonl(src, ["[1, 2]"])
    user_error(lambda: prepare(src, tmp_path / "out.jsonl", tokenizer))
    assert (tmp_path / "out.jsonl").read_text() == before and leftovers(tmp_path) == []


def mount_tmpfs(folder: Path, options: str) -> None:
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")


def test_a_read_only_output_folder_fails_before_any_work(tmp_path, tiny_llama):
    src = write_jsonl(tmp_path / "chat.jsonl", [GOOD])
    ro = tmp_path / "ro"
    mount_tmpfs(ro, "ro,size=64k")
    try:
        results = run_blocked({"ro": ["prepare", "--model-path", str(tiny_llama), "--input", str(src), "--output",
                                      str(ro / "out.jsonl")]})
        assert results["ro"]["rc"] == 2
        assert results["ro"]["stderr"].strip() == (f"eaglewatch prepare: error: cannot write --output "
                                                   f"{ro / 'out.jsonl'}: the folder {ro} is not writable")
    finally:
        subprocess.run(["umount", "-l", str(ro)])


def test_a_full_disk_mid_write_is_one_line_and_cleans_up(tmp_path, tokenizer):
    records = [dict(GOOD, id=f"s{i}") for i in range(400)]  # ~100 kB of output
    src = write_jsonl(tmp_path / "chat.jsonl", records)
    small = tmp_path / "small"
    mount_tmpfs(small, "size=16k")
    try:
        message = user_error(lambda: prepare(src, small / "out.jsonl", tokenizer))
        assert message == f"cannot write --output {small / 'out.jsonl'}: No space left on device"
        assert list(small.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(small)])


# ---- lines that cannot become samples: file:line, skipped (or fatal with --strict), never a traceback ----------

TEMPLATE_ERROR = ("{% for message in messages %}{% if message['role'] == 'system' %}"
                  "{{ raise_exception('System role not supported') }}{% endif %}"
                  "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}"
                  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.mark.parametrize("line, why", [
    (b'{"id": "x", "conversations": [{"from": "human", "value": "caf\xe9"}]}', "not UTF-8 text (byte 0xe9 at byte 62"),
    (b"[1, 2]", "expected a JSON object, got list"),
    (b'"just a string"', "expected a JSON object, got str"),
    (b"[" * 100_000 + b"]" * 100_000, "JSON nested too deeply"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(), "no assistant turn"),
    (json.dumps({"messages": [{"role": "assistant", "content": "Hello!"}]}).encode(),
     "the only assistant turn opens the conversation"),
    (json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]},
                              {"role": "assistant", "content": "ok"}]}).encode(), "content part whose text is int"),
    (b'{"messages": [{"role": "user", "content": "a\\ud800b"}, {"role": "assistant", "content": "ok"}]}',
     "lone surrogate \\ud800 at character 1"),
    (json.dumps(dict(GOOD, id="conv/7")).encode(), "id 'conv/7' cannot name a sample file"),
    (json.dumps(dict(GOOD, id="a")).encode(), "id 'a' is already used on line 1"),
])
def test_bad_lines_are_named_and_skipped_or_fatal_with_strict(tmp_path, tokenizer, line, why):
    src = tmp_path / "chat.jsonl"
    src.write_bytes(json.dumps(GOOD).encode() + b"\n" + line + b"\n" + json.dumps(GOOD2).encode() + b"\n")
    report = prepare(src, tmp_path / "out.jsonl", tokenizer)
    assert (report.written, report.skipped) == (2, 1)
    assert report.skip_reasons[0].startswith(f"{src}:2: ") and why in report.skip_reasons[0], report.skip_reasons
    message = user_error(lambda: prepare(src, tmp_path / "strict.jsonl", tokenizer, strict=True))
    assert message.startswith(f"{src}:2: ") and why in message
    assert not (tmp_path / "strict.jsonl").exists() and leftovers(tmp_path) == []


def test_a_chat_template_that_raises_skips_the_line(tmp_path, tiny_llama):
    model = tmp_path / "tok"
    model.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_llama / name, model / name)
    (model / "chat_template.jinja").write_text(TEMPLATE_ERROR)
    tok = load_tokenizer(str(model))
    with_system = {"id": "s", "conversations": [{"from": "system", "value": "Be brief."}, *GOOD["conversations"]]}
    src = write_jsonl(tmp_path / "chat.jsonl", [GOOD, with_system])
    report = prepare(src, tmp_path / "out.jsonl", tok)
    assert report.written == 1 and report.skip_reasons == [
        f"{src}:2: the chat template fails on this conversation: System role not supported"]


def test_a_leading_assistant_turn_is_context(tmp_path, tokenizer):
    greeting = {"id": "g", "conversations": [{"from": "gpt", "value": "Hello, ask me anything."},
                                             *GOOD["conversations"]]}
    src = write_jsonl(tmp_path / "chat.jsonl", [greeting])
    prepare(src, tmp_path / "out.jsonl", tokenizer)
    (row,) = rows(tmp_path / "out.jsonl")
    trained = tokenizer.decode([t for t, m in zip(row["input_ids"], row["loss_mask"]) if m])
    assert trained == "One file of the weights.<|im_end|>\n"


def test_whole_file_mistakes_are_one_line(tmp_path, tokenizer):
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(json.dumps(GOOD, ensure_ascii=False).replace("shard", "shärd").encode("latin-1") + b"\n")
    assert user_error(lambda: prepare(latin1, tmp_path / "o.jsonl", tokenizer)).startswith(
        f"no usable samples in {latin1}: 1 lines skipped; the first: {latin1}:1: not UTF-8 text")
    array = write_jsonl(tmp_path / "array.jsonl", [json.dumps([GOOD, GOOD2])])
    assert user_error(lambda: prepare(array, tmp_path / "o.jsonl", tokenizer)).endswith(
        "(a JSON array? prepare reads JSON Lines: one object a line)")
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n  \n\n")
    assert user_error(lambda: prepare(blank, tmp_path / "o.jsonl", tokenizer)) == (
        f"input {blank} holds no samples, only blank lines")
    assert leftovers(tmp_path) == [] and not (tmp_path / "o.jsonl").exists()


def test_line_separators_inside_strings_and_a_bom_are_text(tmp_path, tokenizer):
    odd = {"id": "u", "conversations": [{"from": "human", "value": "one\u2028two\u2029three\x85four"},
                                        {"from": "gpt", "value": "ok"}]}
    src = tmp_path / "chat.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + json.dumps(odd, ensure_ascii=False).encode() + b"\r\n")
    report = prepare(src, tmp_path / "out.jsonl", tokenizer, strict=True)
    assert report.written == 1 and "one\u2028two\u2029three\x85four" in tokenizer.decode(
        rows(tmp_path / "out.jsonl")[0]["input_ids"])


def test_the_cli_on_a_bad_file_is_one_line_after_the_tokenizer(tmp_path, tiny_llama):
    src = tmp_path / "chat.jsonl"
    src.write_bytes(b"\xff\xfe{\x00\n")
    proc = run_cli("prepare", "--model-path", tiny_llama, "--input", src, "--output", tmp_path / "out.jsonl")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"eaglewatch prepare: error: no usable samples in {src}: 1 lines skipped; the first: {src}:1: not UTF-8 "
        "text (byte 0xff at byte 1 of the line); re-encode the file as UTF-8")
    assert leftovers(tmp_path) == []


# ---- bounded work per sample, and samples with nothing to learn -----------------------------------------------

class CountingTokenizer:
    """The real tokenizer, recording the longest text it was asked to tokenize."""

    def __init__(self, inner) -> None:
        self.inner, self.longest = inner, 0

    def __call__(self, text, **kwargs):
        self.longest = max(self.longest, len(text))
        return self.inner(text, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __len__(self) -> int:
        return len(self.inner)


def test_a_huge_line_costs_what_its_first_tokens_cost(tmp_path, tokenizer):
    rng = random.Random(0)
    text = " ".join(rng.choice(["shard", "tensor", "the", "of", "GPU", "naïve", "1234"]) for _ in range(400_000))
    big = {"id": "big", "conversations": [{"from": "human", "value": "Summarise."}, {"from": "gpt", "value": text}]}
    src = write_jsonl(tmp_path / "chat.jsonl", [big])
    counting = CountingTokenizer(tokenizer)
    report = prepare(src, tmp_path / "out.jsonl", counting, max_length=256)
    assert report.truncated == 1 and len(text) > 2_000_000 and counting.longest < 20_000
    (row,) = rows(tmp_path / "out.jsonl")
    assert len(row["input_ids"]) == 256 and sum(row["loss_mask"]) > 200


def random_text(rng: random.Random, n: int) -> str:
    pieces = ["shard", "Tensor", " ", "  ", "\n", "\n\n", "\t", "GPU", "12345", "3.14", "naïve", "über", "日本語",
              "😀", "<|im_end|>", "don't", "'s", "...", "—", "aaaaaaaa", "=" * 40, " " * 30, "x" * 300]
    out, size = [], 0
    while size < n:
        piece = rng.choice(pieces)
        out.append(piece)
        size += len(piece)
    return "".join(out)


def test_bounded_tokenizing_gives_the_tokens_of_the_whole_text(tokenizer):
    rng = seeded_rng("bounded-tokenizing")
    for _ in range(60):
        text = random_text(rng, rng.choice([500, 3_000, 20_000, 60_000]))
        max_length = rng.choice([1, 7, 64, 300, 2048])
        ids, offsets = prep.encode(tokenizer, text)
        assert prep.encode_bounded(tokenizer, text, max_length) == (
            ids[:max_length], offsets[:max_length], len(ids) > max_length), (max_length, len(text))


def test_samples_left_without_loss_tokens_are_dropped_and_named(tmp_path, tokenizer, tiny_llama):
    long_prompt = {"id": "long-prompt", "conversations": [{"from": "human", "value": "word " * 500},
                                                          {"from": "gpt", "value": "Short answer."}]}
    src = write_jsonl(tmp_path / "chat.jsonl", [GOOD, long_prompt, GOOD2])
    report = prepare(src, tmp_path / "out.jsonl", tokenizer, max_length=64)
    assert (report.written, report.dropped, report.dropped_ids) == (2, 1, ["long-prompt"])
    assert [r["id"] for r in rows(tmp_path / "out.jsonl")] == ["a", "b"]
    assert all(1 in r["loss_mask"] for r in rows(tmp_path / "out.jsonl"))
    proc = run_cli("prepare", "--model-path", tiny_llama, "--input", src, "--output", tmp_path / "cli.jsonl",
                   "--max-length", "64")
    assert proc.returncode == 0, proc.stderr
    assert "dropped 1 without loss tokens" in proc.stdout
    assert ("warning: dropped 1 sample(s) with no loss token within --max-length 64, nothing to train on: "
            "long-prompt") in proc.stderr
    only = write_jsonl(tmp_path / "only.jsonl", [long_prompt])
    assert user_error(lambda: prepare(only, tmp_path / "o.jsonl", tokenizer, max_length=64)) == (
        f"no sample of {only} has a loss token within --max-length 64 (the assistant turns start later): "
        "raise --max-length")


def test_samples_that_fit_are_unchanged(tmp_path, tokenizer):
    """The bound never touches a sample that fits: the bundled data prepared with and without it are identical."""
    from eaglewatch.assets import SAMPLE_CHAT_DATA

    prepare(SAMPLE_CHAT_DATA, tmp_path / "bounded.jsonl", tokenizer, max_length=64)
    whole = prep.encode_bounded
    try:
        def encode_whole(tok, text, limit):
            ids, offsets = prep.encode(tok, text)
            return ids[:limit], offsets[:limit], len(ids) > limit
        prep.encode_bounded = encode_whole
        prepare(SAMPLE_CHAT_DATA, tmp_path / "whole.jsonl", tokenizer, max_length=64)
    finally:
        prep.encode_bounded = whole
    assert (tmp_path / "bounded.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    assert os.path.getsize(tmp_path / "bounded.jsonl") > 0
