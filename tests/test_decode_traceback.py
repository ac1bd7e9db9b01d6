"""Traceback assembly, mostly on tracebacks that a real Python prints."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eaglewatch.decode.decoder import decode_bytes
from eaglewatch.decode.events import (
    FRAME_INTERNAL,
    FRAME_LIBRARY,
    FRAME_STDLIB,
    FRAME_USER,
    KIND_ABORT,
    KIND_FATAL,
    TracebackEvent,
)
from eaglewatch.decode.frames import frame_kind
from eaglewatch.decode.traceback import TracebackAssembler, exception_line, parse_group_block


def run_python(tmp_path: Path, source: str, *flags: str) -> bytes:
    """Run ``source`` in a fresh interpreter; return what it wrote to stderr."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(source))
    done = subprocess.run([sys.executable, *flags, str(script)], capture_output=True, timeout=60)
    return done.stderr


def tracebacks(data: bytes) -> list[TracebackEvent]:
    events, _ = decode_bytes(data)
    return [e for e in events if isinstance(e, TracebackEvent)]


def test_plain_traceback_from_a_real_interpreter(tmp_path: Path) -> None:
    stderr = run_python(tmp_path, """
        def load(path):
            return open(path).read()
        load("/nonexistent/model-00003-of-00008.safetensors")
    """)
    (tb,) = tracebacks(stderr)
    assert tb.exc_type == "FileNotFoundError"
    assert "model-00003-of-00008.safetensors" in tb.message
    assert [f.function for f in tb.frames] == ["<module>", "load"]
    inner = tb.innermost
    assert inner is not None and inner.line == 3 and inner.source == "return open(path).read()"
    assert inner.kind == FRAME_USER and tb.complete and not tb.survived


def test_chained_tracebacks_keep_every_link(tmp_path: Path) -> None:
    stderr = run_python(tmp_path, """
        def parse(x):
            return int(x)
        def load():
            try:
                parse("seven")
            except ValueError as exc:
                raise RuntimeError("config is broken") from exc
        def main():
            try:
                load()
            except RuntimeError:
                raise KeyError("during cleanup")
        main()
    """)
    (tb,) = tracebacks(stderr)
    assert [e.exc_type for e in tb.exceptions] == ["ValueError", "RuntimeError", "KeyError"]
    assert [e.link for e in tb.exceptions] == [None, "cause", "context"]
    assert tb.exceptions[0].innermost.function == "parse"  # type: ignore[union-attr]
    assert tb.message == "'during cleanup'"


def test_multi_line_message_and_empty_first_line(tmp_path: Path) -> None:
    stderr = run_python(tmp_path, """
        raise RuntimeError('''
                An attempt has been made to start a new process before the
                current process has finished its bootstrapping phase.

                    if __name__ == '__main__':
        ''')
    """)
    (tb,) = tracebacks(stderr + b"Command exited with non-zero status 1\n")
    assert tb.message.startswith("An attempt has been made to start a new process before the\ncurrent process")
    assert "if __name__ == '__main__':" in tb.message
    assert "Command exited" not in tb.message


def test_recursion_is_summarised_and_kept_bounded(tmp_path: Path) -> None:
    stderr = run_python(tmp_path, """
        import sys
        sys.setrecursionlimit(400)
        def down(n):
            return down(n + 1)
        down(0)
    """)
    (tb,) = tracebacks(stderr)
    assert tb.exc_type == "RecursionError"
    assert "[Previous line repeated" in tb.text
    assert tb.innermost is not None and tb.innermost.function == "down"


def test_syntax_error_is_a_traceback(tmp_path: Path) -> None:
    # In the main script Python prints no "Traceback" line and the frame names no function.
    stderr = run_python(tmp_path, "import json\nx = (1,\n")
    (tb,) = tracebacks(stderr)
    assert tb.exc_type == "SyntaxError" and tb.innermost is not None and tb.innermost.line == 2
    assert tb.innermost.source == "x = (1,"
    (tmp_path / "broken.py").write_text("def f(:\n    pass\n")
    stderr = run_python(tmp_path, "import sys\nsys.path.insert(0, %r)\nimport broken\n" % str(tmp_path))
    (tb,) = tracebacks(stderr)
    assert tb.exc_type == "SyntaxError" and [f.function for f in tb.frames] == ["<module>", None]


