"""`eaglewatch extract` against a hostile user: numbers out of range, paths that are not what they claim, data that
changed under a finished folder, a subset run into a finished folder, a disk that fills up mid-run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from conftest import EAGLEWATCH, file_bytes, read_events, run_cli
from eaglewatch.cli import main
from eaglewatch.pipeline import output
from eaglewatch.pipeline.prepared_data import iter_prepared
from eaglewatch.pipeline.verify import verify

LAYERS = ["--layer-ids", "1", "2", "4"]


def hf_args(model, data, out, *extra):
    """The reference run's flags (conftest's hf_reference): its files are what these runs must reproduce."""
    return ["extract", "--engine", "hf", "--model-path", str(model), "--prepared-data", str(data),
            "--output-dir", str(out), *LAYERS, "--max-seq-len", "512", "--batch-size", "8", "--no-miniature",
            *extra]


def in_process(capsys, *argv) -> tuple[int, str]:
    """The real command, in this process (no interpreter start): exit code and stderr."""
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


@pytest.fixture()
def finished(tmp_path, hf_reference) -> Path:
    """A copy of a finished extraction of all 64 samples."""
    copy = tmp_path / "finished"
    shutil.copytree(hf_reference, copy)
    return copy


def rewrite_data(src: Path, dst: Path, edit) -> Path:
    """``src`` with ``edit(index, record)`` applied to each line's record."""
    lines = []
    for i, line in enumerate(src.read_text().splitlines()):
        record = json.loads(line)
        edit(i, record)
        lines.append(json.dumps(record))
    dst.write_text("\n".join(lines) + "\n")
    return dst


def bump_token(record):
    record["input_ids"][2] = (record["input_ids"][2] + 1) % 200


def flip_mask(record):
    record["loss_mask"][-1] = 1 - record["loss_mask"][-1]


# ---------------------------------------------------------------- numbers and options out of range

