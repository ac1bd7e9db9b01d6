"""Stacks of a run's processes, grouped (eaglewatch/decode/stackgroups.py): dumps read, groups, parting frame, text."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from eaglewatch.decode.stackgroups import (
    PARTS_WORDS,
    blocking_frame,
    group,
    label,
    main_thread,
    parse_dump,
    render,
    summary,
    where,
)

WATCH = Path(__file__).parent / "fixtures" / "gpu" / "h200_first_sign_1203" / "ours-cold" / "ours-cold.watch.txt"

FAULTHANDLER_SCRIPT = textwrap.dedent("""\
    import faulthandler, threading
    ready, done = threading.Event(), threading.Event()
    def helper():
        ready.set()
        done.wait(30)
    t = threading.Thread(target=helper, name="helper")
    t.start()
    ready.wait(30)
    def outer():
        inner()
    def inner():
        faulthandler.dump_traceback(all_threads=True)
    outer()
    done.set()
    t.join()
""")


def fr(func: str, file: str, line: int) -> dict:
    return {"func": func, "file": file, "line": line}


def proc(pid: int, rank, frames_outer_first: list[dict], role: str = "", **extra) -> dict:
    """A record; frames given outermost first, stored innermost first as the agent sends them."""
    threads = [{"name": "MainThread", "current": False, "frames": list(reversed(frames_outer_first))}]
    threads += extra.pop("others", [])
    return {"pid": pid, "role": role, "rank": rank, "cmdline": "python -m worker", "state": "S (sleeping)",
            "wchan": "futex_wait_queue", "method": "py-spy", "note": "", "threads": threads, **extra}


BASE = [fr("<module>", "/app/run.py", 5), fr("worker_main", "/v/multiproc_executor.py", 512),
        fr("worker_busy_loop", "/v/multiproc_executor.py", 540)]
COLLECTIVE = BASE + [fr("execute_model", "/v/gpu_worker.py", 301),
                     fr("all_reduce", "/x/torch/distributed/distributed_c10d.py", 2050)]
LOADING = BASE + [fr("load_model", "/v/gpu_worker.py", 220), fr("load_weights", "/v/loader.py", 88)]


def eight_ranks() -> list[dict]:
    helper = {"name": "Thread-1", "current": False,
              "frames": [fr("wait", "/usr/lib/python3.12/threading.py", 359), fr("run", "/v/heartbeat.py", 40)]}
    procs = [proc(1000 + r, r, COLLECTIVE, f"worker TP {r}", others=[helper]) for r in range(7)]
    procs.append(proc(1007, 7, LOADING, "worker TP 7"))
    return list(reversed(procs))  # any order in


# --- reading dumps ---------------------------------------------------------------------------------------------


def test_a_real_faulthandler_dump_is_read_and_its_main_thread_is_the_last_listed() -> None:
    done = subprocess.run([sys.executable, "-c", FAULTHANDLER_SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    threads = parse_dump("junk before\n" + done.stderr + "junk after\n")
    assert len(threads) == 2
    main = main_thread(threads)
    assert main is threads[-1] and main["current"]
    assert [f["func"] for f in main["frames"]] == ["inner", "outer", "<module>"]
    assert main["frames"][0]["file"] == "<string>" and isinstance(main["frames"][0]["line"], int)
    helper = threads[0]
    assert helper["name"].startswith("0x") and not helper["current"]
    frame = blocking_frame(helper)
    assert frame is not None and frame["func"] == "helper"  # past threading's waits
    assert where(helper).startswith("waiting in wait (threading.py:") and where(helper).endswith("under helper (<string>:5)")
    assert where(main) == "inner (<string>:12)"


def test_faulthandler_heads_with_a_thread_name_and_a_lone_stack() -> None:
    text = ('Thread 0x00007f00000000aa [worker] (most recent call first):\n'
            '  File "/a.py", line 3 in spin\n'
            'Thread 0x00007f00000000bb [python3] (most recent call first):\n'
            '  File "/b.py", line 9 in main\n')
    threads = parse_dump(text)
    assert [t["name"] for t in threads] == ["worker", "python3"]
    assert main_thread(threads) is threads[-1]  # ids in faulthandler's form: the last is the main thread
    (lone,) = parse_dump('Stack (most recent call first):\n  File "/b.py", line 9 in main\n')
    assert lone["current"] and lone["frames"] == [fr("main", "/b.py", 9)]


def py_spy_dump_of(pid: int) -> str:
    """The first py-spy dump of one process in the watch log: from its ``Process N:`` line to the next process's."""
    lines = WATCH.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"Process {pid}: "))
    end = next(i for i in range(start + 1, len(lines))
               if lines[i].startswith(("Process ", "=== ")))
    return "\n".join(lines[start:end])