def test_exception_group_from_a_real_task_group(tmp_path: Path) -> None:
    if sys.version_info < (3, 11):
        pytest.skip("ExceptionGroup needs Python 3.11")
    stderr = run_python(tmp_path, """
        import asyncio
        def inner():
            raise ValueError("bad value")
        def f2():
            try:
                inner()
            except ValueError as e:
                raise KeyError("k") from e
        async def a():
            raise OSError(28, "No space left on device")
        async def b():
            f2()
        async def c():
            raise ExceptionGroup("nested", [TypeError("t1"), RuntimeError("r1")])
        async def main():
            async with asyncio.TaskGroup() as g:
                g.create_task(a()); g.create_task(b()); g.create_task(c())
        asyncio.run(main())
    """)
    (tb,) = tracebacks(stderr)
    assert tb.exc_type == "ExceptionGroup" and "3 sub-exceptions" in tb.message
    leaves = tb.final.sub_exceptions
    assert [leaf.exc_type for leaf in leaves] == ["OSError", "KeyError", "TypeError", "RuntimeError"]
    assert leaves[0].innermost is not None and leaves[0].innermost.function == "a"
    assert leaves[1].innermost is not None and leaves[1].innermost.function == "f2"


def test_exception_group_block_parser_on_bare_leaves() -> None:
    block = [
        "  + Exception Group Traceback (most recent call last):",
        '  |   File "x.py", line 1, in <module>',
        '  |     raise ExceptionGroup("two", [ValueError(1), TypeError(2)])',
        "  | ExceptionGroup: two (2 sub-exceptions)",
        "  +-+---------------- 1 ----------------",
        "    | ValueError: 1",
        "    +---------------- 2 ----------------",
        "    | TypeError: 2",
        "    +------------------------------------",
    ]
    top = parse_group_block(block)[0]
    assert (top.exc_type, top.message) == ("ExceptionGroup", "two (2 sub-exceptions)")
    assert [(s.exc_type, s.message) for s in top.sub_exceptions] == [("ValueError", "1"), ("TypeError", "2")]


def test_faulthandler_dump_from_a_real_segfault(tmp_path: Path) -> None:
    stderr = run_python(tmp_path, """
        import ctypes
        def crash():
            ctypes.string_at(0)
        crash()
    """, "-X", "faulthandler")
    assert b"Fatal Python error: Segmentation fault" in stderr
    (tb,) = tracebacks(stderr)
    assert tb.kind == KIND_FATAL and tb.signal == "SIGSEGV"
    assert (tb.exc_type, tb.message) == ("Fatal Python error", "Segmentation fault")
    # Stored most recent call last, like a traceback: the crashing call is innermost.
    assert [f.function for f in tb.frames][-2:] == ["crash", "string_at"]


