"""The miniature as a run of its own: started in the background, watched line by line, its verdict first.

``MiniatureRun`` builds the miniature (``miniature.prepare_miniature``), starts ``eaglewatch extract`` on it in a
child process, and reads that process's output as it comes:
- every line goes on to ``lane`` (the job's log) with the miniature's lane prefix on each of its pieces
  (``lane.py``), so its failures decode like the job's, and to a raw copy the root cause is decoded from; what the
  comparison with transformers prints in this process goes to ``lane`` the same way;
- its stages (``building``, ``starting``, ``loading the engine``, ``extracting``, ``comparing with transformers``)
  come from its own phase lines, each told to ``on_stage`` as it starts, and ``on_tick`` hears how it goes every
  few seconds in between, so that nothing is silent while it runs;
- vLLM's own timing lines are kept (``details["engine_timings"]``) to say where its minutes go.

The verdict, whether the engine path ran (``miniature``), comes as soon as the child process ends; the comparison
of its output with transformers (``miniature vs transformers``) follows and never delays it. Each reaches
``on_result``. The run's folder lives in the run directory when the agent launched the job, else in the temporary
directory; it is removed when the miniature ends, however it ends, and a folder left by a killed job is removed by
the next miniature on the host.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from eaglewatch.pipeline import proctree
from eaglewatch.protocol import COMPARISON_STAGE
from eaglewatch.pipeline.events import EVENTS_FILE_ENV
from eaglewatch.pipeline.model_info import ModelInfo
from eaglewatch.pipeline.plan import ExtractConfig
from eaglewatch.pipeline.prepared_data import Sample
from eaglewatch.pipeline.preflight.lane import LineSplitter, ThreadLane, lane_line
from eaglewatch.pipeline.preflight.miniature import (
    MiniatureLaunch, MiniatureResult, compare_miniature, judge_miniature, prepare_miniature,
)

FOLDER_PREFIX = "eaglewatch-miniature-"
COMPARISON = "miniature vs transformers"  # the check that follows a passed verdict
TICK_S = 5.0  # how often on_tick hears how a stage goes

# (a line of the miniature's output, the stage that begins there): its own phase lines.
STAGES: tuple[tuple[re.Pattern[bytes], str], ...] = (
    (re.compile(rb"\[eaglewatch\] miniature: building"), "building"),
    (re.compile(rb"\[eaglewatch\] phase: loading"), "loading the engine"),
    (re.compile(rb"\[eaglewatch\] phase: extracting"), "extracting"),
)
# (name, vLLM's line saying how long a part of its start took): where the engine's minutes go.
ENGINE_TIMINGS: tuple[tuple[str, re.Pattern[bytes]], ...] = (
    ("weights_s", re.compile(rb"Loading weights took ([\d.]+) seconds")),
    ("model_load_s", re.compile(rb"Model loading took [\d.]+ \w+ (?:memory )?and ([\d.]+) seconds")),
    ("compile_s", re.compile(rb"torch\.compile takes ([\d.]+) s in total")),
    ("profile_s", re.compile(rb"Memory profiling takes ([\d.]+) seconds")),
    ("graphs_s", re.compile(rb"Graph capturing finished in ([\d.]+) secs")),
    ("init_engine_s", re.compile(rb"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) seconds")),
)


@dataclass
class StageTimes:
    """Seconds from the miniature's start to the start of each stage, in order."""

    marks: list[tuple[str, float]]

    def durations(self, end: float) -> dict[str, float]:
        out = {}
        for i, (name, at) in enumerate(self.marks):
            until = self.marks[i + 1][1] if i + 1 < len(self.marks) else end
            out[name] = round(until - at, 2)
        return out


def miniature_root() -> Path:
    """Where miniature folders go: the run directory (the events file's folder) when the agent launched the job."""
    events_file = os.environ.get(EVENTS_FILE_ENV)
    return Path(events_file).parent if events_file else Path(tempfile.gettempdir())


