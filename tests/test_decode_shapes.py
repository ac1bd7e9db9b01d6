"""Shapes of real pasted logs, each in a few lines: parts of tracebacks, prefixes, wrappers, native failures,
confidence, and failures shown at once (provisional) and then refined."""

from __future__ import annotations

from eaglewatch.decode import Decoder, FailureGroup, ProvisionalFailure, TracebackEvent, decode_bytes
from eaglewatch.decode.events import LineEvent
from eaglewatch.decode.exclass import class_from_message
from eaglewatch.decode.report import render_text, to_dict

SP = "/usr/local/lib/python3.12/dist-packages"


def root_of(text: str) -> FailureGroup:
    _, state = decode_bytes(text.encode())
    failures = state.failures_ranked()
    assert failures, "no failure"
    return failures[0]


def test_unprefixed_header_joins_the_prefixed_frames_of_the_next_lines() -> None:
    head = "(Worker_DP0_TP8_EP8 pid=844) ERROR 2025-10-25 15:32:13.272 [multiproc_executor.py:703] "
    text = (
        f"{head}WorkerProc hit an exception.\n"
        "Traceback (most recent call last):\n"
        f'{head}  File "{SP}/vllm/v1/executor/multiproc_executor.py", line 698, in worker_busy_loop\n'
        f"{head}    output = func(*args, **kwargs)\n"
        f'{head}  File "{SP}/vllm/v1/worker/gpu_worker.py", line 447, in execute_model\n'
        f"{head}    output = self.model_runner.execute_model(scheduler_output)\n"
        f"{head}torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0\n"
        "(EngineCore_DP0 pid=700) INFO 10-25 15:32:14 [core.py:1] shutting down\n"
    )
    _, state = decode_bytes(text.encode())
    (root,) = state.failures_ranked()  # no "incomplete traceback" left behind in main
    assert root.exc_type == "torch.OutOfMemoryError" and root.lanes == ["Worker_DP0_TP8_EP8"]
    assert root.innermost is not None and root.innermost.function == "execute_model"
    assert root.basis == "header and frames joined across lanes" and root.confidence == "likely"
    assert root.first.text.startswith("Traceback (most recent call last):")


def test_prefixed_header_and_frames_without_prefix() -> None:
    text = (
        "(EngineCore_DP0 pid=7) ERROR 10-25 15:32:13 [core.py:710] Traceback (most recent call last):\n"
        f'  File "{SP}/vllm/v1/engine/core.py", line 701, in run_engine_core\n'
        "    engine_core = EngineCoreProc(*args, **kwargs)\n"
        "ValueError: To serve at least one request with the models's max seq len (8192), (1.0 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (0.5 GiB).\n"
    )
    root = root_of(text)
    assert root.exc_type == "ValueError" and root.lanes == ["EngineCore_DP0"]
    assert root.hint is not None and root.hint.id == "kv_cache_too_small"


def test_message_and_traceback_on_one_logger_line() -> None:
    head = "(EngineCore pid=3) ERROR 10-25 15:32:13 [core.py:1] "
    text = (
        f"{head}EngineCore failed to start. Traceback (most recent call last):\n"
        f'{head}  File "{SP}/vllm/v1/engine/core.py", line 12, in start\n'
        f"{head}    self.load()\n"
        f"{head}KeyError: 'model.layers.0.mlp.experts.w13_weight'\n"
    )
    root = root_of(text)
    assert root.exc_type == "KeyError" and root.first.context == "EngineCore failed to start."
    assert root.confidence == "certain"


def test_ray_task_header_stands_for_the_traceback_line() -> None:
    text = (
        "ray.exceptions.RayTaskError(AssertionError): ray::WorkerDict.actor_rollout_generate_sequences() "
        "(pid=2345, ip=10.0.0.7, actor_id=abc, repr=<verl.single_controller.ray.base.WorkerDict object>)\n"
        f'  File "{SP}/verl/workers/rollout/vllm_rollout.py", line 220, in generate_sequences\n'
        "    assert len(outputs) == batch_size\n"
        "AssertionError: expected 64 outputs, got 32\n"
    )
    root = root_of(text)
    assert root.exc_type == "AssertionError" and root.message == "expected 64 outputs, got 32"
    assert root.innermost is not None and root.innermost.function == "generate_sequences"


def test_launcher_prefix_in_front_of_vllms() -> None:
    text = ("2025-11-02 10:00:01 [Error] (Process) (EngineCore pid=5511) torch.OutOfMemoryError: CUDA out of "
            "memory. Tried to allocate 1.02 GiB. GPU 3 has a total capacity of 79.1 GiB of which 312.00 MiB is free.\n")
    root = root_of(text)
    assert root.exc_type == "torch.OutOfMemoryError" and root.lanes == ["EngineCore"]
    assert root.hint is not None and root.hint.id == "cuda_oom" and root.hint.figures["requested"] == "1.02 GiB"
    assert root.basis == "exception line without traceback header"


def test_message_logged_alone_before_a_cut_traceback() -> None:
    text = (
        "ERROR 10-25 15:32:13 [engine.py:160] RuntimeError('CUDA error: an illegal memory access')\n"
        "ERROR 10-25 15:32:13 [engine.py:161] RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "Process SpawnProcess-1:\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3.12/multiprocessing/process.py", line 314, in _bootstrap\n'
        "    self.run()\n"
    )
    _, state = decode_bytes(text.encode())
    root, cut = state.failures_ranked()
    assert root.exc_type == "RuntimeError" and "illegal memory access was encountered" in root.message
    assert not cut.first.complete and cut.confidence == "guess"