@pytest.mark.parametrize("flags, message", [
    (["--max-samples", "0"], "--max-samples must be at least 1 (got 0)"),
    (["--max-samples", "-2"], "--max-samples must be at least 1 (got -2)"),
    (["--batch-size", "0"], "--batch-size must be at least 1 (got 0)"),
    (["--tp-size", "0"], "--tp-size must be at least 1 (got 0)"),
    (["--max-seq-len", "0"], "--max-seq-len must be at least 1 (got 0)"),
    (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization is a share of each GPU's memory"),
    (["--gpu-memory-utilization", "1.5"], "more than 0, at most 1 (got 1.5)"),
    (["--gpu-memory-utilization", "nan"], "more than 0, at most 1 (got nan)"),
    (["--kv-cache-memory-bytes", "0"], "--kv-cache-memory-bytes must be at least 1 (got 0)"),
    (["--write-timeout", "0"], "--write-timeout must be a positive number of seconds (got 0.0)"),
    (["--write-timeout", "nan"], "--write-timeout must be a positive number of seconds (got nan)"),
    (["--seed", "-1"], "--seed must be in 0..4294967295 (got -1)"),
    (["--miniature-samples", "0"], "--miniature-samples must be at least 1 (got 0)"),
    (["--rank", "3", "--world-size", "2"], "--rank 3 must be in 0..1 for --world-size 2"),
    (["--rank", "-1"], "--rank -1 must be in 0..0 for --world-size 1"),
    (["--world-size", "0"], "--world-size must be at least 1 (got 0)"),
    (["--dtype", "fp8"], "--dtype must be one of float32, bfloat16, float16 (got 'fp8')"),
    (["--tp-size", "2"], "the hf engine runs on one device; use --tp-size 1 or --engine vllm"),
])
@pytest.mark.parametrize("command", ["extract", "preflight"])
def test_numbers_out_of_range_are_refused_before_anything(tmp_path, tiny_llama, prepared_data, capsys, flags,
                                                          message, command):
    out = tmp_path / "out"
    code, err = in_process(capsys, command, *hf_args(tiny_llama, prepared_data, out)[1:], *flags)
    assert code == 2, err
    assert message in err
    assert len(err.strip().splitlines()) == 1, err  # one line, no preflight table, no traceback
    assert "fix:" not in err  # no hint about something else
    assert not out.exists()  # nothing read or written yet


@pytest.mark.parametrize("flag", ["--output-dir", "--prepared-data", "--model-path"])
def test_empty_paths_are_refused(tmp_path, tiny_llama, prepared_data, capsys, flag):
    argv = hf_args(tiny_llama, prepared_data, tmp_path / "out")
    argv[argv.index(flag) + 1] = ""
    code, err = in_process(capsys, *argv)
    assert code == 2 and f"{flag} is empty" in err


@pytest.mark.parametrize("flags, message", [
    (["--rank", "3", "--world-size", "2"], "--rank 3 must be in 0..1 for --world-size 2"),
    (["--world-size", "0"], "--world-size must be at least 1 (got 0)"),
    (["--max-samples", "0"], "--max-samples must be at least 1 (got 0)"),
])
def test_the_real_command_says_one_line_and_exits_2(tmp_path, tiny_llama, prepared_data, flags, message):
    out = tmp_path / "out"
    proc = run_cli(*hf_args(tiny_llama, prepared_data, out, *flags), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"eaglewatch extract: error: {message}"
    assert not out.exists()


# ---------------------------------------------------------------- the data is part of the resume identity

def test_changed_samples_are_extracted_again(tmp_path, finished, tiny_llama, prepared_data):
    """Two samples of one batch: one with another token id, one with another loss mask."""
    edits = {11: bump_token, 12: flip_mask}
    data = rewrite_data(prepared_data, tmp_path / "edited.jsonl",
                        lambda i, r: edits[i](r) if i in edits else None)
    samples = list(iter_prepared(data))
    before = file_bytes(finished)
    proc = run_cli(*hf_args(tiny_llama, data, finished))
    assert proc.returncode == 0, proc.stderr
    warnings = [e for e in read_events(finished / "events.jsonl") if e["kind"] == "warning"]
    assert [w["code"] for w in warnings] == ["changed"]
    assert "2 samples changed since they were extracted" in warnings[0]["message"]
    assert f"{samples[11].id}, line 12" in warnings[0]["message"]
    names = set()
    for i in edits:
        redone = load_file(str(output.sample_path(finished, samples[i].id)))
        assert redone["token_ids"].tolist() == samples[i].input_ids
        assert redone["loss_mask"].tolist() == samples[i].loss_mask
        names.add(output.sample_path(finished, samples[i].id).name)
    after = file_bytes(finished)
    assert all(after[name] != before[name] for name in names)
    assert {k: v for k, v in after.items() if k not in names} == {k: v for k, v in before.items() if k not in names}
    manifest = json.loads((finished / "manifest.json").read_text())
    assert manifest["samples_written"] == 8  # their batch, nothing else
    assert manifest["prepared_data"] == str(data.resolve())
    report = verify(finished, finite=False)
    assert report.passed and report.ok == 64, report


def test_other_data_altogether_is_refused(tmp_path, finished, tiny_llama, prepared_data):
    data = rewrite_data(prepared_data, tmp_path / "other.jsonl", lambda i, r: bump_token(r))
    before = file_bytes(finished)
    manifest_before = (finished / "manifest.json").read_bytes()
    proc = run_cli(*hf_args(tiny_llama, data, finished), timeout=120)
    assert proc.returncode == 2
    assert "was extracted from other data: 64 of its 64 files" in proc.stderr
    assert "--force-new" in proc.stderr and "Traceback" not in proc.stderr
    assert file_bytes(finished) == before and (finished / "manifest.json").read_bytes() == manifest_before


def test_files_without_a_recorded_hash_are_compared_by_their_tensors(tmp_path, finished, tiny_llama,
                                                                     prepared_data):
    """Files written before the hash was recorded: their own token_ids and loss_mask are compared instead."""
    for path in finished.glob("hs_*.safetensors"):
        save_file(load_file(str(path)), str(path), metadata={"format": "pt"})
        assert output.SAMPLE_HASH_KEY not in output.read_header(path)["__metadata__"]
    unchanged = run_cli(*hf_args(tiny_llama, prepared_data, finished), timeout=120)
    assert unchanged.returncode == 0 and "nothing to do" in unchanged.stdout, unchanged.stderr
    data = rewrite_data(prepared_data, tmp_path / "edited.jsonl", lambda i, r: bump_token(r) if i == 40 else None)
    legacy = file_bytes(finished)
    proc = run_cli(*hf_args(tiny_llama, data, finished))
    assert proc.returncode == 0, proc.stderr
    rewritten = {k for k, v in file_bytes(finished).items() if legacy[k] != v}
    batch = {output.sample_path(finished, s.id).name for s in list(iter_prepared(data))[40:48]}
    assert rewritten == batch  # the changed sample's batch, now with the hash


# ---------------------------------------------------------------- a subset run into a finished folder

def head(src: Path, dst: Path, n: int) -> Path:
    dst.write_text("".join(src.read_text().splitlines(keepends=True)[:n]))
    return dst


@pytest.mark.parametrize("subset", ["max-samples", "smaller-file", "smaller-batches"])
def test_a_subset_never_changes_what_a_finished_folder_says(tmp_path, finished, tiny_llama, prepared_data,
                                                            subset):
    data, extra = prepared_data, ["--max-samples", "8"]
    if subset == "smaller-file":
        data, extra = head(prepared_data, tmp_path / "head.jsonl", 8), []
    elif subset == "smaller-batches":
        extra = ["--max-samples", "20", "--batch-size", "4"]
    manifest = (finished / "manifest.json").read_bytes()
    before = file_bytes(finished)
    proc = run_cli(*hf_args(tiny_llama, data, finished, *extra), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "nothing to do" in proc.stdout
    assert (finished / "manifest.json").read_bytes() == manifest
    assert file_bytes(finished) == before
    report = verify(finished, finite=False)
    assert report.passed and report.ok == 64, report


def test_a_subset_repairs_a_damaged_file_and_keeps_the_manifest(tmp_path, finished, tiny_llama, prepared_data,
                                                                hf_reference):
    victim = output.sample_path(finished, next(iter_prepared(prepared_data)).id)
    victim.write_bytes(victim.read_bytes()[:-100])
    manifest = (finished / "manifest.json").read_bytes()
    proc = run_cli(*hf_args(tiny_llama, prepared_data, finished, "--max-samples", "8"))
    assert proc.returncode == 0, proc.stderr
    assert (finished / "manifest.json").read_bytes() == manifest
    assert file_bytes(finished) == file_bytes(hf_reference)


def test_a_subset_with_changed_data_is_refused(tmp_path, finished, tiny_llama, prepared_data):
    data = head(rewrite_data(prepared_data, tmp_path / "edited.jsonl", lambda i, r: bump_token(r) if i == 3
                             else None), tmp_path / "head.jsonl", 8)
    before = file_bytes(finished)
    proc = run_cli(*hf_args(tiny_llama, data, finished), timeout=120)
    assert proc.returncode == 2
    assert "this run selects only part of the folder's data" in proc.stderr
    assert file_bytes(finished) == before


def test_a_run_that_leaves_out_samples_the_folder_holds_is_refused(tmp_path, finished, tiny_llama,
                                                                   prepared_data):
    """The folder holds the first 8 samples of one file; a run over the other 56 would describe only those."""
    first8 = head(prepared_data, tmp_path / "first8.jsonl", 8)
    ids = [s.id for s in iter_prepared(prepared_data)]
    for sid in ids[8:]:
        output.sample_path(finished, sid).unlink()
    manifest = json.loads((finished / "manifest.json").read_text())
    manifest.update(prepared_data=str(first8.resolve()), samples_total=8)
    (finished / "manifest.json").write_text(json.dumps(manifest))
    rest = tmp_path / "rest.jsonl"
    rest.write_text("".join(prepared_data.read_text().splitlines(keepends=True)[8:]))
    proc = run_cli(*hf_args(tiny_llama, rest, finished), timeout=120)
    assert proc.returncode == 2
    assert f"holds 8 samples this run does not select (e.g. hs_{sorted(ids[:8])[0]}.safetensors" in proc.stderr
    assert str(first8.resolve()) in proc.stderr


# ---------------------------------------------------------------- paths that are not what they claim

def _nonutf8(tmp, data):
    bad = tmp / "bad.jsonl"
    lines = data.read_bytes().splitlines(keepends=True)
    bad.write_bytes(lines[0] + b'{"id": "x\xff", "input_ids": [1], "loss_mask": [0]}\n' + b"".join(lines[1:]))
    return {"--prepared-data": bad}, f"{bad}:2: not UTF-8 text (byte 0xff at column 10)"


def _data_loop(tmp, data):
    (tmp / "a").symlink_to(tmp / "b")
    (tmp / "b").symlink_to(tmp / "a")
    return {"--prepared-data": tmp / "a"}, "Too many levels of symbolic links"


def _data_dangling(tmp, data):
    (tmp / "link").symlink_to(tmp / "nowhere.jsonl")
    return {"--prepared-data": tmp / "link"}, "is a symbolic link to"


def _data_fifo(tmp, data):
    os.mkfifo(tmp / "fifo")
    return {"--prepared-data": tmp / "fifo"}, "not a regular file (a pipe or device cannot be read twice)"


def _data_nested(tmp, data):
    deep = tmp / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    return {"--prepared-data": deep}, f"{deep}:1: not a prepared sample (JSON nested too deeply)"


def _out_file(tmp, data):
    (tmp / "out").write_text("x")
    return {}, "is a file, not a folder"


def _out_loop(tmp, data):
    (tmp / "out").symlink_to(tmp / "out2")
    (tmp / "out2").symlink_to(tmp / "out")
    return {}, "is a symbolic link that leads to no folder"


def _manifest(content: bytes):
    def setup(tmp, data):
        (tmp / "out").mkdir()
        (tmp / "out" / "manifest.json").write_bytes(content)
        return {}, None
    return setup


def _manifest_folder(tmp, data):
    (tmp / "out" / "manifest.json").mkdir(parents=True)
    return {}, "manifest.json is a folder, not a manifest file; move it away or use --force-new"


def _sample_folder(tmp, data):
    sid = next(iter_prepared(data)).id
    output.sample_path(tmp / "out", sid).mkdir(parents=True)
    return {}, f"hs_{sid}.safetensors is a folder where this sample's file goes; move it away"


def _lock_folder(tmp, data):
    (tmp / "out" / ".eaglewatch.lock").mkdir(parents=True)
    return {}, ".eaglewatch.lock is a folder; eaglewatch keeps its lock file there: move it away"


HOSTILE = {
    "data not UTF-8": _nonutf8,
    "data a loop of links": _data_loop,
    "data a dangling link": _data_dangling,
    "data a pipe": _data_fifo,
    "data nested too deeply": _data_nested,
    "output a file": _out_file,
    "output a loop of links": _out_loop,
    "manifest a JSON list": (_manifest(b"[1, 2]\n"), "is not an eaglewatch manifest (a JSON list, not an object)"),
    "manifest not UTF-8": (_manifest(b'{"a": "\xff"}'), "is not valid JSON"),
    "manifest empty": (_manifest(b""), "is not valid JSON"),
    "manifest a folder": _manifest_folder,
    "a folder for a sample file": _sample_folder,
    "the lock file a folder": _lock_folder,
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_paths_end_in_one_clear_line(tmp_path, tiny_llama, prepared_data, capsys, case):
    setup = HOSTILE[case]
    expected = None
    if isinstance(setup, tuple):
        setup, expected = setup
    overrides, message = setup(tmp_path, prepared_data)
    argv = hf_args(tiny_llama, prepared_data, tmp_path / "out", "--max-samples", "4")
    for flag, value in overrides.items():
        argv[argv.index(flag) + 1] = str(value)
    code, err = in_process(capsys, *argv)
    assert code == 2, err
    assert (message or expected) in err
    assert err.strip().splitlines()[-1].startswith("eaglewatch extract: error: ")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_data_is_named(tmp_path, tiny_llama, prepared_data, capsys):
    data = tmp_path / "data.jsonl"
    shutil.copy(prepared_data, data)
    data.chmod(0)
    code, err = in_process(capsys, *hf_args(tiny_llama, data, tmp_path / "out"))
    assert code == 2 and f"cannot read prepared data {data}: Permission denied" in err


def test_force_new_replaces_a_damaged_manifest(tmp_path, tiny_llama, prepared_data):
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text("{not json")
    proc = run_cli(*hf_args(tiny_llama, prepared_data, out, "--max-samples", "4", "--force-new"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "manifest.json").read_text())["status"] == "done"


# ---------------------------------------------------------------- a disk that fills up mid-run

@pytest.fixture()
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path: Path) -> None:
    """Write zeros to ``path`` until its filesystem is full, to the last page."""
    with open(path, "wb", buffering=0) as f:
        for size in (1 << 20, 1 << 16, 1 << 12):
            chunk = b"\0" * size
            try:
                while True:
                    f.write(chunk)
            except OSError as exc:
                assert exc.errno == 28, exc


def test_a_disk_that_fills_up_stops_the_run_resumably(small_disk, tiny_llama, prepared_data, hf_reference):
    out = small_disk / "out"
    args = hf_args(tiny_llama, prepared_data, out, "--no-preflight")
    proc = subprocess.Popen([*EAGLEWATCH, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(out.glob("hs_*.safetensors")):  # the run is writing: now the disk fills up
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no sample file appeared"
        time.sleep(0.02)
    fill(small_disk / "filler")
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 3, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"eaglewatch extract: error: disk full on {small_disk} after ")
    assert last.endswith(" of 64 samples; free space and run the same command to resume")
    assert "Traceback" not in stderr
    left = sorted(out.glob("hs_*.safetensors"))
    assert 0 < len(left) < 64
    assert f"after {len(left)} of 64 samples" in last
    assert not [p for p in out.iterdir() if ".tmp" in p.name]  # no partial file under any name
    reference = file_bytes(hf_reference)
    assert all(path.read_bytes() == reference[path.name] for path in left)  # every file there is whole

    (small_disk / "filler").unlink()
    resumed = run_cli(*args)
    assert resumed.returncode == 0, resumed.stderr
    assert file_bytes(out) == reference


@pytest.mark.vllm
def test_the_connector_reports_a_full_disk_by_its_errno(small_disk):
    """vLLM's writer threads leave a `.failed` marker; the driver reads the errno back from it."""
    pytest.importorskip("vllm")
    import torch

    from eaglewatch.pipeline.engines.vllm_connector import EaglewatchHiddenStatesConnector
    from eaglewatch.pipeline.engines.vllm_engine import VLLMEngine, WriteFailed

    fill(small_disk / "filler")
    path = small_disk / "hs_x.safetensors"
    tensors = {"hidden_states": torch.zeros(64, 3, 128), "token_ids": torch.zeros(64, dtype=torch.int64),
               "loss_mask": torch.zeros(64, dtype=torch.int8)}
    with pytest.raises(OSError):
        EaglewatchHiddenStatesConnector._write(str(path), tensors, None)
    assert not path.exists() and not list(small_disk.glob("*.tmp.*"))
    engine = VLLMEngine.__new__(VLLMEngine)
    with pytest.raises(WriteFailed) as failed:
        engine.wait_written([path], timeout_s=5)
    assert failed.value.errno == 28 and output.is_disk_full(failed.value)


def test_a_sample_file_is_never_left_partial(tmp_path, monkeypatch):
    """The atomic writer removes its temporary file when a write fails, whatever the reason."""
    import torch

    calls = {"n": 0}
    real_write = os.write

    def failing_write(fd, data):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", failing_write)
    path = tmp_path / "hs_a.safetensors"
    with pytest.raises(OSError):
        output.write_sample_file(path, {"hidden_states": torch.ones(4, 2, 8), "token_ids": torch.arange(4),
                                        "loss_mask": torch.ones(4, dtype=torch.int8)})
    assert list(tmp_path.iterdir()) == []


def test_the_sample_hash_is_what_the_file_holds(tmp_path):
    import torch

    path = tmp_path / "hs_a.safetensors"
    output.write_sample_file(path, {"hidden_states": torch.ones(3, 2, 8), "token_ids": torch.tensor([5, 6, 7]),
                                    "loss_mask": torch.tensor([0, 1, 1], dtype=torch.int8)})
    header = output.read_header(path)
    assert header["__metadata__"][output.SAMPLE_HASH_KEY] == output.sample_hash([5, 6, 7], [0, 1, 1])
    assert output.sample_hash([5, 6, 7], [0, 1, 0]) != output.sample_hash([5, 6, 7], [0, 1, 1])
    del header["__metadata__"][output.SAMPLE_HASH_KEY]
    assert output.stored_sample_hash(path, header) == output.sample_hash([5, 6, 7], [0, 1, 1])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
