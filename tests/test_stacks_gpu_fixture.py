"""Stacks of a real vLLM engine while it loads, taken on an H200 (bench/gpu_stacks_loading.py: a Kimi-K2.5-like
miniature, DeepseekV3 with MLA, MoE and INT4 weights, extracted by a run the agent launched, in a fresh HOME; its
stacks taken every 5 s while the run's phase was `loading`, which lasted 294 s). The JSON is what the agent's
`stacks` returned; the .txt beside it what `eaglewatch stacks --all-threads` printed there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglewatch.decode.stackgroups import group, report, summary

FIXTURE = Path(__file__).parent / "fixtures" / "gpu" / "h200_stacks_loading_1203"


def taken(n: int) -> dict:
    return json.loads((FIXTURE / f"stacks-{n:02d}.json").read_text())


@pytest.mark.parametrize("n", [10, 20, 34, 45, 55, 57])
def test_every_taking_names_the_client_and_the_engine_core(n):
    stacks = taken(n)
    assert "faulthandler" in stacks["methods"]
    groups = group(stacks["processes"])
    by_role = {g.role: g for g in groups}
    assert "main" in by_role
    assert "wait_for_engine_startup" in by_role["main"].where or n >= 55  # the client waits while the engine loads
    if n >= 20:
        assert "EngineCore" in by_role
        assert all(record["threads"] for record in by_role["EngineCore"].processes)
    lines = report(stacks, all_threads=True)
    assert lines[0].endswith(", ".join(stacks["methods"])) or "by " in lines[0]
    assert summary(groups)


def test_the_cold_engine_was_compiling_flashinfer_with_nvcc_during_the_load():
    """What a silent cold start spends its minutes on: the engine core waits on ninja, which runs nvcc."""
    stacks = taken(34)
    groups = group(stacks["processes"])
    engine = next(g for g in groups if g.role == "EngineCore")
    assert "run_ninja (cpp_ext.py:" in engine.where
    assert any(f["func"] == "get_sampling_module" for f in engine.frames)
    native = [g for g in groups if not g.has_stack]
    commands = " ".join(record["cmdline"] for g in native for record in g.processes)
    assert "ninja" in commands and "nvcc" in commands
    assert all(record["method"] == "proc" and record["state"] for g in native for record in g.processes)


def test_the_engine_core_in_the_marlin_moe_kernel_during_the_profile_run():
    engine = next(g for g in group(taken(20)["processes"]) if g.role == "EngineCore")
    assert any("fused_marlin_moe" == f["func"] for f in engine.frames)
