"""Stack dumps of live processes (eaglewatch/decode/stackdump.py): where each is stuck, ranked after real failures."""

from __future__ import annotations

from pathlib import Path

from eaglewatch.decode import decode_bytes

SHAPES = Path(__file__).parent / "fixtures" / "shapes"

FAULTHANDLER_THREADS = """\
Thread 0x00007f1b2e7fc640 (most recent call first):
  File "/usr/lib/python3.10/threading.py", line 324 in wait
  File "/usr/lib/python3.10/threading.py", line 600 in wait
  File "/srv/app/heartbeat.py", line 41 in run

Current thread 0x00007f1b3a5e2740 (most recent call first):
  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/distributed_c10d.py", line 3305 in barrier
  File "/srv/app/train.py", line 88 in main
"""


def roots(text: str):
    _, state = decode_bytes(text.encode())
    return state.failures_ranked()


def test_the_current_thread_is_the_one_named_and_every_thread_counted() -> None:
    (root,) = roots(FAULTHANDLER_THREADS)
    assert root.exc_type == "Stack dump" and root.first.kind == "stack"
    assert root.message == "0x00007f1b3a5e2740 stuck in barrier (distributed_c10d.py:3305) (2 threads dumped)"
    assert root.first.exceptions[0].frames[-1].function == "barrier"  # innermost last, as in a traceback


def test_a_crash_in_the_same_log_is_the_root_cause_and_the_dump_follows() -> None:
    crash = ("Traceback (most recent call last):\n"
             '  File "/srv/app/train.py", line 12, in main\n'
             "    step()\n"
             "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:219, unhandled system error\n")
    failures = roots((SHAPES / "stack-dump-faulthandler.log").read_text() + crash)
    assert [f.exc_type for f in failures] == ["RuntimeError", "Stack dump"]


def test_a_fatal_error_s_own_dump_stays_the_fatal_error() -> None:
    text = ("Fatal Python error: Segmentation fault\n\n" + FAULTHANDLER_THREADS)
    (root, *_) = roots(text)
    assert root.first.kind == "fatal" and root.first.signal == "SIGSEGV"


def test_python_traceback_frames_are_not_a_dump() -> None:
    text = ('  File "/srv/app/train.py", line 12, in main\n'
            "    step()\n")
    assert all(f.exc_type != "Stack dump" for f in roots(text))


def test_stamps_sort_in_time_whatever_the_logger() -> None:
    from eaglewatch.decode.stamps import time_key

    assert time_key("2022-06-21 19:14:10,710") < time_key("2022-06-21 19:14:10,718")  # type: ignore[operator]
    assert time_key("0621 19:14:10.7") == time_key("06-21 19:14:10.7") == (6, 21, 19, 14, 10, 0.7)
    assert time_key("321 02:07:08.40") == (3, 21, 2, 7, 8, 0.4)  # glog's E321: March 21
    assert time_key("11-30 01:29:02") == (11, 30, 1, 29, 2, 0.0)
    assert time_key("yesterday") is None and time_key(None) is None and time_key("1399 01:02:03") is None


def test_failures_printed_out_of_time_order_are_put_back_in_it() -> None:
    # A worker's exception reaches the log first, stamped after the peer's C++ check failure that caused it.
    text = ("2022-06-21 19:14:10,718\tERROR worker.py:99 -- ConnectionError: the peer closed the connection\n"
            "(Actor pid=31945) [2022-06-21 19:14:10,710 C 31945 31971] pb_util.h:202:  Check failed: "
            "death_cause.context_case() == ContextCase::kActorDiedErrorContext\n")
    failures = roots(text)
    assert [f.exc_type for f in failures] == ["Check failed", "ConnectionError"]
    # Without a time on one of them, the log's order stands.
    untimed = text.replace("2022-06-21 19:14:10,718\tERROR worker.py:99 -- ", "")
    assert [f.exc_type for f in roots(untimed)] == ["ConnectionError", "Check failed"]


def test_py_spy_on_a_real_engine_loading_on_the_h200() -> None:
    """py-spy's dump of the miniature's processes on an H200, as bench/gpu_first_sign_run.sh's watcher took it
    (tests/fixtures/gpu/h200_first_sign_1203/ours-cold/ours-cold.watch.txt, 58 s in): three processes, one active."""
    watch = (Path(__file__).parent / "fixtures" / "gpu" / "h200_first_sign_1203" / "ours-cold" /
             "ours-cold.watch.txt").read_text().split("\n=== ")
    dump = next(block for block in watch if block.lstrip("= ").startswith("+58s"))
    text = dump[dump.index("Process 914:"):]
    (root,) = [f for f in roots(text) if f.exc_type == "Stack dump"]
    # The active thread is the one that matters: the miniature's child building the toy model's weights.
    assert root.message.startswith("MainThread stuck in _no_grad_normal_ (init.py:83)")
    assert "threads dumped" in root.message
    frames = root.first.exceptions[0].frames
    assert frames[-1].function == "_no_grad_normal_" and frames[0].function == "_run_module_as_main"
    assert frames[0].file == "<frozen runpy>"  # py-spy's name of a frozen module, space and all
