"""`eaglewatch export` on a hostile or broken output folder: one `error:` line, exit code 2, no traceback, no
"train with:" line, and not a byte of the folder changed.

Each case is a row of ``CASES``: what it does to a copy of a real extraction (``hf_reference``, 64 samples, layers
1 2 4), and the words its one error line must hold. A damage returns the extra arguments of the export, if any.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import run_cli
from hostile_support import HOSTILE, assert_safe

ROOT = Path(__file__).resolve().parent.parent
# The datasets package the export writes with (tests/test_export_speculators.py): the cases that get as far as
# building a view meet the real writer.
SPECULATORS_ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / ".work" / "speculators-site"),
                                                               os.environ.get("PYTHONPATH")]))}

Damage = Callable[[Path, Path], list[str]]  # (the folder's copy, a scratch folder beside it) -> extra arguments
DROP = object()  # a manifest field to remove


def _manifest(folder: Path, name: str = "manifest.json") -> dict[str, Any]:
    return json.loads((folder / name).read_text())


def edit(**changes: Any) -> Damage:
    """Change fields of manifest.json (``DROP`` removes one)."""
    def damage(folder: Path, scratch: Path) -> list[str]:
        m = _manifest(folder)
        for key, value in changes.items():
            if value is DROP:
                m.pop(key, None)
            else:
                m[key] = value
        (folder / "manifest.json").write_text(json.dumps(m))
        return []
    return damage


def raw(data: bytes) -> Damage:
    """manifest.json replaced by these bytes."""
    def damage(folder: Path, scratch: Path) -> list[str]:
        (folder / "manifest.json").write_bytes(data)
        return []
    return damage


def ranks(*shares: tuple[str, dict[str, Any]]) -> Damage:
    """manifest.json replaced by rank manifests: (file name, fields over the original manifest) each."""
    def damage(folder: Path, scratch: Path) -> list[str]:
        m = _manifest(folder)
        (folder / "manifest.json").unlink()
        for name, changes in shares:
            (folder / name).write_text(json.dumps({**m, **changes}))
        return []
    return damage


def replace(name: str, make: Callable[[Path], None]) -> Damage:
    """The folder's file ``name`` (a manifest or a sample's; the first sample's for "SAMPLE") replaced by what
    ``make`` puts at its path."""
    def damage(folder: Path, scratch: Path) -> list[str]:
        path = sorted(folder.glob("hs_*.safetensors"))[0] if name == "SAMPLE" else folder / name
        path.unlink()
        make(path)
        return []
    return damage


def fifo(path: Path) -> None:
    os.mkfifo(path)


def to_dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def manifest_points_to_fifo(key: str, inside: str = "") -> Damage:
    """The manifest's ``key`` names a FIFO in the scratch folder (or a folder holding one, named ``inside``)."""
    def damage(folder: Path, scratch: Path) -> list[str]:
        target = scratch / "named"
        if inside:
            target.mkdir()
            os.mkfifo(target / inside)
        else:
            os.mkfifo(target)
        edit(**{key: str(target)})(folder, scratch)
        return ["--draft-vocab-size", "32"] if inside else []
    return damage


def prepared_arg_fifo(folder: Path, scratch: Path) -> list[str]:
    os.mkfifo(scratch / "prepared.jsonl")
    return ["--prepared-data", str(scratch / "prepared.jsonl")]


