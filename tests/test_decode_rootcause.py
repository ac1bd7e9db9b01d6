"""Grouping across ranks and putting the root cause first."""

from __future__ import annotations

from eaglewatch.decode.decoder import decode_bytes
from eaglewatch.decode.rootcause import (
    TIER_ORIGINAL,
    TIER_PROPAGATED,
    TIER_SECONDARY,
    TIER_TOPLEVEL,
    summary,
)

SP = "/opt/venv/lib/python3.12/site-packages"


def logged(prefix: str, source: str, lines: list[str], level: str = "ERROR", time: str = "11-30 01:29:02") -> str:
    return "".join(f"{prefix} {level} {time} [{source}] {line}\n" for line in lines)


def tb(frames: list[tuple[str, int, str, str]], last: str, context: str | None = None) -> list[str]:
    lines = [context] if context else []
    lines.append("Traceback (most recent call last):")
    for path, line, func, source in frames:
        lines += [f'  File "{path}", line {line}, in {func}', f"    {source}"]
    return lines + [last]


WORKER_FAIL = tb([(f"{SP}/vllm/v1/worker/gpu_worker.py", 362, "execute_model", "out = self.runner.run()"),
                  (f"{SP}/vllm/model_executor/layers/linear.py", 512, "forward", "assert x.shape[-1] == self.k")],
                 "AssertionError", "WorkerProc hit an exception.")
ENGINE_RERAISE = tb([(f"{SP}/vllm/v1/executor/multiproc_executor.py", 298, "get_response", "raise RuntimeError(")],
                    "RuntimeError: Worker failed with error '', please check the stack trace above for the root cause",
                    "EngineCore encountered a fatal error.")
MAIN_FINAL = tb([("/srv/eagle/scripts/run.py", 50, "main", "outs = llm.generate(p)"),
                 (f"{SP}/vllm/v1/engine/core_client.py", 667, "get_output", "raise self._format_exception(o)")],
                "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace "
                "(above) for the root cause.")


def test_worker_exception_ranks_above_reraises_even_when_printed_last() -> None:
    # Pipes flush in any order: here the main process and the EngineCore get their words in first.
    text = "\n".join(MAIN_FINAL) + "\n"
    text += logged("(EngineCore_DP0 pid=9)", "core.py:711", ENGINE_RERAISE)
    for rank in range(8):
        text += logged(f"(Worker_TP{rank} pid={100 + rank})", "multiproc_executor.py:871", WORKER_FAIL)
    _, state = decode_bytes(text.encode())
    failures = state.failures_ranked()
    assert [g.tier for g in failures] == [TIER_ORIGINAL, TIER_PROPAGATED, TIER_TOPLEVEL]
    first = failures[0]
    assert first.exc_type == "AssertionError" and first.count == 8 and first.spread == 8
    assert first.lanes_label() == "\u00d78 ranks: Worker_TP0\u20137"
    assert first.summary == "AssertionError at linear.py:512 in forward: assert x.shape[-1] == self.k"
    assert failures[1].lanes == ["EngineCore_DP0"] and failures[2].lanes == ["main"]


def test_different_failures_on_different_ranks_stay_apart_and_the_earliest_leads() -> None:
    oom = tb([(f"{SP}/vllm/a.py", 1, "f", "g()")], "torch.OutOfMemoryError: CUDA out of memory. GPU 1")
    timeout = tb([(f"{SP}/vllm/shm_broadcast.py", 421, "acquire_read", "raise TimeoutError")], "TimeoutError")
    text = logged("(Worker_TP1 pid=2)", "m.py:1", oom)
    text += logged("(Worker_TP0 pid=1)", "m.py:1", timeout, time="11-30 01:39:02")
    text += logged("(Worker_TP2 pid=3)", "m.py:1", timeout, time="11-30 01:39:02")
    _, state = decode_bytes(text.encode())
    failures = state.failures_ranked()
    assert [g.exc_type for g in failures] == ["torch.OutOfMemoryError", "TimeoutError"]
    assert failures[1].lanes_label() == "\u00d72 ranks: Worker_TP0,2"


