"""`eaglewatch preflight` cleans up after itself, tells of a folder being written, and meets bad input with one
line."""

from __future__ import annotations

import os
import tempfile

import pytest

from conftest import run_cli
from eaglewatch.cli import main
from eaglewatch.pipeline import model_info as mi
from eaglewatch.pipeline.output_lock import OutputLock
from eaglewatch.pipeline.plan import ExtractConfig
from eaglewatch.pipeline.preflight.miniature import run_miniature


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


def test_a_failing_miniature_keeps_its_folder_and_names_it(tmp_path, tiny_llama, prepared_data, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cfg = ExtractConfig(model_path=str(tiny_llama), prepared_data=str(prepared_data), output_dir=str(tmp_path / "o"),
                        engine="hf", max_seq_len=512)
    result = run_miniature(cfg, mi.load_model_info(tiny_llama), [1, 2, 4], timeout_s=0.01)
    assert result.status == "fail" and "did not finish within" in result.reason
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("eaglewatch-miniature-")]
    assert len(kept) == 1 and result.log_path == str(kept[0] / "miniature.log")
    assert (kept[0] / "model" / "config.json").exists()


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
