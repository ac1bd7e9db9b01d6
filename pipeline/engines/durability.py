"""Durability of the output against a power loss, kept off the engine's path.

A file under its final name is always whole for any reader on the same machine: the writers write a temporary
file and rename it last, so a killed process never leaves a partial file. Whether its data has reached the disk is
another matter, which only a power loss (or a kernel crash) can show. Three modes (``EngineOptions``):

* **periodic** (the default): a thread syncs the output's filesystem (``syncfs``) every ``--sync-interval``
  seconds. Before each sync it takes the *watermark*, how many samples, in the order of the data, have their files
  complete without a gap; after the sync it records that watermark in the manifest (``durable``) with the
  machine's boot id. The writers never wait for the disk;
* **each file** (``--sync-interval 0``): the writers fsync every file before its rename; the watermark is recorded
  the same way, without syncs;
* **none** (``--no-fsync``): no syncs; a watermark found in the manifest is kept (never raised).

Resume (``distrust_unsynced``): on the boot that wrote them, every complete file is trusted (the page cache holds
what a killed process wrote, and the kernel writes it back). After a restart (another boot id), the samples after
the recorded watermark are extracted again, whatever their files look like: a power loss costs the work since the
last sync, never a file that silently holds zeros.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from eaglewatch.pipeline import output

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
DURABLE_KEY = "durable"
# A complete file that may not have reached the disk: written after the last sync before a restart.
UNSYNCED = "unsynced"


def boot_id() -> str | None:
    """This boot of this machine (Linux); None where the kernel does not say."""
    try:
        return Path(BOOT_ID_PATH).read_text().strip() or None
    except OSError:
        return None


def sync_filesystem(folder: Path) -> None:
    """Write back every dirty page of the filesystem holding ``folder`` (``syncfs``; ``sync`` where there is none),
    data and names alike. Blocks this thread only: ctypes lets go of the GIL."""
    syncfs = _syncfs()
    if syncfs is None:
        os.sync()
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        if syncfs(fd) != 0:
            number = ctypes.get_errno()
            raise OSError(number, os.strerror(number), str(folder))
    finally:
        os.close(fd)


@functools.cache
def _syncfs() -> Any:
    libc_name = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(libc_name, use_errno=True), "syncfs", None) if libc_name else None


def write_json_durably(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` atomically and durably (temporary file, fsync, rename, fsync of the folder), in the format
    of ``output.write_manifest_file``: after a power loss the manifest is the old one or the new one, whole."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def recorded_watermark(manifest: dict[str, Any] | None) -> tuple[int, str | None] | None:
    """(samples, boot id) of the manifest's durable record; None when it has none. A damaged record counts as a
    watermark of 0 from an unknown boot: nothing it covers is trusted after a restart."""
    record = manifest.get(DURABLE_KEY) if manifest else None
    if record is None:
        return None
    if not isinstance(record, dict):
        return 0, None
    samples, boot = record.get("samples"), record.get("boot_id")
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 0:
        samples = 0
    return samples, boot if isinstance(boot, str) else None


def distrust_unsynced(manifest: dict[str, Any] | None, ids: list[str], status: dict[str, str]) -> int:
    """After a restart, mark the complete files past the manifest's watermark ``UNSYNCED`` (to be extracted again);
    return how many. ``ids`` are this run's samples in the order of the data, ``status`` each one's
    ``output.sample_status``."""
    recorded = recorded_watermark(manifest)
    if recorded is None:
        return 0
    watermark, boot = recorded
    now = boot_id()
    if boot is not None and boot == now:
        return 0
    count = 0
    for sample_id in ids[watermark:]:
        if status.get(sample_id) == output.COMPLETE:
            status[sample_id] = UNSYNCED
            count += 1
    return count


class Watermark:
    """How many of a run's samples, in the order of the data, have their files complete without a gap."""

    def __init__(self, done: list[bool]) -> None:
        self._done = done
        self.prefix = 0
        self._advance()

    def landed(self, index: int) -> None:
        self._done[index] = True
        self._advance()

    def _advance(self) -> None:
        while self.prefix < len(self._done) and self._done[self.prefix]:
            self.prefix += 1


class DurableSync:
    """The periodic sync, in a thread of its own, and the manifest's record of how far it reached.

    ``manifest`` is the dict the run writes to ``manifest_path``; this object owns its ``durable`` entry and writes
    the file after each sync (under ``lock``; the run writes it only before ``start`` and after ``close``).
    ``manifest_path`` None: the run leaves the manifest as it is (a subset run); the syncs still happen.
    """

    def __init__(self, folder: Path, mark: Watermark, manifest_path: Path | None, manifest: dict[str, Any],
                 interval_s: float, syncs: bool, clock: Callable[[], float] = time.time) -> None:
        self.folder, self.mark, self.manifest_path, self.manifest = folder, mark, manifest_path, manifest
        self.interval_s, self.syncs, self.clock = interval_s, syncs, clock
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self.count = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="eaglewatch-sync", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sync_once()
            except BaseException as exc:  # told to the run by check(); the next sync tries again
                self.error = exc

    def sync_once(self) -> None:
        # Taken before the sync: only files complete when it starts are surely covered by it.
        watermark = self.mark.prefix
        if self.syncs:
            sync_filesystem(self.folder)
        self.count += 1
        self.record(watermark)

    def record(self, watermark: int) -> None:
        if self.manifest_path is None:
            return
        with self.lock:
            self.manifest[DURABLE_KEY] = {"samples": watermark, "boot_id": boot_id(), "synced_at": self.clock()}
            write_json_durably(self.manifest_path, self.manifest)

    def check(self) -> None:
        """Raise the sync thread's error (a full disk while writing the manifest, say) in the caller's thread."""
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def close(self, final: bool) -> float:
        """Stop the thread; with ``final``, sync once more (every file of the run durable); return its seconds."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if not final:
            return 0.0
        started = time.monotonic()
        self.sync_once()
        return time.monotonic() - started
