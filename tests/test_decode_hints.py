"""The hint table: one case per row, run through the whole decoder, and a check that no row is untested."""

from __future__ import annotations

import pytest

from eaglewatch.decode.decoder import decode_bytes
from eaglewatch.decode.hints import RULES, Hint
from eaglewatch.decode.rootcause import FailureGroup

SP = "/opt/venv/lib/python3.12/site-packages"


def worker_traceback(frames: list[tuple[str, int, str, str]], last: str, lane: str = "Worker_TP0 pid=11") -> bytes:
    """A traceback logged by a vLLM worker, header on every line."""
    lines = ["WorkerProc hit an exception.", "Traceback (most recent call last):"]
    for path, line, func, source in frames:
        lines += [f'  File "{path}", line {line}, in {func}', f"    {source}"]
    lines.append(last)
    head = f"({lane}) ERROR 11-30 01:29:02 [multiproc_executor.py:1063] "
    return "".join(head + line + "\n" for line in lines).encode()


def plain_traceback(frames: list[tuple[str, int, str, str]], last: str) -> bytes:
    lines = ["Traceback (most recent call last):"]
    for path, line, func, source in frames:
        lines += [f'  File "{path}", line {line}, in {func}', f"    {source}"]
    lines.append(last)
    return ("\n".join(lines) + "\n").encode()


VLLM_FRAME = (f"{SP}/vllm/v1/worker/gpu_worker.py", 362, "execute_model", "output = self.model_runner.execute_model()")
USER_FRAME = ("/srv/eagle/scripts/run_vllm.py", 44, "main", "llm = LLM(**kw)")
ENGINE_LINE = (b"(EngineCore pid=5) INFO 11-30 01:00:00 [core.py:116] Initializing a V1 LLM engine (v0.26.0) with "
               b"config: tensor_parallel_size=2\n")

