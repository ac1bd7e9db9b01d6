"""`eaglewatch verify` on damaged folders: each problem is one clear line (exit 2 for a folder it cannot read as an
eaglewatch output, exit 1 and a named file for a bad sample file), never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import struct

import pytest

from eaglewatch.cli import main
from eaglewatch.pipeline import output
from eaglewatch.pipeline.prepared_data import iter_prepared


@pytest.fixture()
def outputs(tmp_path, hf_reference, prepared_data):
    """A finished extraction of the first 8 samples (a copy of part of the reference)."""
    copy = tmp_path / "out"
    shutil.copytree(hf_reference, copy)
    for sample in list(iter_prepared(prepared_data))[8:]:
        output.sample_path(copy, sample.id).unlink()
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["max_samples"] = 8
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def verify_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(["verify", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def first_file(folder):
    return sorted(folder.glob("hs_*.safetensors"))[0]


def write_raw(path, header, data: bytes = b""):
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)


MANIFESTS = {
    "a JSON list": (b"[1, 2]", "is not an eaglewatch manifest (a JSON list, not an object)"),
    "not JSON": (b"{oops", "is not valid JSON"),
    "not UTF-8": (b'{"layer_ids": "\xff"}', "is not valid JSON"),
    "no layer ids": (b'{"a": 1}', "is not a usable eaglewatch manifest: layer_ids is None"),
    "a string for a size": (None, "is not a usable eaglewatch manifest: hidden_size is '128'"),
    "a rank outside its world": (None, "rank 3 of world_size 2 is not a share"),
}


@pytest.mark.parametrize("case", MANIFESTS)
def test_a_damaged_manifest_is_one_line(outputs, capsys, case):
    content, message = MANIFESTS[case]
    path = outputs / "manifest.json"
    if content is None:
        manifest = json.loads(path.read_text())
        manifest.update({"hidden_size": "128"} if "size" in case else {"rank": 3, "world_size": 2})
        content = json.dumps(manifest).encode()
    path.write_bytes(content)
    code, _, err = verify_cli(capsys, outputs)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_folder_for_a_manifest(outputs, capsys):
    (outputs / "manifest.json").unlink()
    (outputs / "manifest.json").mkdir()
    code, _, err = verify_cli(capsys, outputs)
    assert code == 2 and "manifest.json is a folder, not a manifest file" in err


def _header_list(path):
    write_raw(path, [1, 2])
    return "the safetensors header is a JSON list, not an object"


def _bad_offsets(path):
    header = output.read_header(path)
    header["hidden_states"]["data_offsets"] = ["a", 3]
    write_raw(path, header)
    return "tensor 'hidden_states': data_offsets ['a', 3] are not [begin, end]"


def _unknown_dtype(path):
    header = output.read_header(path)
    data = path.read_bytes()[8 + struct.unpack("<Q", path.read_bytes()[:8])[0]:]
    header["loss_mask"]["dtype"] = "X9"
    write_raw(path, header, data)
    return "tensor 'loss_mask': unknown dtype 'X9'"


def _wrong_sizes(path):
    """Offsets that add up to the file's size but not to the shapes they claim."""
    header = output.read_header(path)
    data = path.read_bytes()[8 + struct.unpack("<Q", path.read_bytes()[:8])[0]:]
    header["token_ids"]["shape"] = [header["token_ids"]["shape"][0] * 2]
    write_raw(path, header, data)
    return "bytes of data for shape"


def _huge_header_length(path):
    path.write_bytes(struct.pack("<Q", 2**62) + b"{}")
    return "implausible safetensors header length"


def _empty(path):
    path.write_bytes(b"")
    return "file is shorter than a safetensors header"


def _folder(path):
    path.unlink()
    path.mkdir()
    return "unreadable: it is a folder, not a regular file"


def _fifo(path):
    path.unlink()
    os.mkfifo(path)  # opened plainly, it would wait for a writer for ever
    return "unreadable: it is a FIFO, not a regular file"


def _loop(path):
    path.unlink()
    path.symlink_to(path)
    return "unreadable: [Errno 40] Too many levels of symbolic links"


def _altered_in_place(path):
    """Bytes of token_ids changed under an intact header: the recorded hash no longer matches."""
    header = output.read_header(path)
    raw = bytearray(path.read_bytes())
    start = 8 + struct.unpack("<Q", raw[:8])[0] + header["token_ids"]["data_offsets"][0]
    raw[start] ^= 1
    path.write_bytes(bytes(raw))
    return "its recorded sample hash does not match its token_ids and loss_mask"


SAMPLE_FILES = {f.__name__.strip("_"): f for f in (_header_list, _bad_offsets, _unknown_dtype, _wrong_sizes,
                                                   _huge_header_length, _empty, _folder, _fifo, _loop, _altered_in_place)}


@pytest.mark.parametrize("case", SAMPLE_FILES)
def test_a_damaged_sample_file_is_named(outputs, capsys, case):
    path = first_file(outputs)
    why = SAMPLE_FILES[case](path)
    code, out, err = verify_cli(capsys, outputs)
    assert code == 1, out + err
    assert f"bad: {path.name}: " in out and why in out, out
    assert "7 of 8 files good" in out


@pytest.mark.parametrize("flags, message", [
    (["--against-hf", "-1"], "argument --against-hf: must be 0 or more (got -1)"),
    (["--tolerance", "nan"], "argument --tolerance: must be a finite number, 0 or more (got nan)"),
    (["--tolerance", "-1"], "argument --tolerance: must be a finite number, 0 or more (got -1)"),
    (["--prepared-data", "/nonexistent/data.jsonl"], "prepared data /nonexistent/data.jsonl does not exist"),
])
def test_bad_flags(outputs, capsys, flags, message):
    try:
        code, _, err = verify_cli(capsys, outputs, *flags)
    except SystemExit as exc:  # argparse's own errors
        code, err = exc.code, capsys.readouterr().err
    assert code == 2 and message in err


@pytest.mark.parametrize("target", ["file", "loop"])
def test_not_a_folder(tmp_path, capsys, target):
    path = tmp_path / "x"
    if target == "file":
        path.write_text("x")
    else:
        path.symlink_to(path)
    code, _, err = verify_cli(capsys, path)
    assert code == 2 and f"{path} is not a folder" in err


def test_data_that_is_gone_is_said_not_silently_skipped(outputs, capsys, tmp_path):
    manifest = json.loads((outputs / "manifest.json").read_text())
    manifest["prepared_data"] = str(tmp_path / "moved-away.jsonl")
    (outputs / "manifest.json").write_text(json.dumps(manifest))
    code, out, err = verify_cli(capsys, outputs, "--no-finite-check")
    assert code == 0, out + err
    assert f"note: the prepared data {tmp_path / 'moved-away.jsonl'} is not there" in err


def test_against_hf_without_the_model(outputs, capsys, tmp_path):
    manifest = json.loads((outputs / "manifest.json").read_text())
    manifest["model_path"] = str(tmp_path / "gone")
    (outputs / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = verify_cli(capsys, outputs, "--against-hf", "1", "--no-finite-check")
    assert code == 2 and "--against-hf needs the model" in err


def test_data_not_utf8_is_one_line(outputs, capsys, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"id": "\xfe"}\n')
    code, _, err = verify_cli(capsys, outputs, "--prepared-data", bad)
    assert code == 2 and f"{bad}:1: not UTF-8 text (byte 0xfe at column 9)" in err