def test_a_message_quoting_an_earlier_failure_is_a_reraise() -> None:
    original = tb([("/srv/a.py", 1, "f", "g()")], "ValueError: tokenizer vocabulary does not match the model")
    wrapper = tb([("/srv/b.py", 9, "h", "raise RuntimeError(msg)")],
                 "RuntimeError: rank 1 failed: tokenizer vocabulary does not match the model")
    text = logged("(Worker_TP1 pid=2)", "m.py:1", original) + logged("(EngineCore pid=1)", "c.py:1", wrapper)
    _, state = decode_bytes(text.encode())
    assert [g.tier for g in state.failures_ranked()] == [TIER_ORIGINAL, TIER_PROPAGATED]


def test_teardown_noise_and_deaths_rank_after_originals() -> None:
    text = logged("(Worker_TP0 pid=1)", "m.py:1", tb([("/srv/a.py", 1, "f", "g()")], "KeyboardInterrupt"))
    text += "(EngineCore pid=3) ERROR 11-30 01:29:03 [m.py:2] Worker proc VllmWorker-0 died unexpectedly\n"
    text += logged("(Worker_TP1 pid=2)", "m.py:1", tb([("/srv/a.py", 5, "load", "x()")], "KeyError: 'lm_head'"),
                   time="11-30 01:29:04")
    _, state = decode_bytes(text.encode())
    failures = state.failures_ranked()
    assert [g.exc_type for g in failures] == ["KeyError", "KeyboardInterrupt", "ProcessDied"]
    assert [g.tier for g in failures] == [TIER_ORIGINAL, TIER_SECONDARY, TIER_SECONDARY]


def test_launcher_summaries_are_reraises() -> None:
    rank_fail = tb([("/srv/extract.py", 12, "main", "run()")], "ValueError: layer 40 does not exist")
    summary_fail = tb([(f"{SP}/torch/distributed/run.py", 143, "__call__", "raise ChildFailedError(")],
                      "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ")
    text = "\n".join(summary_fail) + "\n" + logged("[rank1]:", "x.py:1", rank_fail)
    _, state = decode_bytes(text.encode())
    assert [g.exc_type for g in state.failures_ranked()] == [
        "ValueError", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"]


def test_chain_with_an_original_inside_is_original() -> None:
    lines = tb([("/srv/a.py", 1, "f", "g()")], "FileNotFoundError: model-00002-of-00004.safetensors")
    lines += ["", "The above exception was the direct cause of the following exception:", ""]
    lines += tb([("/srv/a.py", 9, "h", "raise RuntimeError(...)")],
                "RuntimeError: Engine core initialization failed. See root cause above.")
    _, state = decode_bytes(("\n".join(lines) + "\n").encode())
    (group,) = state.failures_ranked()
    assert group.tier == TIER_ORIGINAL and group.hint is not None and group.hint.id == "safetensors_shard"


def test_one_process_printing_under_two_names_is_one_process() -> None:
    fail = tb([("/srv/a.py", 1, "f", "g()")], "RuntimeError: boom")
    text = logged("(VllmWorker-0 pid=7)", "m.py:1", ["starting"], level="INFO")
    text += logged("(Worker pid=7)", "m.py:1", fail)
    text += logged("(Worker_TP0 pid=7)", "m.py:1", fail)
    _, state = decode_bytes(text.encode())
    (group,) = state.failures_ranked()
    assert group.count == 2 and group.spread == 1 and group.lanes == ["Worker_TP0"]
    (lane,) = state.lanes_list()
    assert lane.aliases == ["VllmWorker-0", "Worker", "Worker_TP0"] and lane.lines == 9
    assert state.lane_of("Worker") is lane and state.lane_of("VllmWorker-0") is lane


def test_summary_of_empty_message_names_the_failing_line() -> None:
    _, state = decode_bytes(("\n".join(tb([("/srv/x.py", 7, "check", "assert request.block_hashes")],
                                           "AssertionError")) + "\n").encode())
    group = state.failures_ranked()[0]
    assert summary(group.first) == "AssertionError at x.py:7 in check: assert request.block_hashes"


def test_no_failures_in_a_clean_log() -> None:
    text = logged("(Worker_TP0 pid=1)", "m.py:1", ["all good"], level="INFO")
    text += "(MainProcess pid=2) WARNING 11-30 01:01:56 [utils.py:653] [shutdown] Process manager: force killing " \
            "remaining process EngineCore pid 8957\n"
    _, state = decode_bytes(text.encode())
    assert state.failures_ranked() == [] and state.root_cause() is None
