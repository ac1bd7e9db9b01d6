"""The package layout and the promise that the operator side needs no torch, vLLM or Textual to start."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAPPED = {"eaglewatch": "eaglewatch", "tui": "eaglewatch.tui", "pipeline": "eaglewatch.pipeline",
          "assets": "eaglewatch.assets"}

BLOCK_HEAVY = (
    "import sys\n"
    "class Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in {'torch', 'vllm', 'transformers', 'textual'}:\n"
    "            raise ImportError(f'{name} is blocked in this test')\n"
    "sys.meta_path.insert(0, Block())\n"
)


def test_every_subpackage_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    found = set()
    for folder, package in MAPPED.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]))
    assert found - listed == set(), f"add these to [tool.setuptools] packages: {sorted(found - listed)}"


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