def test_logged_traceback_with_header_on_every_line() -> None:
    """A logging formatter that repeats its header on each line, as vLLM's does."""

    class EveryLine(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            text = super().format(record)
            head = f"{record.levelname} 11-30 01:29:02 [{record.filename}:{record.lineno}] "
            return "\n".join(head + line for line in text.splitlines())

    stream = __import__("io").StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(EveryLine("%(message)s"))
    log = logging.getLogger("decode-test-every-line")
    log.addHandler(handler)
    log.propagate = False
    try:
        raise AssertionError
    except AssertionError:
        log.exception("WorkerProc failed to start.")
    log.info("Parent process exited, terminating worker queues")
    data = "".join(f"(Worker_TP1 pid=99) {line}\n" for line in stream.getvalue().splitlines()).encode()
    (tb,) = tracebacks(data)
    assert tb.lane == "Worker_TP1" and tb.level == "ERROR" and tb.context == "WorkerProc failed to start."
    assert tb.exc_type == "AssertionError" and tb.message == ""
    assert tb.innermost is not None and tb.innermost.source == "raise AssertionError"


def test_traceback_interleaved_with_other_lanes_and_foreign_lines() -> None:
    data = (
        b"Traceback (most recent call last):\n"
        b'  File "/srv/run.py", line 5, in <module>\n'
        b"(Worker pid=2) INFO 11-30 01:29:02 [x.py:1] unrelated\n"
        b"    main()\n"
        b"Triton is installed, but doesn't include CPU backend. Disabling Triton.\n"
        b'  File "/srv/run.py", line 3, in main\n'
        b"    raise ValueError('x')\n"
        b"ValueError: x\n"
    )
    (tb,) = tracebacks(data)
    assert tb.lane == "main" and [f.line for f in tb.frames] == [5, 3] and tb.message == "x"
    assert "Triton" not in tb.text


def test_worker_printing_the_same_traceback_twice_gives_two_events() -> None:
    tb = [
        "Traceback (most recent call last):",
        '  File "/opt/venv/lib/python3.11/site-packages/vllm/a.py", line 1, in f',
        "    g()",
        "RuntimeError: boom",
    ]
    lines = ["WorkerProc hit an exception."] + tb + tb + [""]
    data = "".join(f"(Worker pid=5) ERROR 11-30 01:29:02 [multiproc_executor.py:1063] {line}\n" for line in lines)
    found = tracebacks(data.encode())
    assert [t.message for t in found] == ["boom", "boom"]
    assert found[0].context == "WorkerProc hit an exception."


def test_traceback_logged_at_warning_is_survived() -> None:
    data = (
        b"(APIServer pid=1) WARNING 09-09 09:00:05 [api_server.py:912] Failed to warm up.\n"
        b"(APIServer pid=1) WARNING 09-09 09:00:05 [api_server.py:912] Traceback (most recent call last):\n"
        b'(APIServer pid=1) WARNING 09-09 09:00:05 [api_server.py:912]   File "/x/chat_utils.py", line 3, in f\n'
        b"(APIServer pid=1) WARNING 09-09 09:00:05 [api_server.py:912] ValueError: no chat template\n"
        b"(APIServer pid=1) INFO 09-09 09:00:06 [launcher.py:80] serving\n"
    )
    (tb,) = tracebacks(data)
    assert tb.survived and tb.level == "WARNING"


def test_exception_ignored_is_survived_and_process_preamble_names_the_origin() -> None:
    data = (
        b"Exception ignored in: <function Pool.__del__ at 0x7f>\n"
        b"Traceback (most recent call last):\n"
        b'  File "/usr/lib/python3.12/multiprocessing/pool.py", line 268, in __del__\n'
        b"ResourceWarning: unclosed running multiprocessing pool\n"
        b"Process EngineCore_DP0:\n"
        b"Traceback (most recent call last):\n"
        b'  File "/usr/lib/python3.12/multiprocessing/process.py", line 314, in _bootstrap\n'
        b"    self.run()\n"
        b"Exception: WorkerProc initialization failed\n"
    )
    first, second = tracebacks(data)
    assert first.survived and not second.survived
    assert second.origin == "EngineCore_DP0" and second.who == "EngineCore_DP0"


def test_cut_short_traceback_is_reported_incomplete() -> None:
    data = b'Traceback (most recent call last):\n  File "/srv/a.py", line 1, in f\n    g()\n'
    (tb,) = tracebacks(data)
    assert not tb.complete and tb.exc_type == "" and tb.innermost is not None


def test_cpp_terminate_with_what_and_raise_site() -> None:
    data = (
        b"terminate called after throwing an instance of 'c10::Error'\n"
        b"  what():  CUDA error: an illegal memory access was encountered\n"
        b"CUDA kernel errors might be asynchronously reported at some other API call.\n"
        b"Exception raised from c10_cuda_check_implementation at /pytorch/c10/cuda/CUDAException.cpp:43 "
        b"(most recent call first):\n"
        b"frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98 (0x7f in /x/libc10.so)\n"
        b"frame #1: <unknown function> + 0x1 (0x7f in /x/libc10_cuda.so)\n"
        b"\n"
        b"next unrelated line\n"
    )
    (tb,) = tracebacks(data)
    assert tb.kind == KIND_ABORT and tb.exc_type == "c10::Error"
    assert tb.message.startswith("CUDA error: an illegal memory access was encountered")
    inner = tb.innermost
    assert inner is not None and (inner.file, inner.line) == ("/pytorch/c10/cuda/CUDAException.cpp", 43)
    assert "next unrelated" not in tb.text


def test_assembler_flush_ends_an_open_traceback() -> None:
    asm = TracebackAssembler("main")
    for line in ["Traceback (most recent call last):", '  File "a.py", line 1, in f', "KeyError: 'x'"]:
        assert asm.feed(line, None, None, None, 0) == []
    assert asm.awaiting_more
    (tb,) = asm.flush()
    assert tb.exc_type == "KeyError" and not asm.active


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("ValueError: bad", ("ValueError", "bad", True)),
        ("AssertionError", ("AssertionError", "", False)),
        ("RuntimeError: ", ("RuntimeError", "", True)),
        ("vllm.v1.engine.exceptions.EngineDeadError: dead",
         ("vllm.v1.engine.exceptions.EngineDeadError", "dead", True)),
        ("numpy.core._exceptions._ArrayMemoryError: Unable",
         ("numpy.core._exceptions._ArrayMemoryError", "Unable", True)),
        ("ray.exceptions.RayTaskError(RuntimeError): ray::RayWorkerWrapper.execute_method() (pid=7)",
         ("ray.exceptions.RayTaskError(RuntimeError)", "ray::RayWorkerWrapper.execute_method() (pid=7)", True)),
        # a module's own error class, lower-case or plain "Error" (set 17: TencentARC/SmartEdit#37)
        ("struct.error: unpack_from requires a buffer of at least 5 bytes for unpacking 5 bytes at offset 0",
         ("struct.error", "unpack_from requires a buffer of at least 5 bytes for unpacking 5 bytes at offset 0", True)),
        ("binascii.Error: Incorrect padding", ("binascii.Error", "Incorrect padding", True)),
        ("socket.gaierror: [Errno -2] Name or service not known",
         ("socket.gaierror", "[Errno -2] Name or service not known", True)),
        ("Error: something", None),
        ("error: something", None),
        ("self.error: Optional[str] = None", None),
        ("Triton is installed, but not here", None),
        ("WARNING: something", None),
        ("    ValueError: indented", None),
        ("done", None),
    ],
)
def test_exception_line(line: str, expected: object) -> None:
    assert exception_line(line) == expected


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/opt/venv/lib/python3.11/site-packages/vllm/v1/core.py", FRAME_LIBRARY),
        ("/usr/lib/python3/dist-packages/yaml/__init__.py", FRAME_LIBRARY),
        ("/usr/local/lib/python3.11/contextlib.py", FRAME_STDLIB),
        ("/root/.pyenv/versions/3.11.7/lib/python3.11/asyncio/runners.py", FRAME_STDLIB),
        ("<frozen runpy>", FRAME_INTERNAL),
        ("<string>", FRAME_INTERNAL),
        ("/srv/eagle/scripts/run_vllm.py", FRAME_USER),
        ("/opt/venv/lib/python3.11/site-packages/eaglewatch/pipeline/extract.py", FRAME_USER),
        ("/data/src/vllm/vllm/v1/worker/gpu_worker.py", FRAME_LIBRARY),
        ("/srv/vllm/run.py", FRAME_USER),
        ("/pytorch/c10/cuda/CUDAException.cpp", FRAME_INTERNAL),
    ],
)
def test_frame_kinds(path: str, kind: str) -> None:
    assert frame_kind(path) == kind