def prepared_half(folder: Path, scratch: Path) -> list[str]:
    """Prepared data with half of the samples: every row would be right, and the view short of 32 samples."""
    lines = Path(_manifest(folder)["prepared_data"]).read_text().splitlines(keepends=True)
    (scratch / "half.jsonl").write_text("".join(lines[: len(lines) // 2]))
    return ["--prepared-data", str(scratch / "half.jsonl")]


def one_sample_gone(folder: Path, scratch: Path) -> list[str]:
    sorted(folder.glob("hs_*.safetensors"))[-1].unlink()
    return []


def stray_copy(folder: Path, scratch: Path) -> list[str]:
    shutil.copy(folder / "manifest.json", folder / "manifest.old.json")
    return []


def stray_hostile_name(folder: Path, scratch: Path) -> list[str]:
    shutil.copy(folder / "manifest.json", folder / f"manifest{EVIL}.json")
    return []


EVIL = "".join(HOSTILE)  # terminal escapes and a bidi override: shown visibly, never obeyed
TWO = {"world_size": 2, "samples_total": 32}
CASES: dict[str, tuple[Damage, str]] = {
    # Wrong types and values, one field at a time: each named with what it is and what it must be.
    "world_size a string": (edit(world_size="1"), "world_size is '1', not a whole number ≥ 1"),
    "layer_ids a dict": (edit(layer_ids={"1": 1}), "layer_ids is {'1': 1}, not a list"),
    "layer_ids repeated": (edit(layer_ids=[1, 4, 4]), "not a list of distinct layer numbers"),
    "layer id beyond the model": (edit(layer_ids=[1, 2, 99]), "go beyond num_hidden_layers 4"),
    "layer id a bool": (edit(layer_ids=[True, 2, 4]), "layer_ids is [True, 2, 4]"),
    "samples_total null": (edit(samples_total=None), "samples_total is None, not a whole number ≥ 0"),
    "samples_written a list": (edit(samples_written=[64]), "samples_written is [64]"),
    "tokens_total negative": (edit(tokens_total=-1), "tokens_total is -1"),
    "model_path a number": (edit(model_path=42), "model_path is 42, not a path"),
    "prepared_data a list": (edit(prepared_data=["a"]), "prepared_data is ['a'], not null or a path"),
    "hidden_size negative": (edit(hidden_size=-128), "hidden_size is -128, not a whole number ≥ 1"),
    "max_seq_len a float": (edit(max_seq_len=512.0), "max_seq_len is 512.0"),
    "storage unknown": (edit(storage="int4"), "storage is 'int4', not one of dtype, fp8"),
    "status a number": (edit(status=1), "status is 1"),
    "status missing": (edit(status=DROP), "it has no status"),
    "finished_at a text": (edit(finished_at="soon"), "finished_at is 'soon'"),
    "terminal escapes in a field": (edit(status=EVIL), "rank 0 is '\\x1b]52;c;"),
    "an over-long text": (edit(model_path=["x" * 1_000_000]), "model_path is ['xxxxx"),
    "a huge value shown short": (edit(layer_ids=[*range(100_000), "x"]), "layer_ids is [0, 1, 2, 3,"),
    # Not a JSON object, or not JSON, or not to be read at all.
    "top level a list": (raw(b"[{}]"), "it is an array in JSON, not an object"),
    "top level null": (raw(b"null"), "it is null in JSON, not an object"),
    "invalid UTF-8": (raw(b'{"status": "\xff\xfe"}'), "is not valid JSON (UnicodeDecodeError"),
    "truncated": (raw(b'{"status": "do'), "is not valid JSON"),
    "nested past the parser": (raw(b"[" * 200_000), "is not valid JSON (RecursionError"),
    "a 50 MB manifest": (lambda f, s: os.truncate(f / "manifest.json", 50 << 20) or [], "52428800 bytes, more than"),
    "manifest a FIFO": (replace("manifest.json", fifo), "manifest.json is a named pipe (FIFO), not a manifest"),
    "manifest a link to /dev/zero": (replace("manifest.json", to_dev_zero), "is a character device, not a manifest"),
    "manifest a folder": (replace("manifest.json", Path.mkdir), "manifest.json is a folder, not a manifest"),
    "manifest a link to nothing": (replace("manifest.json", lambda p: p.symlink_to("gone.json")),
                                   "is a symbolic link to nothing ('gone.json')"),
    # Ranks and world sizes: checked against the files there, never looped over.
    "world_size 10**9 in manifest.json": (edit(world_size=10**9),
                                          "it says rank 0 of 1000000000, whose manifest is manifest.rank0.json"),
    "world_size 10**9, rank 0's file": (ranks(("manifest.rank0.json", {"world_size": 10**9})),
                                        "rank 1 of 1000000000 has no manifest yet; rank 2 of 1000000000"),
    "rank beyond the world": (ranks(("manifest.rank3.json", {**TWO, "rank": 3})), "rank 3 is not one of world_size 2"),
    "rank file says another rank": (ranks(("manifest.rank0.json", TWO), ("manifest.rank1.json", TWO)),
                                    "it says rank 0 of 2, whose manifest is manifest.rank0.json"),
    "a TP-2 run and a TP-4 run": (ranks(*[(f"manifest.rank{r}.json", {**TWO, "rank": r}) for r in (0, 1)],
                                        *[(f"manifest.rank{r}.json", {"world_size": 4, "rank": r}) for r in (2, 3)]),
                                  "disagree on world_size (manifest.rank0.json, manifest.rank1.json: 2; "
                                  "manifest.rank2.json, manifest.rank3.json: 4)"),
    "a world-1 manifest beside rank 1 of 2": (ranks(("manifest.json", {}), ("manifest.rank1.json", {**TWO, "rank": 1})),
                                              "disagree on world_size"),
    "ranks of other selections": (ranks(("manifest.rank0.json", {**TWO, "rank": 0}),
                                        ("manifest.rank1.json", {**TWO, "rank": 1, "max_samples": 10})),
                                  "disagree on max_samples"),
    "a stray manifest copy": (stray_copy, "manifest.old.json in"),
    "a manifest name with terminal escapes": (stray_hostile_name, "whose manifest is manifest.json"),
    # Counts against the disk.
    "samples_total 10**9": (edit(samples_total=10**9), "count 1000000000 samples, but it holds 64 sample files"),
    "two ranks count every sample": (ranks(("manifest.rank0.json", {**TWO, "rank": 0, "samples_total": 64}),
                                           ("manifest.rank1.json", {**TWO, "rank": 1, "samples_total": 64})),
                                     "count 128 samples, but it holds 64"),
    "a sample file gone": (one_sample_gone, "count 64 samples, but it holds 63"),
    "prepared data with half the samples": (prepared_half, "only 32 samples of"),
    # Bounded reads of everything else the export opens.
    "a sample file a FIFO": (replace("SAMPLE", fifo), "is a named pipe (FIFO), not a sample file"),
    "a sample file a link to /dev/zero": (replace("SAMPLE", to_dev_zero), "is a character device, not a sample file"),
    "a sample file a folder": (replace("SAMPLE", Path.mkdir), "is a folder, not a sample file"),
    "prepared data a FIFO": (manifest_points_to_fifo("prepared_data"), "a named pipe (FIFO), not a prepared data"),
    "--prepared-data a FIFO": (prepared_arg_fifo, "a named pipe (FIFO), not a prepared data file: pass"),
    "model config a FIFO": (manifest_points_to_fifo("model_path", inside="config.json"),
                            "named/config.json is a named pipe (FIFO), not a model's config"),
}


def snapshot(folder: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``folder``: a file's SHA-256, a link's target, or its kind; nothing but regular files is
    opened (a FIFO would hang the test)."""
    out: dict[str, tuple[Any, ...]] = {}
    for path in sorted(folder.rglob("*")):
        mode = path.lstat().st_mode
        if stat.S_ISREG(mode):
            out[str(path.relative_to(folder))] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
        elif stat.S_ISLNK(mode):
            out[str(path.relative_to(folder))] = ("link", os.readlink(path))
        else:
            out[str(path.relative_to(folder))] = ("kind", stat.S_IFMT(mode))
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_folders_are_refused_in_one_line_and_left_as_they_were(hf_reference, tmp_path, case):
    damage, expected = CASES[case]
    folder, scratch = tmp_path / "out", tmp_path / "scratch"
    shutil.copytree(hf_reference, folder, symlinks=True)
    scratch.mkdir()
    extra = damage(folder, scratch)
    before = snapshot(folder)
    proc = run_cli("export", "--format", "speculators", folder, *extra, env=SPECULATORS_ENV, timeout=120)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "train with" not in proc.stdout, proc.stdout + proc.stderr
    assert len(lines) == 1 and lines[0].startswith("eaglewatch export: error: "), proc.stderr
    assert expected in lines[0], lines[0]
    assert len(lines[0]) < 600, lines[0]
    assert_safe(proc.stdout, what="stdout")
    assert_safe(proc.stderr, what="stderr")
    assert snapshot(folder) == before, "a refused export changed the folder"


def test_the_undamaged_copy_exports(hf_reference, tmp_path):
    """The rows above fail for their damage alone: the same copy, undamaged, exports."""
    folder = tmp_path / "out"
    shutil.copytree(hf_reference, folder)
    proc = run_cli("export", folder, env=SPECULATORS_ENV, timeout=300)
    assert proc.returncode == 0 and "train with: " in proc.stdout, proc.stderr