def test_a_real_py_spy_dump_is_read() -> None:
    threads = parse_dump(py_spy_dump_of(915))
    assert [t["name"] for t in threads] == ["MainThread", "miniature"]
    main = main_thread(threads)
    assert main is threads[0]
    assert main["frames"][0] == fr("Thread._wait_for_tstate_lock", "threading.py", 1167)
    assert main["frames"][-1] == fr("_run_module_as_main", "<frozen runpy>", 198)
    assert where(main) == ("waiting in Thread._wait_for_tstate_lock (threading.py:1167) "
                           "under MiniatureRun.wait (miniature_run.py:139)")
    assert where(threads[1]) == ("waiting in EpollSelector.select (selectors.py:468) "
                                 "under MiniatureRun._run_child (miniature_run.py:242)")
    (child,) = parse_dump(py_spy_dump_of(918))
    assert child["current"] and where(child) == "_no_grad_normal_ (init.py:83)"


def test_a_whole_log_with_py_spy_s_errors_and_ps_output_between_the_dumps_keeps_only_threads() -> None:
    threads = parse_dump(WATCH.read_text())
    assert len(threads) > 20 and sum(len(t["frames"]) for t in threads) > 200
    assert all(isinstance(f["line"], int) and f["func"] and f["file"] for t in threads for f in t["frames"])
    # A dump cut short after a thread's head: the thread is kept, with no frames.
    cut = next(t for t in threads if t["name"] == "Thread-1 (_report_usage_worker)")
    assert cut["frames"] == [] and where(cut) == "no Python frames" and blocking_frame(cut) is None


# --- grouping --------------------------------------------------------------------------------------------------


def test_seven_ranks_in_a_collective_and_one_still_loading_part_at_the_frame_after_the_loop() -> None:
    groups = group(eight_ranks())
    assert [g.label for g in groups] == ["ranks 0–6", "rank 7"]
    assert [p["rank"] for p in groups[0].processes] == list(range(7))
    assert groups[0].role == "worker TP 0–6" and groups[1].role == "worker TP 7"
    assert groups[0].where == "all_reduce (distributed_c10d.py:2050)"
    assert groups[1].where == "load_weights (loader.py:88)"
    assert groups[0].frames[0]["func"] == "<module>" and groups[0].frames[-1]["func"] == "all_reduce"
    assert groups[0].parts_at == groups[1].parts_at == 3
    assert groups[0].frames[3]["func"] == "execute_model" and groups[1].frames[3]["func"] == "load_model"


def test_one_group_has_no_parting_frame_and_a_shorter_stack_parts_at_its_innermost() -> None:
    (only,) = group([proc(1, 0, COLLECTIVE), proc(2, 1, COLLECTIVE)])
    assert only.parts_at is None and only.label == "ranks 0, 1"
    shallow, deep = group([proc(1, 0, BASE), proc(2, 1, COLLECTIVE)])
    assert shallow.parts_at == 2 and deep.parts_at == 3


def test_labels() -> None:
    assert label([{"rank": r, "pid": 10 + r} for r in (0, 2, 5)]) == "ranks 0, 2, 5"
    assert label([{"rank": r, "pid": r} for r in (3, 0, 1, 2, 7)]) == "ranks 0–3, 7"
    assert label([{"rank": None, "pid": 4242}]) == "pid 4242"
    assert label([{"rank": None, "pid": 11}, {"rank": None, "pid": 12}]) == "pids 11, 12"
    assert label([{"rank": 0, "pid": 5}, {"rank": None, "pid": 9}]) == "rank 0, pid 9"


def test_processes_without_a_python_stack_group_by_state() -> None:
    def bare(pid: int, note: str = "not a Python process") -> dict:
        return {"pid": pid, "role": "python", "rank": None, "cmdline": "bash run.sh", "state": "S (sleeping)",
                "wchan": "futex_wait_queue", "method": "proc", "note": note, "threads": []}

    groups = group([bare(99), bare(98), bare(97, "py-spy: permission denied"), proc(5, 0, COLLECTIVE)])
    assert [g.label for g in groups] == ["rank 0", "pid 97", "pids 98, 99"]
    assert groups[0].parts_at is None  # the only group with frames
    lines = render(groups)
    assert "pids 98, 99 · python · 2 processes · no Python stack (not a Python process) · "\
           "S (sleeping) in futex_wait_queue" in lines
    assert "pid 97 · python · no Python stack (py-spy: permission denied) · S (sleeping) in futex_wait_queue" in lines
    assert "    $ bash run.sh" in lines
    assert summary(groups).endswith("pids 98, 99: no Python stack (not a Python process)")


