"""`eaglewatch decode` as a program: no heavy imports, --follow on a growing file, stdin."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from agent_support import blocked_in, wait_for

FIXTURES = Path(__file__).parent / "fixtures"

# Runs the real CLI with torch, vLLM, Textual, paramiko and friends made unimportable.
BLOCKED = ("torch", "vllm", "textual", "paramiko", "transformers", "numpy", "safetensors", "tqdm", "rich")
WRAPPER = f"""
import sys
BLOCKED = {BLOCKED!r}
for name in BLOCKED:
    sys.modules[name] = None  # "import name" now raises ImportError

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError("blocked in this test: " + name)
        return None

sys.meta_path.insert(0, Refuse())
from eaglewatch.cli import main
code = main(sys.argv[1:])
loaded = sorted(n for n in sys.modules if n.split(".")[0] in BLOCKED and sys.modules[n] is not None)
if loaded:
    print("heavy modules imported: " + ", ".join(loaded), file=sys.stderr)
    code = 3
sys.exit(code)
"""


def run_cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-c", WRAPPER, "decode", *args], input=stdin, capture_output=True,
                          timeout=60)


def test_decode_runs_without_torch_vllm_or_textual() -> None:
    done = run_cli(str(FIXTURES / "vllm-logs" / "crash_extract_pin_memory_runtime.log"), "--json")
    assert done.returncode == 0, done.stderr.decode()
    doc = json.loads(done.stdout)
    assert doc["failures"][0]["exc_type"] == "RuntimeError"
    assert doc["failures"][0]["message"].startswith("pin_memory=True requires a CUDA")


def test_decode_reads_stdin() -> None:
    data = (FIXTURES / "vllm-logs" / "crash_spawn_no_main_guard.log").read_bytes()
    done = run_cli("-", stdin=data)
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode()
    assert out.startswith("stdin: 158 lines")
    assert "Root cause: RuntimeError: An attempt has been made to start a new process" in out
    assert "hint: Script starts vLLM without a main guard" in out


def test_follow_reads_a_growing_file_and_summarises_on_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_bytes(b"")
    data = (FIXTURES / "vllm-logs" / "crash_weight_load_shape_mismatch.log").read_bytes()
    proc = subprocess.Popen([sys.executable, "-c", WRAPPER, "decode", str(log), "--follow", "--interval", "0.05"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.put(raw.decode())

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    seen: list[str] = []

    def wait_for_line(text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in seen):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"never saw {text!r}; got {seen}"
            try:
                seen.append(lines.get(timeout=remaining))
            except queue.Empty:
                pass

    try:
        half = len(data) // 2
        with open(log, "ab") as out:
            for start in range(0, half, 4096):
                out.write(data[start : min(start + 4096, half)])
                out.flush()
                time.sleep(0.01)
        wait_for_line("+ lane VllmWorker-0")
        with open(log, "ab") as out:
            out.write(data[half:])
        # The worker's AssertionError is reported while the file is still open, before any summary.
        wait_for_line("! failure [VllmWorker-0] AssertionError at parameter.py:225")
        proc.send_signal(signal.SIGTERM)
        wait_for_line("Root cause: AssertionError at parameter.py:225")
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=30)  # the process has exited: its output ends
    while not lines.empty():
        seen.append(lines.get())
    text = "".join(seen)
    assert "Failures (root cause first)" in text and "hint: Weight shape mismatch" in text


def read_to_the_end(pid: int, path: Path) -> bool:
    """Whether process pid has path open with its file position at the end of the file."""
    size = path.stat().st_size
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != os.path.realpath(path):
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as fh:
                position = int(fh.readline().split()[1])  # "pos:\t<offset>"
        except (OSError, ValueError, IndexError):
            continue
        if position == size:
            return True
    return False


def test_follow_json_prints_one_document_when_stopped(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_bytes((FIXTURES / "decode" / "dp_tp_cuda_oom.log").read_bytes())
    # A shell without job control starts background commands with SIGINT ignored, and Python then installs no
    # Ctrl-C handler: give the child the default, as a terminal would.
    proc = subprocess.Popen([sys.executable, "-c", WRAPPER, "decode", str(log), "--follow", "--json",
                             "--interval", "0.05"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # Stopped once it has read the whole file and sleeps between looks at it (so it is past its start-up and
        # inside the follow loop, where Ctrl-C means "summarise").
        wait_for(lambda: read_to_the_end(proc.pid, log) and blocked_in("sleep", proc.pid), timeout_s=60,
                 step_s=0.01, what="the follower idle at the end of the file")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    doc = json.loads(out)
    assert doc["failures"][0]["exc_type"] == "torch.OutOfMemoryError"
    assert doc["failures"][0]["count"] == 2


def test_help_lists_the_options() -> None:
    done = subprocess.run([sys.executable, "-c", WRAPPER, "decode", "--help"], capture_output=True, timeout=60,
                          env={**os.environ, "COLUMNS": "120"})
    assert done.returncode == 0
    text = done.stdout.decode()
    for option in ("LOGFILE", "--json", "--follow"):
        assert option in text
