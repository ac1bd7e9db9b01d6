"""`eaglewatch preflight` cleans up after itself, tells of a folder being written, and meets bad input with one
line."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest

from conftest import run_cli
from eaglewatch.cli import main
from eaglewatch.pipeline import model_info as mi
from eaglewatch.pipeline.output_lock import OutputLock
from eaglewatch.pipeline.plan import ExtractConfig
from eaglewatch.pipeline.preflight.miniature_run import run_miniature


def preflight_args(model, data, out, *extra):
    return ["preflight", "--engine", "hf", "--model-path", str(model), "--prepared-data", str(data),
            "--output-dir", str(out), "--layer-ids", "1", "2", "4", "--max-seq-len", "512", *extra]


def test_a_passing_miniature_leaves_nothing_in_the_temporary_directory(tmp_path, tiny_llama, prepared_data):
    temp = tmp_path / "temp"
    temp.mkdir()
    proc = run_cli(*preflight_args(tiny_llama, prepared_data, tmp_path / "out", "--miniature-samples", "1"),
                   env={"TMPDIR": str(temp)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[ok  ] miniature" in proc.stdout
    assert list(temp.iterdir()) == []


def test_a_miniature_that_times_out_is_stopped_and_leaves_nothing(tmp_path, tiny_llama, prepared_data, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cfg = ExtractConfig(model_path=str(tiny_llama), prepared_data=str(prepared_data), output_dir=str(tmp_path / "o"),
                        engine="hf", max_seq_len=512)
    result = run_miniature(cfg, mi.load_model_info(tiny_llama), [1, 2, 4], timeout_s=0.01)
    # A miniature that could not finish checked nothing: a warning, never a failure that stops a real load.
    assert result.status == "warn" and "did not finish within" in result.reason
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("eaglewatch-miniature-")]


def test_a_folder_left_by_a_killed_job_is_swept(tmp_path):
    from eaglewatch.pipeline.preflight.miniature_run import FOLDER_PREFIX, sweep_left_behind

    gone = _dead_pid()
    left = tmp_path / f"{FOLDER_PREFIX}{gone}-0"
    (left / "model").mkdir(parents=True)
    mine = tmp_path / f"{FOLDER_PREFIX}{os.getpid()}-0"
    mine.mkdir()
    other = tmp_path / "eaglewatch-something-else"
    other.mkdir()
    assert sweep_left_behind(tmp_path) == [left]
    assert not left.exists() and mine.exists() and other.exists()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_folder_being_written_is_a_warning(tmp_path, tiny_llama, prepared_data):
    out = tmp_path / "out"
    out.mkdir()
    with OutputLock(out):
        proc = run_cli(*preflight_args(tiny_llama, prepared_data, out, "--no-miniature"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"[warn] output folder  {out} is being written by pid {os.getpid()} " in proc.stdout
    assert "fix: extract refuses a folder another run writes: wait for that run or stop it" in proc.stdout


@pytest.mark.parametrize("setup, message", [
    (lambda tmp: (tmp / "d.jsonl").write_bytes(b"\xff\n"), "d.jsonl:1: not UTF-8 text (byte 0xff at column 1)"),
    (lambda tmp: (tmp / "d.jsonl").symlink_to(tmp / "d.jsonl"), "Too many levels of symbolic links"),
    (lambda tmp: (tmp / "d.jsonl").mkdir(), "is a folder, not a JSONL file"),
])
def test_bad_data_is_a_failed_check_not_a_traceback(tmp_path, tiny_llama, capsys, setup, message):
    setup(tmp_path)
    code = main(preflight_args(tiny_llama, tmp_path / "d.jsonl", tmp_path / "out", "--no-miniature"))
    out = capsys.readouterr().out
    assert code == 2 and "[FAIL] data" in out and message in out, out


def test_an_output_folder_that_is_a_file_fails_the_disk_check(tmp_path, tiny_llama, prepared_data, capsys):
    (tmp_path / "out").write_text("x")
    code = main(preflight_args(tiny_llama, prepared_data, tmp_path / "out", "--no-miniature"))
    out = capsys.readouterr().out
    assert code == 2 and "[FAIL] disk" in out and f"output folder {tmp_path / 'out'} is a file, not a folder" in out