# --- text ------------------------------------------------------------------------------------------------------


def test_render_marks_the_parting_frame_and_summarises_other_threads() -> None:
    lines = render(group(eight_ranks()))
    assert lines[0] == "ranks 0–6 · worker TP 0–6 · 7 processes · stuck in all_reduce (distributed_c10d.py:2050)"
    assert lines[1] == "    <module> (run.py:5)"
    marked = [line for line in lines if PARTS_WORDS in line]
    assert marked == ["  ▶ execute_model (gpu_worker.py:301)   ← parts here",
                      "  ▶ load_model (gpu_worker.py:220)   ← parts here"]
    assert lines[5] == "    all_reduce (distributed_c10d.py:2050)"
    assert lines[6] == "  + 7 other threads in 7 processes: 7 waiting in wait (threading.py:359) under run (heartbeat.py:40)"
    assert lines[7] == "rank 7 · worker TP 7 · stuck in load_weights (loader.py:88)"
    assert len(lines) == 13 and lines[-1] == "    load_weights (loader.py:88)"  # no other thread


def test_all_threads_prints_each_other_thread_with_its_frames() -> None:
    lines = render(group(eight_ranks()), all_threads=True)
    at = lines.index("  thread Thread-1 · ranks 0–6 · waiting in wait (threading.py:359) under run (heartbeat.py:40)")
    assert lines[at + 1:at + 3] == ["      run (heartbeat.py:40)", "      wait (threading.py:359)"]
    assert all(len(line) <= 40 for line in render(group(eight_ranks()), all_threads=True, width=40))


def test_a_long_stack_is_elided_but_keeps_its_parting_frame() -> None:
    deep = [fr(f"f{i}", "/app/deep.py", i) for i in range(40)]
    a = deep + [fr("all_reduce", "/x/distributed_c10d.py", 2050)]
    b = deep[:10] + [fr("other", "/app/other.py", 1)] + deep[10:] + [fr("all_reduce", "/x/distributed_c10d.py", 2050)]
    groups = group([proc(1, 0, a), proc(2, 1, b)])
    assert groups[0].parts_at == groups[1].parts_at == 10
    lines = render(groups[:1])
    stack = lines[1:]
    assert stack[:3] == ["    f0 (deep.py:0)", "    f1 (deep.py:1)", "    f2 (deep.py:2)"]
    assert stack[3] == "    … 7 frames …"
    assert stack[4] == "  ▶ f10 (deep.py:10)   ← parts here"
    assert stack[5] == "    … 18 frames …"
    assert len(stack) == 3 + 1 + 1 + 1 + 12 and stack[-1] == "    all_reduce (distributed_c10d.py:2050)"


def test_hostile_strings_are_shown_escaped() -> None:
    evil = "\x1b]52;c;cm0gLXJmIH4=\x07"
    record = proc(7, None, [fr("main" + evil, "/app/x\x1b[2J.py", 3)], role="python\x1b[31m",
                  cmdline="python \x1b]0;pwned\x07 x.py")
    record["threads"].append({"name": "t\x1b[1m", "current": False, "frames": [fr("spin\x1b", "/a.py", 1)]})
    bare = {"pid": 8, "rank": None, "role": "x", "state": "S\x1b[2J", "wchan": "w\x9b1m", "note": "n\u202eote",
            "cmdline": "sh\x1b", "threads": []}
    groups = group([record, bare])
    text = "\n".join(render(groups) + render(groups, all_threads=True) + [summary(groups)])
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text and "\u202e" not in text
    assert "␛]52;c;" in text and "python ␛]0;pwned\\x07 x.py" in text


def test_summary_is_one_line_cut_short() -> None:
    groups = group(eight_ranks())
    assert summary(groups) == "ranks 0–6: all_reduce (distributed_c10d.py:2050); rank 7: load_weights (loader.py:88)"
    many = group([proc(i, i, BASE + [fr(f"step{i}" * 5, "/app/s.py", i)]) for i in range(40)])
    line = summary(many)
    assert len(line) <= 300 and line.endswith("…") and "\n" not in line