# (row id, log bytes, expected figures (subset))
CASES: list[tuple[str, bytes, dict[str, str]]] = [
    ("spawn_main_guard", plain_traceback(
        [("/usr/lib/python3.12/multiprocessing/spawn.py", 140, "_check_not_importing_main", "raise RuntimeError('''")],
        "RuntimeError: \n        An attempt has been made to start a new process before the\n"
        "        current process has finished its bootstrapping phase."), {}),
    ("vllm_51016_page_size", ENGINE_LINE + worker_traceback(
        [(f"{SP}/vllm/v1/kv_cache_interface.py", 97, "page_size_bytes",
          "assert self.page_size_padded >= real_page_size")],
        "AssertionError"), {"vllm_version": "0.26.0", "tensor_parallel_size": "2"}),
    # The same assertion as vLLM 0.26.0's source spells it.
    ("vllm_51016_page_size", ENGINE_LINE + worker_traceback(
        [(f"{SP}/vllm/v1/kv_cache_interface.py", 199, "page_size_bytes",
          "assert self.page_size_padded >= self.unpadded_page_size_bytes")],
        "AssertionError"), {"vllm_version": "0.26.0", "tensor_parallel_size": "2"}),
    ("block_hashes_assertion", worker_traceback(
        [(f"{SP}/vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py", 287,
          "build_connector_meta", "assert request.block_hashes, 'no block hashes'")], "AssertionError"), {}),
    ("weight_shape_mismatch", worker_traceback(
        [(f"{SP}/vllm/model_executor/models/llama.py", 461, "load_weights", "return loader.load_weights(weights)"),
         (f"{SP}/vllm/model_executor/model_loader/weight_utils.py", 612, "default_weight_loader",
          "raise ValueError(")],
        "ValueError: Attempted to load weight (torch.Size([4096, 128])) into parameter (torch.Size([2048, 128]))"),
     {"checkpoint_shape": "4096, 128", "parameter_shape": "2048, 128"}),
    ("safetensors_shard", worker_traceback(
        [(f"{SP}/vllm/model_executor/model_loader/weight_utils.py", 512, "safetensors_weights_iterator",
          'with safe_open(st_file, framework="pt") as f:')],
        "safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge"), {}),
    ("pin_memory_without_gpu", worker_traceback(
        [VLLM_FRAME], "RuntimeError: pin_memory=True requires a CUDA or other accelerator backend"), {}),
    ("cuda_oom", worker_traceback(
        [VLLM_FRAME], "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 3 has a total "
        "capacity of 79.15 GiB of which 6.88 MiB is free. Including non-PyTorch memory, this process has 79.14 GiB "
        "memory in use."),
     {"requested": "20.00 MiB", "total": "79.15 GiB", "free": "6.88 MiB", "in_use": "79.14 GiB", "gpu": "3"}),
    ("cuda_kernel_error", worker_traceback(
        [VLLM_FRAME], "RuntimeError: CUDA error: device-side assert triggered\nCUDA kernel errors might be "
        "asynchronously reported at some other API call."), {"cuda_error": "device-side assert triggered"}),
    ("cuda_unavailable", plain_traceback(
        [USER_FRAME], "RuntimeError: No CUDA GPUs are available"), {}),
    ("model_not_found", plain_traceback(
        [USER_FRAME], "OSError: /srv/models/llama does not appear to have a file named config.json. Checkout "
        "'https://huggingface.co//srv/models/llama/tree/None' for available files."), {}),
    ("startup_memory_check", worker_traceback(
        [VLLM_FRAME], "ValueError: Free memory on device (70.1/79.2 GiB) on startup is less than desired GPU memory "
        "utilization (0.9, 71.3 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."),
     {"free_gib": "70.1", "total_gib": "79.2", "utilization": "0.9", "wanted_gib": "71.3"}),
    ("kv_cache_too_small", worker_traceback(
        [VLLM_FRAME], "ValueError: To serve at least one request with the models's max seq len (32768), (4.00 GiB "
        "KV cache is needed, which is larger than the available KV cache memory (2.10 GiB)."),
     {"max_model_len": "32768", "needed": "4.00 GiB", "available": "2.10 GiB"}),
    ("cpu_oom", plain_traceback([USER_FRAME], "MemoryError"), {}),
    ("cpu_oom", plain_traceback(
        [USER_FRAME], "RuntimeError: [enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: not enough "
        "memory: you tried to allocate 8589934592 bytes."), {"requested_bytes": "8589934592"}),
    ("disk_full", plain_traceback(
        [USER_FRAME], "OSError: [Errno 28] No space left on device: '/srv/eagle/hs_out/hs_9.safetensors'"),
     {"path": "/srv/eagle/hs_out/hs_9.safetensors"}),
    ("collective_comm", worker_traceback(
        [VLLM_FRAME], "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
        "[10.0.0.2]:4242"), {}),
    ("vllm_api_mismatch", plain_traceback(
        [USER_FRAME, (f"{SP}/vllm/entrypoints/llm.py", 285, "__init__", "engine_args = EngineArgs(")],
        "TypeError: EngineArgs.__init__() got an unexpected keyword argument 'speculative_model'"),
     {"argument": "speculative_model", "callable": "EngineArgs.__init__"}),
    ("vllm_api_mismatch", plain_traceback(
        [USER_FRAME], "TypeError: LLM.generate() got an unexpected keyword argument 'prompt_token_ids'"),
     {"argument": "prompt_token_ids"}),
    ("vllm_api_mismatch", plain_traceback(
        [USER_FRAME], "AttributeError: module 'vllm.v1.engine' has no attribute 'EngineCoreRequest'"),
     {"attribute": "EngineCoreRequest"}),
    ("vllm_api_mismatch", plain_traceback(
        [USER_FRAME, (f"{SP}/vllm/model_executor/models/llama.py", 200, "__init__", "self.rope = config.rope_scaling")],
        "AttributeError: 'LlamaConfigX' has no attribute 'rope_scaling'"), {"attribute": "rope_scaling"}),
    ("vllm_api_mismatch", plain_traceback(
        [USER_FRAME], "ImportError: cannot import name 'HiddenStatesConnector' from 'vllm.distributed.kv_transfer' "
        "(/opt/venv/lib/python3.12/site-packages/vllm/distributed/kv_transfer/__init__.py)"),
     {"name": "HiddenStatesConnector", "module": "vllm.distributed.kv_transfer"}),
    ("killed_sigkill", b"(EngineCore pid=5) ERROR 05-01 12:01:10 [multiproc_executor.py:154] Worker proc "
     b"VllmWorker-1 died unexpectedly (exitcode=-9), shutting down executor.\n", {"signal": "SIGKILL"}),
    ("killed_signal", b"./run.sh: line 3: 4242 Segmentation fault      (core dumped) python extract.py\n",
     {"signal": "SIGSEGV"}),
    ("killed_signal", b"Command terminated by signal 15\n", {"signal": "SIGTERM"}),
    ("died_without_traceback", b"(EngineCore pid=5) ERROR 05-01 12:01:10 [multiproc_executor.py:154] Worker proc "
     b"VllmWorker-0 died unexpectedly, shutting down executor.\n", {}),
]


def root(data: bytes) -> FailureGroup:
    _, state = decode_bytes(data)
    failures = state.failures_ranked()
    assert failures, data
    return failures[0]


@pytest.mark.parametrize(("row_id", "data", "figures"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_hint_row(row_id: str, data: bytes, figures: dict[str, str]) -> None:
    hint = root(data).hint
    assert isinstance(hint, Hint) and hint.id == row_id
    assert hint.title and hint.text
    for key, value in figures.items():
        assert hint.figures.get(key) == value, (key, hint.figures)


def test_every_row_has_a_case() -> None:
    rows = set()
    for _, data, _ in CASES:
        hint = root(data).hint
        assert hint is not None
        rows.add(hint.row)
    untested = [(i, RULES[i].id) for i in range(len(RULES)) if i not in rows]
    assert not untested, f"rows without a test case: {untested}"


@pytest.mark.parametrize(
    "data",
    [
        plain_traceback([USER_FRAME], "KeyError: 'layer_ids'"),
        # An unexpected keyword in the operator's own function says nothing about vLLM.
        plain_traceback([USER_FRAME], "TypeError: write_sample() got an unexpected keyword argument 'dtype'"),
        plain_traceback([USER_FRAME], "AssertionError: shapes agree"),
    ],
)
def test_no_hint_for_unknown_failures(data: bytes) -> None:
    assert root(data).hint is None
