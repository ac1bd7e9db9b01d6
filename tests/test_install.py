"""The README's install lines, in clean environments: the operator side from a checkout and from the wheel that
``./run wheel`` builds. It starts and talks to a host with no torch, vLLM or Textual needed to start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def clean_env(folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, timeout=300)
    return folder / "bin"


def pip_install(bin_dir: Path, target: str) -> None:
    proc = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           target], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def check_operator_side(bin_dir: Path, tmp_path: Path) -> None:
    eaglewatch = str(bin_dir / "eaglewatch")
    version = subprocess.run([eaglewatch, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("eaglewatch "), version.stderr
    # The agent starts locally from the installed package and answers: the runs of an empty run root.
    runs = subprocess.run([eaglewatch, "runs", "local", "--run-root", str(tmp_path / "runs")], capture_output=True,
                          text=True, timeout=120, env={"HOME": str(tmp_path), "PATH": str(bin_dir),
                                                       "EAGLEWATCH_CONFIG": ""})
    assert runs.returncode == 0, runs.stderr
    log = tmp_path / "job.log"
    log.write_text("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                   "AssertionError: block_hashes\n")
    decoded = subprocess.run([eaglewatch, "decode", str(log)], capture_output=True, text=True, timeout=60)
    assert decoded.returncode in (0, 1) and "AssertionError" in decoded.stdout, decoded.stderr
    # The operator side needs no torch and no vLLM.
    for heavy in ("torch", "vllm"):
        probe = subprocess.run([str(bin_dir / "python"), "-c", f"import {heavy}"], capture_output=True)
        assert probe.returncode != 0, f"{heavy} came with the operator side"
    # The agent bundle is built from the installed package, with the GPU side in it.
    listed = subprocess.run([str(bin_dir / "python"), "-c", "from eaglewatch.tui.connection import bundle;"
                             "print('\\n'.join(n for n, _ in bundle._files()))"], capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert "eaglewatch/pipeline/extract.py" in listed.stdout.split()


def test_operator_side_from_a_checkout(tmp_path):
    bin_dir = clean_env(tmp_path / "env")
    pip_install(bin_dir, f"{ROOT}[tui]")
    check_operator_side(bin_dir, tmp_path)


def test_operator_side_from_the_wheel(tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                            str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("eaglewatch-*.whl")
    bin_dir = clean_env(tmp_path / "env")
    pip_install(bin_dir, f"{wheel}[tui]")
    check_operator_side(bin_dir, tmp_path)