def sweep_left_behind(root: Path) -> list[Path]:
    """Remove miniature folders whose job is gone (killed before it could remove them); return them."""
    removed: list[Path] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(FOLDER_PREFIX):
            continue
        pid = entry.name[len(FOLDER_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not proctree.alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


class MiniatureRun:
    """One miniature, in a thread of its own; see the module's text."""

    def __init__(self, cfg: ExtractConfig, info: ModelInfo, layer_ids: list[int], *, samples: int = 4,
                 data: Iterable[Sample] | None = None, timeout_s: float = 600, gpu_share: float | None = None,
                 lane: Callable[[bytes], None] | None = None,
                 on_stage: Callable[[str, str], None] | None = None,
                 on_tick: Callable[[str, float, str], None] | None = None,
                 on_result: Callable[[str, MiniatureResult], None] | None = None, compare: bool = True,
                 workdir: str | Path | None = None) -> None:
        self.cfg, self.info, self.layer_ids = cfg, info, layer_ids
        self.samples, self.data, self.timeout_s, self.gpu_share = samples, data, timeout_s, gpu_share
        self.lane, self.compare = lane, compare
        self.on_stage = on_stage or (lambda name, stage: None)  # (check name, stage)
        self.on_tick = on_tick
        self.on_result = on_result or (lambda name, result: None)
        self._workdir = Path(workdir) if workdir is not None else None
        self.verdict: MiniatureResult | None = None
        self.comparison: MiniatureResult | None = None
        self._verdict_ready = threading.Event()
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._body, name="miniature", daemon=True)
        self._started = 0.0

    # ------------------------------------------------------------------ control
    def start(self) -> "MiniatureRun":
        self._started = time.monotonic()
        self._thread.start()
        return self

    def wait_verdict(self, timeout: float | None = None) -> MiniatureResult | None:
        self._verdict_ready.wait(timeout)
        return self.verdict

    def wait(self, timeout: float | None = None) -> bool:
        """Until the comparison is done too (or the run stopped); False when ``timeout`` ran out first."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self) -> None:
        """Stop it, whatever it is doing: its processes end and its folder is removed."""
        self._stop.set()
        self._kill()
        self._thread.join(30)

    def pids(self) -> set[int]:
        """The miniature's processes now (its engine's included): never the job's to stop."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return set()
        return {proc.pid, *proctree.descendants(proc.pid)}

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------------ the thread
    def _body(self) -> None:
        root = miniature_root()
        base = self._workdir or root / f"{FOLDER_PREFIX}{os.getpid()}-{self.cfg.rank}"
        try:
            if self._workdir is None:
                sweep_left_behind(root)
                shutil.rmtree(base, ignore_errors=True)
            self._run(base)
        except BaseException as exc:  # never a silent thread: the verdict says what broke
            if self.verdict is None:
                self._give_verdict(MiniatureResult("warn", f"the miniature could not run here "
                                                   f"({type(exc).__name__}: {exc}); the checks above still ran",
                                                   {}, time.monotonic() - self._started))
        finally:
            self._kill()
            self._verdict_ready.set()
            if self._workdir is None:
                shutil.rmtree(base, ignore_errors=True)
            else:
                shutil.rmtree(base / "out", ignore_errors=True)
                shutil.rmtree(base / "model", ignore_errors=True)

    def _run(self, base: Path) -> None:
        marks: list[tuple[str, float]] = []

        def stage(name: str) -> None:
            marks.append((name, time.monotonic() - self._started))
            self.on_stage("miniature", name)

        stage("planning")
        launch = prepare_miniature(self.cfg, self.info, self.layer_ids, base, samples=self.samples, data=self.data,
                                   gpu_share=self.gpu_share)
        if isinstance(launch, MiniatureResult):  # the factory could not build it: a warning
            self._give_verdict(launch)
            return
        if self._stop.is_set():
            return
        code, timings = self._run_child(launch, base / "miniature.log", stage)
        if self._stop.is_set():
            return
        elapsed = time.monotonic() - self._started
        verdict = judge_miniature(launch, code, base / "miniature.log", elapsed, self.timeout_s)
        verdict.details["stages_s"] = StageTimes(marks).durations(elapsed)
        if timings:
            verdict.details["engine_timings"] = timings
        self._give_verdict(verdict)
        if verdict.status != "pass" or not self.compare or launch.engine != "vllm" or self._stop.is_set():
            return  # the transformers engine is the reference itself
        self.on_stage(COMPARISON, COMPARISON_STAGE)
        # The comparison loads the reference in this process, beside the job's own load: what it prints (the
        # bars of compressed-tensors' "Compressing model", a library's warnings) is the miniature's lane too.
        with ThreadLane(self.lane, os.getpid()) if self.lane is not None else contextlib.nullcontext():
            comparison = compare_miniature(launch, verdict, time.monotonic() - self._started)
        self.comparison = comparison
        self.on_result(COMPARISON, comparison)

    def _give_verdict(self, verdict: MiniatureResult) -> None:
        self.verdict = verdict
        self._verdict_ready.set()
        self.on_result("miniature", verdict)

    def _run_child(self, launch: MiniatureLaunch, log_path: Path,
                   stage: Callable[[str], None]) -> tuple[int | None, dict[str, float]]:
        """Run the miniature's extract; its exit code (None: timed out or stopped) and vLLM's timing lines."""
        env = {k: v for k, v in os.environ.items() if k != EVENTS_FILE_ENV}  # its events stay its own
        timings: dict[str, float] = {}
        with open(log_path, "wb") as raw:
            stage("starting")  # process start and imports (torch, vLLM): until its own phase lines come
            self._proc = proc = subprocess.Popen(launch.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL, env=env)
            assert proc.stdout is not None
            os.set_blocking(proc.stdout.fileno(), False)
            selector = selectors.DefaultSelector()
            selector.register(proc.stdout, selectors.EVENT_READ)
            splitter, last_line, current = LineSplitter(), "", "starting"
            next_tick = time.monotonic() + TICK_S
            deadline = time.monotonic() + self.timeout_s
            try:
                while not self._stop.is_set():
                    now = time.monotonic()
                    if now > deadline:
                        return None, timings
                    if self.on_tick is not None and now >= next_tick:
                        next_tick = now + TICK_S
                        self.on_tick(current, now - self._started, last_line)
                    if not selector.select(timeout=min(1.0, max(0.05, next_tick - now))):
                        continue
                    try:
                        data = os.read(proc.stdout.fileno(), 65536)
                    except BlockingIOError:
                        continue
                    lines = splitter.feed(data) if data else splitter.close()
                    for line in lines:
                        raw.write(line)
                        if self.lane is not None:
                            self.lane(lane_line(line, proc.pid))
                        for pattern, name in STAGES:
                            if pattern.search(line):
                                current = name
                                stage(name)
                        for key, pattern in ENGINE_TIMINGS:
                            found = pattern.search(line) if key not in timings else None
                            if found:  # the first: vLLM says it again for a draft model, not always right
                                timings[key] = float(found.group(1))
                        text = line.strip()
                        if text:
                            last_line = text.decode("utf-8", "replace")
                    raw.flush()
                    if not data:
                        return proc.wait(), timings
                return None, timings
            finally:
                selector.close()
                proc.stdout.close()

    def _kill(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proctree.stop([proc.pid, *proctree.descendants(proc.pid)])
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


def run_miniature(cfg: ExtractConfig, info: ModelInfo, layer_ids: list[int], *, samples: int = 4,
                  workdir: str | None = None, timeout_s: float = 600, data: Iterable[Sample] | None = None,
                  on_stage: Callable[[str], None] | None = None) -> MiniatureResult:
    """The miniature start to end, as one result: the verdict, or the comparison's word where the engine path ran
    and its output differs from transformers (a warning)."""
    told = on_stage or (lambda stage: None)
    run = MiniatureRun(cfg, info, layer_ids, samples=samples, data=data, timeout_s=timeout_s,
                       on_stage=lambda name, stage: told(stage) if name == "miniature" else None,
                       workdir=workdir).start()
    run.wait()
    verdict = run.verdict
    assert verdict is not None
    return combined(verdict, run.comparison)


def combined(verdict: MiniatureResult, comparison: MiniatureResult | None) -> MiniatureResult:
    if comparison is None or verdict.status != "pass":
        return verdict
    details: dict[str, Any] = {**verdict.details, **comparison.details}
    if comparison.status == "pass":
        return MiniatureResult("pass", verdict.reason, verdict.layer_map, comparison.seconds, None, None, details)
    return MiniatureResult(comparison.status, comparison.reason, verdict.layer_map, comparison.seconds, None,
                           comparison.root_cause, details)
