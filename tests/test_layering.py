"""The layering rules of docs/CONTRIBUTING.md, ruff and mypy, checked on every test run.

The contracts live in pyproject.toml (``[tool.importlinter]``); these tests run the real tools on the tree, then on
a copy of it with one violation planted, to show that each check can fail.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# What the shared modules may import besides the standard library.
SHARED = ("eaglewatch.decode", "eaglewatch.protocol", "eaglewatch.errors", "eaglewatch.safetext")


def _tool(name: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH puts the tree being checked ahead of the installed (editable) package.
    return subprocess.run(
        [str(BIN / name), *args], cwd=cwd, capture_output=True, text=True, timeout=300,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "PYTHONPATH": str(cwd), "HOME": str(cwd)},
    )


def _copy_tree(dest: Path) -> Path:
    """The package's sources and pyproject.toml, with the eaglewatch/ links kept as links."""
    for name in ("eaglewatch", "tui", "pipeline", "assets"):
        shutil.copytree(ROOT / name, dest / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _plant(tree: Path, relative: str, code: str) -> None:
    target = tree / relative
    target.write_text(target.read_text() + "\n\n" + code + "\n")


def test_import_contracts_hold():
    proc = _tool("lint-imports")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "BROKEN" not in proc.stdout and "0 broken" in proc.stdout


def test_ruff_is_clean():
    proc = _tool("ruff", "check", "--no-cache", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_is_clean(tmp_path):
    proc = _tool("mypy", "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shared_modules_import_only_the_standard_library():
    graph = grimp.build_graph("eaglewatch", include_external_packages=True, cache_dir=None)
    shared = set()
    for name in SHARED:
        shared |= {name, *graph.find_descendants(name)} if graph.find_children(name) else {name}
    outside = {}
    for module in sorted(shared):
        for imported in graph.find_modules_directly_imported_by(module):
            top = imported.split(".")[0]
            if imported.startswith(SHARED) or top in sys.stdlib_module_names:
                continue
            outside.setdefault(module, []).append(imported)
    assert outside == {}


@pytest.mark.parametrize(
    "relative, code, contract",
    [
        # The GPU side reaching for Textual, inside a function where a quick reading would miss it.
        ("pipeline/verify.py", "def _show():\n    import textual\n    return textual",
         "The GPU side imports neither Textual nor paramiko"),
        # The operator side reaching for torch.
        ("tui/runstate/fmt.py", "def _tensor():\n    import torch\n    return torch",
         "The operator side imports neither torch nor vLLM"),
        # A widget opening the connection.
        ("tui/app/widgets/render.py", "def _peek():\n    from eaglewatch.tui import connection\n    return connection",
         "Widgets never touch the connection or the IO loop"),
        # The decoder depending on the operator side.
        ("eaglewatch/decode/report.py", "def _ui():\n    from eaglewatch.tui import runstate\n    return runstate",
         "Top level"),
        # A cycle between two sibling modules of the GPU side.
        ("pipeline/prepared_data.py", "def _back():\n    from eaglewatch.pipeline import verify\n    return verify",
         "No import cycles"),
    ],
)
def test_a_planted_violation_breaks_the_import_contracts(tmp_path, relative, code, contract):
    tree = _copy_tree(tmp_path / "tree")
    _plant(tree, relative, code)
    proc = _tool("lint-imports", cwd=tree)
    assert proc.returncode != 0, proc.stdout
    broken = proc.stdout.split("Broken contracts")[-1]
    assert contract in broken, proc.stdout


def test_a_planted_lint_error_fails_ruff(tmp_path):
    tree = _copy_tree(tmp_path / "tree")
    _plant(tree, "tui/runstate/fmt.py", "def _unused():\n    import json\n    return None")
    proc = _tool("ruff", "check", "--no-cache", ".", cwd=tree)
    assert proc.returncode != 0
    assert "F401" in proc.stdout


def test_a_planted_type_error_fails_mypy(tmp_path):
    tree = _copy_tree(tmp_path / "tree")
    _plant(tree, "eaglewatch/decode/lines.py", "def _width() -> int:\n    return 'wide'")
    proc = _tool("mypy", "--cache-dir", str(tmp_path / "cache"), cwd=tree)
    assert proc.returncode != 0
    assert "lines.py" in proc.stdout and "return-value" in proc.stdout