def test_quoted_exception_line_and_its_traceback_are_one_failure() -> None:
    tb = (
        "Traceback (most recent call last):\n"
        '  File "/srv/train.py", line 40, in <module>\n'
        "    main()\n"
        "ValueError: tokenizer has no chat template\n"
    )
    _, state = decode_bytes(("**ValueError: tokenizer has no chat template**\n\n" + tb).encode())
    (root,) = state.failures_ranked()
    assert root.exc_type == "ValueError" and root.innermost is not None and root.count == 2
    assert root.line_no == 0  # where it first shows


def test_double_spaced_paste_and_markdown() -> None:
    lines = ["`Traceback (most recent call last):", '  File "/srv/run.py", line 3, in <module>', "    load()",
             '  File "/srv/run.py", line 1, in load', "    return json.load(f)",
             "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)`"]
    root = root_of("\n\n".join(lines) + "\n")
    assert root.exc_type == "json.decoder.JSONDecodeError" and root.confidence == "certain"
    assert [f.function for f in root.first.frames] == ["<module>", "load"]


def test_abort_that_reports_the_workers_exception_ranks_below_it() -> None:
    text = (
        "[rank0]: terminate called after throwing an instance of 'c10::DistBackendError'\n"
        "[rank0]:   what():  [PG ID 0 PG GUID 0(default_pg) Rank 0] Process group watchdog thread terminated with "
        "exception: CUDA error: an illegal memory access was encountered\n"
        "[rank0]: Exception raised from c10_cuda_check_implementation at /pytorch/c10/cuda/CUDAException.cpp:43 "
        "(most recent call first):\n"
        "(VllmWorker rank=1 pid=12) ERROR 05-12 19:01:18 [multiproc_executor.py:470]   File \"/x/vllm/model.py\", "
        "line 9, in forward\n"
        "(VllmWorker rank=1 pid=12) ERROR 05-12 19:01:18 [multiproc_executor.py:470]     return F.gelu(x)\n"
        "(VllmWorker rank=1 pid=12) ERROR 05-12 19:01:18 [multiproc_executor.py:470] RuntimeError: CUDA error: an "
        "illegal memory access was encountered\n"
    )
    _, state = decode_bytes(text.encode())
    failures = state.failures_ranked()
    assert failures[0].exc_type == "RuntimeError" and failures[0].lanes == ["VllmWorker rank=1"]
    assert failures[1].first.kind == "abort" and failures[1].tier == 2


def test_fatal_error_at_shutdown_is_never_the_root_after_an_exception() -> None:
    text = (
        "RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
        "Fatal Python error: Aborted\n\nThread 0x00007f (most recent call first):\n"
        '  File "/usr/lib/python3.12/threading.py", line 355 in wait\n'
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):\n"
        '  File "/usr/lib/python3.12/weakref.py", line 9 in __call__\n'
    )
    _, state = decode_bytes(text.encode())
    failures = state.failures_ranked()
    assert failures[0].exc_type == "RuntimeError"
    assert all(g.tier >= 1 for g in failures[1:])


def test_memory_monitor_kill_is_the_root_and_actor_died_its_consequence() -> None:
    text = (
        "(raylet) [2025-03-01 10:00:00,123 E 411 411] (raylet) node_manager.cc:3069: 1 Workers (tasks / actors) "
        "killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: 6e1f, IP: "
        "10.0.0.3) over the last time period.\n"
        "Traceback (most recent call last):\n"
        f'  File "{SP}/ray/_private/worker.py", line 2771, in get\n'
        "    raise value\n"
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
    )
    root = root_of(text)
    assert root.first.signal == "SIGKILL" and "memory pressure (OOM)" in root.message
    assert root.hint is not None and root.hint.id == "killed_sigkill"


def test_watchdog_reports_of_several_ranks_on_one_line() -> None:
    text = (
        "[rank1]:[E1012 10:10:10.1 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=77, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600023 "
        "milliseconds before timing out.[rank0]:[E1012 10:10:10.1 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog "
        "caught collective operation timeout: WorkNCCL(SeqNum=77, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
        "Timeout(ms)=600000) ran for 600031 milliseconds before timing out.\n"
    )
    root = root_of(text)
    assert root.first.kind == "watchdog" and root.exc_type == "NCCL watchdog timeout"
    assert root.spread == 2 and "SeqNum=77, OpType=ALLREDUCE" in root.message
    assert root.hint is not None and root.hint.id == "collective_comm"


def test_a_python_exception_outranks_the_watchdog_timeouts_it_causes() -> None:
    text = (
        "[rank1]:[E1012 10:20:10.1 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=9, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600023 "
        "milliseconds before timing out.\n"
        "[rank0]: ValueError: sample 1234 has no assistant turn\n"
    )
    assert root_of(text).exc_type == "ValueError"


def test_native_cuda_check_at_any_collector_level() -> None:
    text = ("2025-09-10T09:37:41.5Z INFO worker: Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:164 "
            "'invalid argument'\n")
    root = root_of(text)
    assert root.first.kind == "native" and root.exc_type == "CUDA Error"
    assert root.innermost is not None and root.innermost.line == 164


def test_segfault_of_a_shell_child_and_absl_banner() -> None:
    assert root_of("./run.sh: line 3: 4411 Segmentation fault      python serve.py\n").first.signal == "SIGSEGV"
    banner = root_of("*** SIGSEGV received at time=1741259412 on cpu 17 ***\nPC: @ 0x7f (unknown)\n")
    assert banner.first.signal == "SIGSEGV" and banner.first.kind == "fatal"


