"""Shared fixtures. Models are built once per test session with the project's own tiny-model factory."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_cluster import slurm_cluster  # noqa: F401  (session fixture: one cluster for tests/test_slurm_*.py)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
EAGLEWATCH = [sys.executable, "-m", "eaglewatch"]

# The seed of every random choice the tests make (the resume tests' kill points): EAGLEWATCH_TEST_SEED when set,
# else a fresh one, shown in the run's header so that a failing run can be repeated with the same choices.
TEST_SEED = int(os.environ.get("EAGLEWATCH_TEST_SEED") or random.SystemRandom().randrange(1 << 32))
# The workers of ./run test (pytest-xdist) start from this process's environment: they take the seed shown here.
os.environ["EAGLEWATCH_TEST_SEED"] = str(TEST_SEED)


def pytest_addoption(parser) -> None:
    parser.addoption("--update-goldens", action="store_true", default=False,
                     help="rewrite the golden files of the example tests (tests/fixtures/shapes/*.golden.json) "
                          "from what the code decodes now")


def pytest_report_header(config) -> str:
    return f"EAGLEWATCH_TEST_SEED={TEST_SEED}"


# How much a test of each mark weighs when modules are ordered (an engine start is tens of seconds, an ssh test a
# few): the measured per-test durations are in docs/CONTRIBUTING.md.
HEAVY_MARKS = {"vllm": 4, "slurm": 3, "slow": 2, "ssh": 1}


def pytest_collection_modifyitems(session, config, items) -> None:
    """Modules with the most engine, Slurm, SSH and slow tests first, the rest in their usual order.

    ``./run test`` hands whole modules to two workers (pytest-xdist, ``--dist loadfile --no-loadscope-reorder``, which
    keeps this order); started last, a heavy module would leave the other worker idle for its last minutes."""
    heavy: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        heavy[module] = heavy.get(module, 0) + max(
            (weight for mark, weight in HEAVY_MARKS.items() if item.get_closest_marker(mark)), default=0)
    items.sort(key=lambda item: -heavy[item.nodeid.split("::")[0]])


def seeded_rng(name: str) -> random.Random:
    """A generator of its own for one test, from the run's seed and the test's name: a rerun with the same seed
    makes the same choices for that test, whichever tests run with it."""
    return random.Random(f"{TEST_SEED}:{name}")


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 600, cwd: str | None = None
            ) -> subprocess.CompletedProcess:
    """Run the real ``eaglewatch`` command in a subprocess, as an operator would."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([*EAGLEWATCH, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=full_env, cwd=cwd)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A float32 Llama: hidden 128, 4 layers, 4 heads, 2 KV heads, in 8 safetensors shards."""
    pytest.importorskip("torch")
    from eaglewatch.pipeline.tiny_model import BASE_CONFIGS, make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "llama", dict(BASE_CONFIGS["llama"]), shards=8)


@pytest.fixture(scope="session")
def tiny_int4_llama(tmp_path_factory) -> Path:
    """A dense Llama with every Linear but lm_head INT4 pack-quantized (compressed-tensors), bf16, 2 shards."""
    out = tmp_path_factory.mktemp("models") / "int4-llama"
    proc = run_cli("make-tiny-model", "--arch", "llama", "--quantization", "int4", "--dtype", "bfloat16",
                   "--platform", "cpu", "--shards", "2", "--out", out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "INT4 pack-quantized" in proc.stdout
    return out


@pytest.fixture(scope="session")
def prepared_data(tiny_llama, tmp_path_factory) -> Path:
    """The bundled chat data, tokenized for the tiny Llama (64 samples)."""
    from eaglewatch.assets import SAMPLE_CHAT_DATA
    from eaglewatch.pipeline.prepare import load_tokenizer, prepare

    out = tmp_path_factory.mktemp("data") / "prepared.jsonl"
    prepare(SAMPLE_CHAT_DATA, out, load_tokenizer(str(tiny_llama)), max_length=512)
    return out


@pytest.fixture(scope="session")
def hf_reference(tiny_llama, prepared_data, tmp_path_factory) -> Path:
    """An uninterrupted HF-engine extraction (layers 1 2 4), the reference other runs are compared with."""
    out = tmp_path_factory.mktemp("hf-ref")
    proc = run_cli("extract", "--engine", "hf", "--model-path", tiny_llama, "--prepared-data", prepared_data,
                   "--output-dir", out, "--layer-ids", "1", "2", "4", "--batch-size", "8", "--max-seq-len", "512")
    assert proc.returncode == 0, proc.stderr
    return out


def read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_outputs(folder: Path) -> dict[str, dict]:
    from safetensors.torch import load_file

    return {p.name: load_file(str(p)) for p in sorted(folder.glob("hs_*.safetensors"))}


def file_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("hs_*.safetensors"))}
