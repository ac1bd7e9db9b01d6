"""Hostile input across every subcommand.

Two guarantees. First, each command is either behind the one gate (``cli.GATED``: every write to stdout and
stderr goes through ``safetext``) or says why not and how its outside text is made safe (``cli.UNGATED``), so a
command added later cannot print outside data another way unnoticed. Second, each command has hostile-input runs:
the rows of ``COVERED`` name where (this file runs the ones no other file does). Every run plants the sequences of
tests/hostile_support.py (and invalid UTF-8, over-long lines) in a field the command reads, then asserts: no raw
control character in stdout or stderr, no traceback, an exit within a bound, and the inputs unchanged.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
from conftest import run_cli
from hostile_support import HOSTILE, assert_safe

from eaglewatch import cli

EVIL = "".join(HOSTILE)
TEMPLATE_RAISES = ("{% for message in messages %}{{ raise_exception('" + EVIL.replace("\\", "\\\\") + "') }}"
                   "{% endfor %}")

# command -> the tests that run it on hostile input ("module::test"); this file's own are below.
COVERED: dict[str, tuple[str, ...]] = {
    "prepare": ("test_hostile_every_command::test_prepare_on_hostile_input",),
    "extract": ("test_hostile_files::test_hostile_model_fields_reach_no_terminal",),
    "verify": ("test_hostile_files::test_hostile_output_folders_reach_no_terminal",
               "test_user_mistakes::test_a_users_mistake_ends_in_one_clear_line"),
    "export": ("test_export_hostile::test_hostile_folders_are_refused_in_one_line_and_left_as_they_were",),
    "preflight": ("test_hostile_files::test_hostile_model_fields_reach_no_terminal",),
    "make-tiny-model": ("test_hostile_every_command::test_make_tiny_model_on_a_hostile_config",),
    "decode": ("test_hostile_files::test_hostile_log_lines_reach_no_terminal",),
    "demo": ("test_hostile_every_command::test_demo_takes_no_outside_text",),
    "launch": ("test_hostile_cli::test_stop_and_launch_print_host_words_safely",),
    "runs": ("test_hostile_cli::test_runs_shows_hostile_names_and_arguments_visibly",),
    "attach": ("test_hostile_cli::test_attach_passes_text_and_colour_and_shows_every_other_sequence",
               "test_run_files_bounded::test_a_spoiled_run_file_ends_in_at_most_one_clear_line"),
    "stop": ("test_hostile_cli::test_stop_and_launch_print_host_words_safely",),
    "restart": ("test_hostile_cli::test_bad_run_names_options_and_commands_are_refused_in_one_line",),
    "stacks": ("test_hangs::test_stacks_show_hostile_file_names_and_arguments_visibly",),
    "job": ("test_fleet_hostile::test_job_status_prints_hostile_text_visibly",
            "test_fleet_hostile::test_the_fleet_view_shows_hostile_text_visibly"),
    "agent": ("test_hostile_cli::test_a_nul_in_a_name_or_argument_is_refused_by_the_agent",),
    "dashboard": ("test_hostile_app::test_the_runs_list_shows_hostile_names_and_arguments_visibly",
                  "test_hostile_app::test_the_run_screen_failure_panel_traceback_and_restart_dialog_are_safe"),
}


def test_every_command_is_behind_the_gate_or_says_why_not():
    assert set(cli.GATED) | set(cli.UNGATED) == set(cli.COMMANDS)
    assert not set(cli.GATED) & set(cli.UNGATED)
    assert all(len(why) > 20 for why in cli.UNGATED.values())


def test_every_command_has_hostile_input_runs():
    assert set(COVERED) == set(cli.COMMANDS)
    for command, tests in COVERED.items():
        for test in tests:
            module, name = test.split("::")
            found = getattr(importlib.import_module(module), name, None)
            assert callable(found), f"{command}: {test} is not a test"


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _assert_clean(proc, what: str) -> None:
    assert proc.returncode in (0, 1, 2), (what, proc.returncode, proc.stderr[-3000:])
    assert "Traceback (most recent call last)" not in proc.stderr, (what, proc.stderr[-3000:])
    assert_safe(proc.stdout, what=f"{what}: stdout")
    assert_safe(proc.stderr, what=f"{what}: stderr")


def _tokenizer_folder(tiny_llama: Path, folder: Path, template: str | None = None) -> Path:
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_llama / name, folder / name)
    if template is not None:
        (folder / "chat_template.jinja").write_text(template)
    return folder


def _chat(rows: list[bytes]) -> bytes:
    good = {"id": "ok", "conversations": [{"from": "human", "value": "What is a shard?"},
                                          {"from": "gpt", "value": "A piece of the weights."}]}
    return json.dumps(good).encode() + b"\n" + b"\n".join(rows) + b"\n"


# name -> (what the input folder gets: file name -> bytes, the chat template or None)
PREPARE_CASES: dict[str, tuple[Callable[[], dict[str, bytes]], str | None]] = {
    "hostile ids and roles in bad lines": (lambda: {"chat.jsonl": _chat([
        json.dumps({"id": EVIL, "conversations": 5}).encode(),
        json.dumps({"id": "r", "conversations": [{"from": EVIL, "value": "x"}]}).encode(),
        json.dumps({EVIL: 1}).encode()])}, None),
    "invalid UTF-8 and a NUL": (lambda: {"chat.jsonl": _chat([b"\xff\xfe{\"id\": \"\x9b2J\"}", b"{\"id\": \"a\x00\"}"])},
                                None),
    "an over-long line of escapes": (lambda: {"chat.jsonl": _chat([("\x1b[2J" * 300_000).encode()])}, None),
    "a hostile file name": (lambda: {f"chat{EVIL}.jsonl": _chat([b"not json " + EVIL.encode()])}, None),
    "a chat template that raises hostile text": (lambda: {"chat.jsonl": _chat([])}, TEMPLATE_RAISES),
}


@pytest.mark.parametrize("case", list(PREPARE_CASES))
def test_prepare_on_hostile_input(case, tiny_llama, tmp_path):
    files, template = PREPARE_CASES[case]
    model = _tokenizer_folder(tiny_llama, tmp_path / "tok", template)
    inputs = tmp_path / "in"
    inputs.mkdir()
    for name, data in files().items():
        (inputs / name).write_bytes(data)
    before = _tree(tmp_path)
    source = next(inputs.iterdir())
    proc = run_cli("prepare", "--model-path", model, "--input", source, "--output", tmp_path / "out" / "p.jsonl",
                   timeout=120)
    _assert_clean(proc, case)
    assert {k: v for k, v in _tree(tmp_path).items() if not k.startswith("out/")} == before


HOSTILE_CONFIGS: dict[str, dict[str, object]] = {
    "model_type": {"model_type": f"llama{EVIL}"},
    "architectures": {"architectures": [f"Llama{EVIL}ForCausalLM"]},
    "a number field that is text": {"hidden_size": EVIL},
}


@pytest.mark.parametrize("case", list(HOSTILE_CONFIGS))
def test_make_tiny_model_on_a_hostile_config(case, tiny_llama, tmp_path):
    config = json.loads((tiny_llama / "config.json").read_text())
    config.update(HOSTILE_CONFIGS[case])
    like = tmp_path / "config.json"
    like.write_text(json.dumps(config))
    proc = run_cli("make-tiny-model", "--like", like, "--out", tmp_path / "m", "--shards", "1", timeout=180)
    _assert_clean(proc, case)


def test_demo_takes_no_outside_text():
    """The demo builds its own model and data; its only outside input is its options, refused in one line."""
    proc = run_cli("demo", "--no-such-option", EVIL, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert_safe(proc.stderr, what="demo")