def test_preflight_failure_lines() -> None:
    text = (
        "  [ok  ] versions     vLLM 0.26.0, torch 2.9.0\n"
        "  [FAIL] miniature    the miniature run failed: AssertionError at core.py:97 in page_size_bytes [Worker_TP0]\n"
        "                      fix: see /tmp/mini/log; fix this before the real load\n"
        "  [warn] disk         only 40 GiB free for about 38 GiB of output\n"
        "preflight: FAILED (1 failed, 1 warnings, 3 checks)\n"
    )
    _, state = decode_bytes(text.encode())
    failures = state.failures_ranked()
    assert [g.exc_type for g in failures] == ["PreflightCheckFailed", "PreflightFailed"]
    assert failures[0].message.startswith("miniature: the miniature run failed: AssertionError")
    assert "fix: see /tmp/mini/log" in failures[0].message and failures[0].first.kind == "check"
    (warning,) = state.warnings_ranked()
    assert warning.exc_type == "PreflightWarning" and warning.message.startswith("disk: only 40 GiB")
    assert "Root cause: PreflightCheckFailed: miniature" in render_text(state)


def test_chained_cause_is_refined_in_place() -> None:
    head = "(Worker_TP0 pid=5) ERROR 11-30 01:29:02 [multiproc_executor.py:1] "
    decoder = Decoder(clock=lambda: 0.0)
    events = decoder.feed(
        f"{head}Traceback (most recent call last):\n"
        f'{head}  File "/srv/a.py", line 1, in f\n'
        f"{head}FileNotFoundError: /models/x/config.json\n".encode())
    (shown,) = [e for e in events if isinstance(e, ProvisionalFailure)]
    assert shown.failure.provisional and shown.failure.exc_type == "FileNotFoundError"
    assert not [e for e in events if isinstance(e, TracebackEvent)]
    (group,) = decoder.state.failures_ranked()
    assert group.provisional and group.exc_type == "FileNotFoundError"
    assert to_dict(decoder.state)["failures"][0]["provisional"] is True
    events = decoder.feed(
        f"{head}\n{head}The above exception was the direct cause of the following exception:\n{head}\n"
        f"{head}Traceback (most recent call last):\n"
        f'{head}  File "/srv/b.py", line 9, in load\n'
        f"{head}RuntimeError: could not load the model config\n".encode())
    (refined,) = [e for e in events if isinstance(e, ProvisionalFailure)]
    assert [e.exc_type for e in refined.failure.exceptions] == ["FileNotFoundError", "RuntimeError"]
    (group,) = decoder.state.failures_ranked()
    assert group.provisional and group.exc_type == "RuntimeError"
    final = [e for e in decoder.finish() if isinstance(e, TracebackEvent)]
    assert len(final) == 1 and not final[0].provisional
    (group,) = decoder.state.failures_ranked()
    assert not group.provisional and group.count == 1 and decoder.state.provisional == []


