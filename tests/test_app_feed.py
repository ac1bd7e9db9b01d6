"""The dashboard's IO loop (feed.follow_run) against the real local agent, without Textual."""

from __future__ import annotations

import threading
from pathlib import Path

from agent_support import PYTHON, collect, run_root, wait_for  # noqa: F401  (run_root: fixture)

from eaglewatch.tui.app.feed import follow_run
from eaglewatch.tui.connection import Connection
from eaglewatch.tui.runstate import RunModel

# A finished run with a long log and many events, like a real extraction's (one sample event per file).
NOISY_JOB = (
    "import json, os\n"
    "with open(os.environ['EAGLEWATCH_EVENTS_FILE'], 'a') as fh:\n"
    "    fh.write(json.dumps({'v': 1, 'kind': 'phase', 'phase': 'extracting'}) + '\\n')\n"
    "    for i in range(3000):\n"
    "        fh.write(json.dumps({'v': 1, 'kind': 'sample', 'id': f's{i}', 'tokens': 1024}) + '\\n')\n"
    "    fh.write(json.dumps({'v': 1, 'kind': 'phase', 'phase': 'done'}) + '\\n')\n"
    "for i in range(20000):\n"
    "    print(f'line {i} ' + 'x' * 60)\n"
)


def test_reattaching_to_a_long_finished_run_delivers_all_of_it(run_root: Path) -> None:
    # The watch request's answer comes behind the run's first batches on the same link: they must not wait on the
    # loop that is itself waiting for that answer (it hung, now and then, with a bounded hand-off queue).
    with Connection("local", run_root=str(run_root)) as connection:
        run = connection.launch([PYTHON, "-c", NOISY_JOB])["run"]
        size = len(bytes(collect(connection.watch(run)).log))
    for attempt in range(3):
        with Connection("local", run_root=str(run_root)) as connection:
            model = RunModel("local")
            stop = threading.Event()
            worker = threading.Thread(target=follow_run, args=(connection, model, run, stop.is_set), daemon=True)
            worker.start()
            try:
                # The events and the log come on separate streams: the phase is no sign that the log is all in.
                wait_for(lambda model=model: model.snapshot().phase == "done" and model.snapshot().log_bytes == size,
                         timeout_s=60, step_s=0.05, what=f"the whole run (attempt {attempt})")
            finally:
                view = model.snapshot()
                stop.set()
                worker.join(30)
            assert (view.phase, view.log_bytes, view.phases_seen) == ("done", size, ("extracting", "done")), attempt


class AnswerAfterBatches:
    """The one ordering the real agent produces only now and then, made certain: the watch's answer arrives behind
    ``batches`` batches that the reader thread hands to the callback first. Only what follow_run calls is here."""

    def __init__(self, batches: int) -> None:
        import queue

        self.batches = batches
        self.host_items: queue.Queue = queue.Queue()
        self.endpoint = "remote"
        self.reader_done = threading.Event()

    def status(self, run: str) -> dict:
        return {"run": run, "state": "exited", "exit": {"code": 0}}

    def gpu_history(self, run: str, limit: int) -> list:
        return []

    def telemetry(self, interval_s: float) -> dict:
        return {"available": False}

    def watch(self, run: str, callback):
        from eaglewatch.tui.connection import LogChunk
        from eaglewatch.tui.connection.stream import RunWatch

        watch = RunWatch(run, callback=callback)

        def reader() -> None:  # the link's reader: it cannot read the answer until each callback has returned
            for i in range(self.batches):
                callback([LogChunk(run, i * 6, f"l{i:04d}\n".encode())])
            self.reader_done.set()

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        if not self.reader_done.wait(30):
            raise TimeoutError("the watch's answer never came: the reader is stuck in the callback")
        watch.finished.set()
        return watch

    def unwatch(self, watch) -> None:
        watch.cancelled.set()


def test_batches_that_come_before_the_watchs_answer_do_not_block_the_reader() -> None:
    from eaglewatch.tui.app.feed import MAX_PENDING_BATCHES

    connection = AnswerAfterBatches(batches=4 * MAX_PENDING_BATCHES)
    model = RunModel("h")
    stop = threading.Event()
    errors: list[BaseException] = []

    def follow() -> None:
        try:
            follow_run(connection, model, "r", stop.is_set)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    worker = threading.Thread(target=follow, daemon=True)
    worker.start()
    try:
        wait_for(lambda: errors or model.snapshot().lines >= connection.batches, what="every batch in the model")
    finally:
        stop.set()
        worker.join(30)
    assert errors == [] and model.snapshot().lines == connection.batches
    assert [line.text for line in model.log_since(0)][:2] == ["l0000", "l0001"]
