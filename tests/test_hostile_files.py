"""Hostile strings in what the GPU-side commands read (file names, config fields, manifest values, log lines): every
command's output shows them as visible text through the one gate, with no traceback and a bounded exit.

Each case is a row: what it plants in a copy of a real folder, and the command run on it. The strings are every
sequence of tests/hostile_support.py at once (clipboard, title, screen clear, DCS, 8-bit CSI, bidi override).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
from conftest import run_cli
from hostile_support import HOSTILE, assert_safe

EVIL = "".join(HOSTILE)


def _model(tiny_llama: Path, tmp: Path, **config_fields) -> Path:
    folder = tmp / "model"
    shutil.copytree(tiny_llama, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(config_fields)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _architectures(tiny_llama: Path, data: Path, out: Path, tmp: Path) -> list[object]:
    model = _model(tiny_llama, tmp, architectures=[f"Llama{EVIL}ForCausalLM"])
    return ["preflight", "--engine", "hf", "--model-path", model, "--prepared-data", data, "--output-dir", out,
            "--no-miniature"]


def _architectures_in_extract(tiny_llama: Path, data: Path, out: Path, tmp: Path) -> list[object]:
    model = _model(tiny_llama, tmp, architectures=[f"Llama{EVIL}ForCausalLM"])
    return ["extract", "--engine", "hf", "--model-path", model, "--prepared-data", data, "--output-dir", out,
            "--no-miniature"]


def _shard_name(tiny_llama: Path, data: Path, out: Path, tmp: Path) -> list[object]:
    model = _model(tiny_llama, tmp)
    index = json.loads((model / "model.safetensors.index.json").read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    evil = f"x{EVIL.replace('/', '_')}.safetensors"
    index["weight_map"] = {k: (evil if v == first else v) for k, v in index["weight_map"].items()}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    return ["preflight", "--engine", "hf", "--model-path", model, "--prepared-data", data, "--output-dir", out,
            "--no-miniature"]


def _sample_file_name(hf_reference: Path, tmp: Path) -> list[object]:
    folder = tmp / "out"
    shutil.copytree(hf_reference, folder)
    (folder / f"hs_{EVIL}.safetensors").write_bytes(b"\x00" * 16)
    return ["verify", folder]


def _manifest_model_path(hf_reference: Path, tmp: Path) -> list[object]:
    folder = tmp / "out"
    shutil.copytree(hf_reference, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["model_path"] = f"/models/{EVIL}"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return ["verify", folder]


def _manifest_world_size(hf_reference: Path, tmp: Path) -> list[object]:
    folder = tmp / "out"
    shutil.copytree(hf_reference, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["world_size"] = 10**12  # a count nothing on disk backs: must not be looped over
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return ["verify", folder]


def _log_lines(tmp: Path) -> list[object]:
    log = tmp / "job.log"
    log.write_text(f"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                   f"RuntimeError: {EVIL} \u202egpj.exe \x9b2J\n")
    return ["decode", log]


MODEL_CASES: dict[str, Callable[[Path, Path, Path, Path], list[object]]] = {
    "config architectures, preflight": _architectures,
    "config architectures, extract": _architectures_in_extract,
    "a shard's file name, preflight": _shard_name,
}
FOLDER_CASES: dict[str, Callable[[Path, Path], list[object]]] = {
    "a sample file's name, verify": _sample_file_name,
    "the manifest's model_path, verify": _manifest_model_path,
    "the manifest's world_size, verify": _manifest_world_size,
}


def _assert_clean(proc, what: str) -> None:
    assert proc.returncode in (0, 1, 2), (what, proc.returncode, proc.stderr[-3000:])
    assert "Traceback (most recent call last)" not in proc.stderr, (what, proc.stderr[-3000:])
    assert_safe(proc.stdout, what=f"{what}: stdout")
    assert_safe(proc.stderr, what=f"{what}: stderr")


@pytest.mark.parametrize("case", list(MODEL_CASES))
def test_hostile_model_fields_reach_no_terminal(case, tiny_llama, prepared_data, tmp_path):
    args = MODEL_CASES[case](tiny_llama, prepared_data, tmp_path / "o", tmp_path)
    _assert_clean(run_cli(*args, timeout=300), case)


@pytest.mark.parametrize("case", list(FOLDER_CASES))
def test_hostile_output_folders_reach_no_terminal(case, hf_reference, tmp_path):
    args = FOLDER_CASES[case](hf_reference, tmp_path)
    _assert_clean(run_cli(*args, timeout=60), case)


def test_hostile_log_lines_reach_no_terminal(tmp_path):
    proc = run_cli(*_log_lines(tmp_path), timeout=60)
    _assert_clean(proc, "decode")
    assert "RuntimeError" in proc.stdout
