"""The package layout and the promise that the operator side needs no torch, vLLM or Textual to start."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BLOCK_HEAVY = (
    "import sys\n"
    "class Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in {'torch', 'vllm', 'transformers', 'textual'}:\n"
    "            raise ImportError(f'{name} is blocked in this test')\n"
    "sys.meta_path.insert(0, Block())\n"
)


def test_the_links_make_one_package_tree():
    """eaglewatch/tui, eaglewatch/pipeline and eaglewatch/assets are the top-level folders, not copies."""
    for name in ("tui", "pipeline", "assets"):
        link = ROOT / "eaglewatch" / name
        assert link.is_symlink() and link.resolve() == (ROOT / name).resolve()


def test_the_wheel_holds_every_module_and_the_assets(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path),
         str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("eaglewatch-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {"eaglewatch/assets/dashboard.tcss", "eaglewatch/assets/data/sample_chat.jsonl"}
    for top in ("eaglewatch", "tui", "pipeline"):
        for source in (ROOT / top).rglob("*.py"):
            if "__pycache__" in source.parts:
                continue
            rel = source.relative_to(ROOT / top)
            prefix = ("eaglewatch",) if top == "eaglewatch" else ("eaglewatch", top)
            expected.add("/".join([*prefix, *rel.parts]))
    assert expected - names == set()
    assert not any(name.startswith(("tests/", "bench/", "tui/", "pipeline/")) for name in names)


def test_cli_help_and_light_subcommands_start_without_heavy_packages():
    code = BLOCK_HEAVY + (
        "from eaglewatch import cli, protocol\n"
        "import eaglewatch.tui, eaglewatch.pipeline\n"
        "parser = cli.build_parser()\n"
        "names = sorted(parser._subparsers._group_actions[0].choices)\n"
        "print(' '.join(names))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    names = proc.stdout.split()
    for expected in ("prepare", "extract", "verify", "make-tiny-model"):
        assert expected in names


def test_extract_validation_needs_no_engine(tmp_path):
    """A bad invocation is rejected before torch or vLLM would even be imported."""
    code = BLOCK_HEAVY + (
        "from eaglewatch.cli import main\n"
        f"sys.exit(main(['extract', '--model-path', {str(tmp_path / 'nope')!r}, '--prepared-data', 'x.jsonl',"
        f" '--output-dir', {str(tmp_path / 'out')!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr
