"""A local run's free disk is measured where the job says it writes (its `info` event's `output_dir`), not where
its arguments seem to point; until it has said so, at the run directory."""

from __future__ import annotations

import queue
import threading
import time

from eaglewatch import protocol as p
from eaglewatch.tui.app import feed
from eaglewatch.tui.messages import Event
from eaglewatch.tui.runstate import RunModel


class LocalRunThatNamesItsFolder:
    """What follow_run calls of a connection, for one local run whose job says where it writes once ``say`` is
    set."""

    endpoint = None  # local

    def __init__(self, run_dir: str, output_dir: str) -> None:
        self.host_items: queue.Queue = queue.Queue()
        self.run_dir = run_dir
        self.output_dir = output_dir
        self.say = threading.Event()

    def status(self, run: str) -> dict:
        return {"run": run, "state": "running", "run_dir": self.run_dir,
                "argv": ["eaglewatch", "demo", "--workdir", "/from/argv"]}

    def gpu_history(self, run: str, limit: int = 60) -> list:
        return []

    def telemetry(self, interval_s: float) -> dict:
        return {"available": False}

    def watch(self, run: str, *, log_offset: int = 0, events_offset: int = 0, callback=None):
        from eaglewatch.tui.connection.stream import RunWatch

        watch = RunWatch(run, callback=callback)

        def job() -> None:
            self.say.wait(10)
            callback([Event(run, 0, 1, p.make_event(p.EVENT_INFO, output_dir=self.output_dir))])

        threading.Thread(target=job, daemon=True).start()
        return watch

    def unwatch(self, watch) -> None:
        watch.cancelled.set()


def test_the_disk_is_measured_at_the_folder_the_job_names(tmp_path, monkeypatch):
    measured: list[str] = []
    monkeypatch.setattr(feed, "DISK_EVERY_S", 0.0)
    monkeypatch.setattr(feed, "local_disk", lambda path: measured.append(path) or (1, 2))
    connection = LocalRunThatNamesItsFolder(str(tmp_path / "run"), str(tmp_path / "out"))
    model = RunModel("local")
    stop = threading.Event()
    worker = threading.Thread(target=feed.follow_run, args=(connection, model, "r", stop.is_set), daemon=True)
    worker.start()
    try:
        deadline = time.monotonic() + 20
        while not measured and time.monotonic() < deadline:
            time.sleep(0.01)
        assert measured and set(measured) == {str(tmp_path / "run")}  # the run directory, argv unread
        connection.say.set()
        while measured[-1] != str(tmp_path / "out") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert measured[-1] == str(tmp_path / "out")
        assert model.snapshot().extraction.disk_free == 1
    finally:
        stop.set()
        worker.join(10)