def test_confidence_and_provisional_in_the_report() -> None:
    _, state = decode_bytes(b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 9.00 GiB\n")
    doc = to_dict(state)["failures"][0]
    assert doc["confidence"] == "likely" and doc["basis"] == "exception line without traceback header"
    assert doc["provisional"] is False
    assert "confidence: likely (exception line without traceback header)" in render_text(state)


def test_only_a_reraise_is_a_guess() -> None:
    text = ("RuntimeError: Worker failed with error '', please check the stack trace above for the root cause\n")
    root = root_of(text)
    assert root.tier == 2 and root.confidence == "guess"


def test_ordinary_lines_are_not_exceptions() -> None:
    text = (
        "Model: meta-llama/Llama-3.1-8B\n"
        "Error: file not found, retrying\n"
        "INFO 11-30 01:28:09 [x.py:1] ValueError: is only logged here at INFO\n"
        "Exception in ControllerSingle:\n"
        "Processed prompts: 100%|##########| 3/3 [00:00<00:00, 16.2it/s]\n"
        "AssertionError\n"
    )
    _, state = decode_bytes(text.encode())
    assert state.failures_ranked() == []


def test_notebook_traceback() -> None:
    text = (
        "---------------------------------------------------------------------------\n"
        "ValueError                                Traceback (most recent call last)\n"
        "File <command-4218>, line 3\n"
        "      1 from vllm import LLM\n"
        "----> 3 llm = LLM(model=path, max_model_len=131072)\n"
        f"File {SP}/vllm/engine/llm_engine.py:451, in LLMEngine._initialize_kv_caches(self)\n"
        "    449 num_gpu_blocks, num_cpu_blocks = self.model_executor.determine_num_available_blocks()\n"
        "--> 451 self.model_executor.initialize_cache(num_gpu_blocks, num_cpu_blocks)\n"
        "ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be "
        "stored in KV cache (43872). Try increasing `gpu_memory_utilization` or decreasing `max_model_len`.\n"
    )
    root = root_of(text)
    assert root.exc_type == "ValueError" and root.confidence == "certain"
    inner = root.innermost
    assert inner is not None and inner.function == "LLMEngine._initialize_kv_caches" and inner.line == 451
    assert inner.source == "self.model_executor.initialize_cache(num_gpu_blocks, num_cpu_blocks)"
    assert root.hint is not None and root.hint.id == "kv_cache_too_small"


def test_native_line_glued_to_a_log_line_and_a_crashed_worker() -> None:
    text = ("(VllmWorker TP0 pid=9) INFO 09-10 09:37:40 [custom_all_reduce.py:203] Registering 4536 cuda graph "
            "addressesFailed: Cuda error /workspace/csrc/custom_all_reduce.cuh:307 'invalid argument'\n"
            "(EngineCore pid=3) ERROR 09-10 09:37:41 [multiproc_executor.py:149] Worker proc VllmWorker-0 died "
            "unexpectedly, shutting down executor.\n")
    root = root_of(text)
    assert root.first.kind == "native" and root.lanes == ["VllmWorker TP0"]
    crashed = root_of("(EngineCore pid=3) ERROR 09-10 09:37:41 [m.py:1] Worker proc VllmWorker-0 died unexpectedly "
                      "(exitcode=-11)\nRuntimeError: Engine core initialization failed. See root cause above.\n")
    assert crashed.first.signal == "SIGSEGV" and crashed.tier == 0


def test_an_exception_line_quoted_whole_in_a_sentence() -> None:
    # AUTOMATIC1111/stable-diffusion-webui#2986 (held-out set 18)
    line = ('Hello. I installed Stable Diffusion on a machine with an A5000 graphics card. But I get the error '
            '"RuntimeError: CUDA error: all CUDA-capable devices are busy or unavailable".')
    root = root_of(line + "\n    not part of it\n")
    assert (root.exc_type, root.message) == ("RuntimeError", "CUDA error: all CUDA-capable devices are busy or "
                                                             "unavailable")
    assert root.basis == "exception line quoted in a sentence" and root.confidence == "likely"
    assert root.first.context is not None and root.first.context.endswith("But I get the error")
    glued = root_of('It stops with the message"ValueError: bad value", then nothing.\n')
    assert (glued.exc_type, glued.message) == ("ValueError", "bad value")


def test_a_quoted_exception_that_is_a_value_is_not_a_failure() -> None:
    for line in ('message = "ValueError: bad value"',
                 '{"error": "ValueError: bad value", "code": 3}',
                 "{'error': \"ValueError: bad value\"}",
                 'logger.error(f"RuntimeError: {e}")',
                 'print("ValueError: bad value")',
                 'retries=3 last="ValueError: bad value" next=4',
                 'right  some-log: "ValueError: bad value" (kind traceback, signal None); expected ValueError',
                 'INFO 11-30 01:28:09 [x.py:1] I get "RuntimeError: CUDA error: busy" now and then, carrying on.'):
        _, state = decode_bytes((line + "\n").encode())
        assert state.failures_ranked() == [], line
    _, state = decode_bytes(b'WARNING 11-30 01:28:09 [x.py:1] retrying after "RuntimeError: CUDA error: busy".\n')
    assert state.failures_ranked() == [] and [w.exc_type for w in state.warnings_ranked()] == ["RuntimeError"]


def test_uniq_count_column_in_front_of_a_line() -> None:
    # kohya-ss/sd-scripts#2029 (held-out set 18): grep ... | sort | uniq -c
    text = ("(0) sebastiaan@almavm:sd-scripts $ grep debug*.log -he 'torch.OutOfMemoryError' | sort | uniq -c\n"
            "      2 [rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.99 GiB.\n")
    root = root_of(text)
    assert (root.exc_type, root.lanes) == ("torch.OutOfMemoryError", ["rank0"])
    bsd = root_of("   3 ValueError: bad value\n")  # BSD's uniq pads to 4 columns, and no prefix after it
    assert (bsd.exc_type, bsd.message) == ("ValueError", "bad value")
    for line in ("      1 import torch", "   12 items ValueError: x", "      3 INFO = 20"):
        _, state = decode_bytes((line + "\n").encode())
        assert state.failures_ranked() == [], line


def test_tgi_launcher_signal_notice() -> None:
    line = ("2024-07-16T08:22:10.123456Z ERROR shard-manager: text_generation_launcher: Shard process was "
            "signaled to shutdown with signal 4 rank=0\n"
            "2024-07-16T08:22:10.223456Z ERROR text_generation_launcher: Shard 0 failed to start\n")
    root = root_of(line)
    assert (root.exc_type, root.first.signal, root.first.origin) == ("Illegal instruction", "SIGILL", "rank0")
    assert root_of("Error: Download process was signaled to shutdown with signal 7: \n").exc_type == "Bus error"
    # The shard's own traceback, which the launcher prints before the notice, is the root cause.
    text = ("2024-07-16T08:22:10.123456Z ERROR shard-manager: text_generation_launcher: Shard complete standard "
            "error output:\n\n"
            "Traceback (most recent call last):\n"
            '  File "/opt/conda/bin/text-generation-server", line 8, in <module>\n'
            "    sys.exit(app())\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
            " rank=0\n"
            "2024-07-16T08:22:10.123456Z ERROR shard-manager: text_generation_launcher: Shard process was "
            "signaled to shutdown with signal 6 rank=0\n")
    _, state = decode_bytes(text.encode())
    failures = state.failures_ranked()
    assert [g.exc_type for g in failures] == ["torch.OutOfMemoryError", "Aborted"] and failures[1].tier == 1


def test_torch_check_without_its_class() -> None:
    # hiyouga/LlamaFactory#2949 (held-out set 18)
    line = ("deepspeed --num_gpus 2 src/train_bash.py --deepspeed examples/deepspeed/ds_z3_config.json  get the "
            "error:Expected is_sm80 || is_sm90 to be true, but got false\n")
    root = root_of(line)
    assert (root.exc_type, root.message) == ("RuntimeError", "Expected is_sm80 || is_sm90 to be true, but got false")
    # Logged at INFO it was handled; the same message behind its class is the exception line, read once.
    _, state = decode_bytes(b"INFO 01-02 03:04:05 [attn.py:9] flash kernels off (Expected is_sm80 || is_sm90 to be "
                            b"true, but got false), using SDPA\n")
    assert state.failures_ranked() == []
    full = ("Traceback (most recent call last):\n"
            '  File "/x/train.py", line 3, in <module>\n'
            "    main()\n"
            "RuntimeError: Expected is_sm80 || is_sm90 to be true, but got false.  (Could this error message be "
            "improved?  If so, please report an enhancement request to PyTorch.)\n")
    _, state = decode_bytes(full.encode())
    assert [(g.exc_type, g.basis) for g in state.failures_ranked()] == [("RuntimeError", "complete traceback")]
    # A wrapper that quotes it without its class quotes a RuntimeError.
    assert class_from_message("Expected is_sm80 || is_sm90 to be true, but got false") == "RuntimeError"


def test_a_module_error_class_alone_and_in_a_traceback() -> None:
    # TencentARC/SmartEdit#37 (held-out set 17)
    root = root_of("struct.error: unpack_from requires a buffer of at least 5 bytes for unpacking 5 bytes at "
                   "offset 0 (actual buffer size is 0)\n")
    assert root.exc_type == "struct.error" and root.message.startswith("unpack_from requires a buffer")
    full = root_of("Traceback (most recent call last):\n"
                   '  File "/x/data.py", line 3, in <module>\n'
                   "    base64.b64decode(s)\n"
                   "binascii.Error: Incorrect padding\n")
    assert (full.exc_type, full.confidence) == ("binascii.Error", "certain")


def test_a_class_made_per_reason() -> None:
    # NVlabs/imaginaire#56 (held-out set 19): pynvml's NVMLError_<Reason> classes, in an inline code span
    root = root_of("`pynvml.nvml.NVMLError_LibraryNotFound: NVML Shared Library Not Found`\n")
    assert (root.exc_type, root.message) == ("pynvml.nvml.NVMLError_LibraryNotFound", "NVML Shared Library Not Found")
    for line, exc_type in (("pynvml.NVMLError_DriverNotLoaded: Driver Not Loaded", "pynvml.NVMLError_DriverNotLoaded"),
                           ("NVMLError_Uninitialized: Uninitialized", "NVMLError_Uninitialized"),
                           ('It fails with "pynvml.NVMLError_GpuIsLost: GPU is lost" after an hour.',
                            "pynvml.NVMLError_GpuIsLost"),
                           ("      2 pynvml.NVMLError_NotSupported: Not Supported", "pynvml.NVMLError_NotSupported"),
                           ("mylib.ClientException_Refused: no reply", "mylib.ClientException_Refused")):
        assert root_of(line + "\n").exc_type == exc_type, line
    # ... and ending a traceback, the exception line in markdown bold as a reporter pasted it
    full = root_of("Traceback (most recent call last):\n"
                   '  File "/usr/lib/python3/dist-packages/pynvml.py", line 310, in _nvmlCheckReturn\n'
                   "    raise NVMLError(ret)\n"
                   "**pynvml.NVMLError_DriverNotLoaded: Driver Not Loaded**\n")
    assert (full.exc_type, full.message, full.confidence) == ("pynvml.NVMLError_DriverNotLoaded", "Driver Not Loaded",
                                                              "certain")
    # Constants and C types with an underscore are not classes.
    for line in ("CUDA_ERROR_OUT_OF_MEMORY: out of memory", "cudaError_t: 2", "NVML_ERROR_NOT_FOUND: 6",
                 "MyError_t: x"):
        _, state = decode_bytes((line + "\n").encode())
        assert state.failures_ranked() == [], line


def test_ctypes_function_not_found_without_its_class() -> None:
    # bitsandbytes-foundation/bitsandbytes#711 (held-out set 19): bitsandbytes' CUDA setup prints str(e)
    text = ("bin C:\\Users\\u\\anaconda3\\envs\\e\\lib\\site-packages\\bitsandbytes\\libbitsandbytes_cpu.dll\n"
            "function 'cadam32bit_grad_fp32' not found\n"
            "CUDA_SETUP: WARNING! libcudart.so not found in any environmental path. Searching in backup paths...\n")
    root = root_of(text)
    assert (root.exc_type, root.message) == ("AttributeError", "function 'cadam32bit_grad_fp32' not found")
    assert root_of("function ordinal 12 not found\n").exc_type == "AttributeError"
    # Only the whole line in ctypes' words, and not logged at INFO or DEBUG.
    for line in ("Error: function 'main' not found in module", "the function 'foo' not found earlier is optional",
                 "INFO 01-02 03:04:05 [ops.py:9] function 'cadam32bit_grad_fp32' not found"):
        _, state = decode_bytes((line + "\n").encode())
        assert state.failures_ranked() == [], line
    # With its class it is the exception line, read once.
    _, state = decode_bytes(b"AttributeError: function 'cadam32bit_grad_fp32' not found\n")
    assert [(g.exc_type, g.basis) for g in state.failures_ranked()] == [
        ("AttributeError", "exception line without traceback header")]
    assert class_from_message("function 'cadam32bit_grad_fp32' not found") == "AttributeError"


def test_peft_merge_refused_without_its_class() -> None:
    # huggingface/peft#1704 (held-out set 19): the message quoted in a feature request's sentence
    line = ("Enable merge_and_unload functionality with ia3 adapters loaded with 4-bit and 8-bit quantization model. "
            "Currently, merging fails with an error \"Cannot merge ia3 layers when the model is loaded in 4-bit "
            "mode\" \n")
    root = root_of(line)
    assert (root.exc_type, root.message) == ("ValueError", "Cannot merge ia3 layers when the model is loaded in "
                                                           "4-bit mode")
    for message in ("Cannot merge LORA layers when the model is loaded in 8-bit mode",
                    "Cannot merge LOHA layers when the model is gptq quantized",
                    "Cannot merge layers when the model is gptq quantized",
                    "Cannot merge OFT layers when base model layers are replicated"):
        assert (root_of(f"**{message}**\n").exc_type, class_from_message(message)) == ("ValueError", "ValueError")
    for text in ("INFO 01-02 03:04:05 [merge.py:9] Cannot merge LORA layers when the model is loaded in 8-bit mode, "
                 "keeping the adapter separate\n",
                 "Cannot merge the branches: conflict in train.py\n"):
        _, state = decode_bytes(text.encode())
        assert state.failures_ranked() == [], text


def test_nccl_warn_quoted_without_its_prefix() -> None:
    # NVIDIA/nccl#1129 (held-out set 20): the line in the reporter's typographic quotes, reversed, no host prefix
    root = root_of("\u201dmisc/ibvwrap.cc:280 NCCL WARN Call to ibv_create_qp failed\u201c\n")
    assert (root.exc_type, root.message, root.basis) == ("NCCL WARN", "Call to ibv_create_qp failed", "NCCL WARN line")
    assert root.first.exceptions[0].frames[0].file == "misc/ibvwrap.cc"
    for line, message in (
            ('I get "transport/net_ib.cc:1100 NCCL WARN Cuda failure \'out of memory\'" after an hour.',
             "Cuda failure 'out of memory'"),
            ("It says `NCCL WARN NET/IB : Got completion with error 12` and stops",
             "NET/IB : Got completion with error 12"),
            ("\u2018NCCL WARN Cuda failure 2\u2019", "Cuda failure 2"),
            ("misc/ibvwrap.cc:280 NCCL WARN Call to ibv_create_qp failed", "Call to ibv_create_qp failed")):
        assert (root_of(line + "\n").exc_type, root_of(line + "\n").message) == ("NCCL WARN", message), line
    # NCCL WARN in words, unquoted with no file:line, or at INFO, is not one.
    for line in ("we see NCCL WARN lines sometimes", 'we see "NCCL WARN" lines',
                 'INFO 01-02 03:04:05 [x.py:1] "misc/ibvwrap.cc:280 NCCL WARN Call failed"'):
        _, state = decode_bytes((line + "\n").encode())
        assert state.failures_ranked() == [], line


def test_pytest_e_column_joins_the_message() -> None:
    # vllm-project/vllm-ascend#13434 (held-out set 20): pytest's E column; the cause is on the message's second line
    text = (">                           raise pickle.UnpicklingError(_get_wo_message(str(e))) from None\n"
            "E                           _pickle.UnpicklingError: Weights only load failed. In PyTorch 2.6, ...\n"
            "E                           Please file an issue: WeightsUnpickler error: size is inconsistent\n"
            "E\n"
            "E                           Check the documentation of torch.load.\n"
            "\n"
            "/usr/lib/python3/site-packages/torch/serialization.py:1470: UnpicklingError\n")
    root = root_of(text)
    assert root.exc_type == "_pickle.UnpicklingError"
    assert root.message == ("Weights only load failed. In PyTorch 2.6, ...\nPlease file an issue: WeightsUnpickler "
                            "error: size is inconsistent\n\nCheck the documentation of torch.load.")
    # Behind a rank prefix too, and an assertion's E lines are no failure of their own.
    assert root_of("[rank0]: E   ValueError: bad\n[rank0]: E   more\n").message == "bad\nmore"
    _, state = decode_bytes(b"E       assert 1 == 2\nE        +  where 1 = f()\n")
    assert state.failures_ranked() == []
    # Only pytest's column: an E that starts a word, or with fewer than three spaces, is the line's own text.
    for line in ("E  RuntimeError: x", "Ebad: ValueError: y", "E1130 01:28:53.967 12 file.cc:68] ValueError: z",
                 "E  x"):
        events, _ = decode_bytes((line + "\n").encode())
        assert [(event.level, event.source) for event in events if isinstance(event, LineEvent)] != [
            ("ERROR", "pytest")], line


def test_transformers_rope_scaling_refused_without_its_class() -> None:
    # ShmuelRonen/ComfyUI_ChatterBox_Voice#1 (held-out set 21): the message alone, as the reporter pasted it
    line = ("`rope_scaling` must be a dictionary with with two fields, `type` and `factor`, got {'factor': 8.0, "
            "'high_freq_factor': 4.0, 'low_freq_factor': 1.0, 'original_max_position_embeddings': 8192, "
            "'rope_type': 'llama3'}")
    root = root_of(line + "\n")
    assert (root.exc_type, root.message) == ("ValueError", line)
    assert root.basis == "transformers message without its class (raised as ValueError)"
    for message in ("`rope_scaling` must be a dictionary with two fields, `type` and `factor`, got {'type': 'yarn'}",
                    "rope_scaling must be a dictionary with two fields, type and factor, got {'rope_type': 'llama3'}",
                    "`rope_scaling`'s type field must be one of ['linear', 'dynamic'], got llama3"):
        assert root_of(f"Error loading model: {message}\n").exc_type == "ValueError", message
        assert class_from_message(message) == "ValueError", message
    # Newer transformers warns, with no class either, where a field is off: not a failure. Nor at INFO.
    for text in ("`rope_scaling`'s factor field must be a float >= 1, got 0.5\n",
                 "`rope_scaling`'s original_max_position_embeddings field must be less than max_position_embeddings, "
                 "got 8192 and max_position_embeddings=4096\n",
                 "INFO 01-02 03:04:05 [config.py:9] `rope_scaling` must be a dictionary with two fields, `type` and "
                 "`factor`, got {'factor': 8.0}; converting\n"):
        _, state = decode_bytes(text.encode())
        assert state.failures_ranked() == [], text
    # With its class it is the exception line, read once.
    _, state = decode_bytes(f"ValueError: {line}\n".encode())
    assert [(g.exc_type, g.basis) for g in state.failures_ranked()] == [
        ("ValueError", "exception line without traceback header")]


def test_vllm_sliding_window_refused_without_its_class() -> None:
    # vllm-project/vllm#15705 (held-out set 21): the message alone in a code fence
    line = ("Sliding window for some but all layers is not supported. This model uses sliding window but "
            "`max_window_layers` = 28 is less than `num_hidden_layers` = 28. Please open an issue to discuss this "
            "feature.")
    root = root_of(line + "\n")
    assert (root.exc_type, root.message) == ("ValueError", line)
    assert root.basis == "vLLM message without its class (raised as ValueError)"
    assert root_of("it fails with: Sliding window for some but all layers is not supported.\n").message == (
        "Sliding window for some but all layers is not supported.")
    # Some versions assert the same words: with its class printed, that class; its words alone tell no wrapper.
    _, state = decode_bytes(f"AssertionError: {line}\n".encode())
    assert [g.exc_type for g in state.failures_ranked()] == ["AssertionError"]
    assert class_from_message(line) is None
    _, state = decode_bytes(f"INFO 01-02 03:04:05 [qwen2.py:9] {line}\n".encode())
    assert state.failures_ranked() == []


def test_spawn_reraise_as_a_plain_exception() -> None:
    # yangkky/distributed_tutorial#3 (held-out set 21): older PyTorch's mp.spawn raised Exception(msg), not
    # ProcessRaisedException; the message says it re-raises the child's failure, which is the root cause.
    text = (f'  File "{SP}/torch/multiprocessing/spawn.py", line 114, in join\n'
            "    raise Exception(msg)\n"
            "Exception: \n"
            "\n"
            "-- Process 0 terminated with the following error:\n"
            "Traceback (most recent call last):\n"
            f'  File "{SP}/torch/distributed/rendezvous.py", line 143, in _env_rendezvous_handler\n'
            "    store = TCPStore(master_addr, master_port, world_size, start_daemon)\n"
            "RuntimeError: Connection timed out\n")
    _, state = decode_bytes(text.encode())
    assert [(g.exc_type, g.tier) for g in state.failures_ranked()] == [("RuntimeError", 0), ("Exception", 2)]
    # The child's exception line in the wrapper's own message is its quoted original, as for ProcessRaisedException.
    root = root_of("Exception: \n\n-- Process 1 terminated with the following error:\n.\nAssertionError: bad rank\n")
    assert (root.exc_type, root.message) == ("AssertionError", "bad rank")
    # A plain Exception with other words is an original failure.
    assert root_of("Exception: Process 0 could not start\n").tier == 0


def test_an_exception_line_split_by_interleaved_ranks() -> None:
    # deepspeedai/DeepSpeedExamples#787 (held-out set 21): ranks without prefixes write into one another's pieces
    source = "super(_open_file, self).__init__(open(name, mode))"
    error = "[Errno 2] No such file or directory: '/tmp/data_files/traindata_04ec.pt'"
    text = (f'FileNotFoundError  File "{SP}/torch/serialization.py", line 251, in __init__\n'
            f'  File "{SP}/torch/serialization.py", line 251, in __init__\n'
            f"            {source}FileNotFoundError:         {source}{source}\n"
            f": {error}{error}{source}{source}\n")
    _, state = decode_bytes(text.encode())
    (root,) = state.failures_ranked()
    assert (root.exc_type, root.message, root.confidence) == ("FileNotFoundError", error, "likely")
    assert root.basis == "exception line split by interleaved output (class and message joined)"
    assert root.innermost is not None and root.innermost.function == "__init__"
    # The class alone on its line, then its ": message" after another writer's line end.
    root = root_of(f'Traceback (most recent call last):\n  File "/x/a.py", line 3, in f\n    {source}\n'
                   f"FileNotFoundError\n: {error}\n")
    assert (root.exc_type, root.message) == ("FileNotFoundError", error)
    # A ": " line with no class above it ends nothing, and outside a traceback it is no failure.
    _, state = decode_bytes(f'Traceback (most recent call last):\n  File "/x/a.py", line 3, in f\n    {source}\n'
                            f": {error}\n".encode())
    assert [g.basis for g in state.failures_ranked()] == ["traceback cut off before its exception line"]
    _, state = decode_bytes(f"raised FileNotFoundError earlier\n: {error}\n".encode())
    assert state.failures_ranked() == []


def test_transformers_file_not_in_repo_without_its_class() -> None:
    # AIGeeksGroup/3D-R1#12 (held-out set 22): the message alone, the whole description
    line = "depth_anything_vitl14 does not appear to have a file named preprocessor_config.json"
    root = root_of(line + "\n")
    assert (root.exc_type, root.message) == ("OSError", line)
    assert root.basis == "transformers message without its class (raised as OSError)"
    for message in ("/ckpt/step-100 does not appear to have a file named config.json. Checkout "
                    "'https://huggingface.co//ckpt/step-100/tree/None' for available files.",
                    "TheBloke/Llama-2-7b does not appear to have a file named pytorch_model.bin, tf_model.h5, "
                    "model.ckpt or flax_model.msgpack.",
                    "org/model does not appear to have files named ('model-00002-of-00002.safetensors',). Checkout "
                    "'https://huggingface.co/org/model/tree/main' for available files."):
        assert (root_of(message + "\n").exc_type, root_of(message + "\n").message) == ("OSError", message)
        assert class_from_message(message) == "OSError", message
    # Inside a caller's sentence that goes on without the file, in prose, at INFO or DEBUG: not a failure.
    for text in ("Failed to load generation config for org/m: org/m does not appear to have a file named "
                 "generation_config.json. Checkout 'https://huggingface.co/org/m/tree/main' for available files.. "
                 "Proceeding without generation config.\n",
                 "My checkpoint does not appear to have a file named config.json, what should I copy?\n",
                 "[TheBloke/Llama-2-7b does not appear to have a file named pytorch_model.bin](https://example.com)\n",
                 "INFO 01-02 03:04:05 [config.py:9] org/m does not appear to have a file named "
                 "generation_config.json\n"):
        _, state = decode_bytes(text.encode())
        assert state.failures_ranked() == [], text
    # With its class it is the exception line, read once.
    _, state = decode_bytes(f"OSError: {line}\n".encode())
    assert [(g.exc_type, g.basis) for g in state.failures_ranked()] == [
        ("OSError", "exception line without traceback header")]


def test_spawn_child_ended_by_a_signal_is_its_death() -> None:
    # lyu-yx/ACUMEN#4 (held-out set 23): mp.spawn's join reports the child's death; the signal is in the message
    for name, tier in (("SIGKILL", 1), ("SIGSEGV", 0)):
        text = (f'  File "{SP}/torch/multiprocessing/spawn.py", line 130, in join\n'
                "    raise ProcessExitedException(\n"
                f"torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with signal {name}\n")
        _, state = decode_bytes(text.encode())
        groups = state.failures_ranked()
        assert [(g.exc_type, g.first.signal, g.tier) for g in groups] == [
            ("ProcessDied", name, tier), ("torch.multiprocessing.spawn.ProcessExitedException", None, 2)]
        assert groups[0].message == f"process 0 terminated with signal {name}"
        assert groups[0].quoted_in == "ProcessExitedException"
    # An exit code is no signal: the exception stays the failure, as it was.
    root = root_of("torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with exit code 17\n")
    assert (root.exc_type, root.first.signal, root.tier) == (
        "torch.multiprocessing.spawn.ProcessExitedException", None, 0)
    # The kernel's OOM-killer line in the log is that death already: one death, the notice's.
    root = root_of("Out of memory: Killed process 4242 (python)\n"
                   "torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with signal SIGKILL\n")
    assert (root.exc_type, root.first.signal, root.message) == (
        "ProcessDied", "SIGKILL", "Out of memory: Killed process 4242 (python)")


def test_indented_traceback_reads_its_exception_and_chain_lines() -> None:
    # deepspeedai/DeepSpeed#6625 (held-out set 24): pip indents a setup script's output under "[28 lines of
    # output]"; the chain's first exception is complete, the second traceback is cut by the paste.
    pad = "      "
    text = (f"  ╰─> [28 lines of output]\n{pad}Traceback (most recent call last):\n"
            f'{pad}  File "op_builder/builder.py", line 398, in cpu_arch\n'
            f"{pad}    from cpuinfo import get_cpu_info\n"
            f"{pad}ModuleNotFoundError: No module named 'cpuinfo'\n\n"
            f"{pad}During handling of the above exception, another exception occurred:\n\n"
            f"{pad}Traceback (most recent call last):\n"
            f'{pad}  File "setup.py", line 200, in <module>\n'
            f"{pad}    ext_modules.append(builder.builder())\n")
    groups = decode_bytes(text.encode())[1].failures_ranked()
    assert [(g.exc_type, g.message) for g in groups] == [("ModuleNotFoundError", "No module named 'cpuinfo'")]
    assert "chained part cut off" in groups[0].basis
    # Whole, it is the chain as Python prints it, unindented.
    whole = text + f"{pad}KeyError: 'cxx'\n"
    root = root_of(whole)
    assert (root.exc_type, root.first.complete) == ("ModuleNotFoundError", True)
    assert [e.exc_type for e in root.first.exceptions] == ["ModuleNotFoundError", "KeyError"]


def test_grpc_error_repr_logged_before_a_cut_traceback() -> None:
    # ray-project/ray#16059 (held-out set 24): the data channel logs the RPC error, then its thread re-raises it and
    # the paste is cut before the exception line.
    repr_lines = ("Got Error from data channel -- shutting down: <_MultiThreadedRendezvous of RPC that terminated "
                  "with:\n\tstatus = StatusCode.UNKNOWN\n"
                  '\tdetails = "Exception iterating responses: Request type None not handled"\n'
                  '\tdebug_error_string = "{"grpc_status":2}"\n>\n')
    text = (repr_lines + "Exception in thread Thread-23:\nTraceback (most recent call last):\n"
            f'  File "{SP}/ray/util/client/dataclient.py", line 90, in _data_main\n    raise e\n')
    groups = decode_bytes(text.encode())[1].failures_ranked()
    assert [(g.exc_type, g.message) for g in groups][0] == (
        "_MultiThreadedRendezvous", "Exception iterating responses: Request type None not handled")
    assert groups[0].basis == "gRPC error repr (no traceback of its own)"
    assert len(groups) == 2 and not groups[1].first.complete
    # As an exception line it stays the exception line, its class in full.
    root = root_of("grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated with:\n"
                   "\tstatus = StatusCode.UNAVAILABLE\n\tdetails = \"failed to connect to all addresses\"\n>\n")
    assert (root.exc_type, root.basis) == ("grpc._channel._InactiveRpcError", "exception line without traceback header")
    # Logged at INFO (a retry) it is no failure.
    info = ("2024-01-01 10:00:00,123 INFO client.py:12 -- retrying: <_InactiveRpcError of RPC that terminated with:\n"
            "\tstatus = StatusCode.UNAVAILABLE\n\tdetails = \"x\"\n>\n")
    assert decode_bytes(info.encode())[1].failures_ranked() == []


def test_exception_repr_in_a_failed_events_field() -> None:
    # vllm-project/vllm#1644 (held-out set 24): httpcore's trace record of a failed TLS start
    line = ("httpcore.connection:starttls.failed exception=ConnectError(SSLCertVerificationError(1, '[SSL: "
            "CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer certificate "
            "(_ssl.c:1124)'))\n")
    root = root_of(line)
    assert root.exc_type == "SSLCertVerificationError"
    assert root.message.startswith("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    assert root_of("connect_tcp.failed exception=ConnectError(\"All connection attempts failed\")\n").exc_type == (
        "ConnectError")
    for text in ("DEBUG:httpcore.connection:connect_tcp.failed exception=ConnectError(OSError(111, 'refused'))\n",
                 "receive_response_headers.complete return_value=(b'HTTP/1.1', 200, b'OK')\n",
                 "job failed exception=Thing('not an exception class')\n",
                 "request started exception=ValueError('no failure word')\n"):
        assert decode_bytes(text.encode())[1].failures_ranked() == [], text
