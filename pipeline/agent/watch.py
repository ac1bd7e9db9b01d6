"""Wake up when a file in a watched folder changes: inotify through ctypes on Linux, a short poll elsewhere.

inotify is what keeps a line's latency to the operator near that of ``tail -F`` while an idle log costs no CPU.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE

POLL_INTERVAL_S = 0.05


class DirWatcher:
    """wait(timeout) returns when a watched folder changed, wake() was called, or the timeout passed."""

    def __init__(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._fd = -1
        self._wds: dict[str, int] = {}
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            self._add = libc.inotify_add_watch
            self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            self._rm = libc.inotify_rm_watch
            self._rm.argtypes = [ctypes.c_int, ctypes.c_int]
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
            self._fd = fd if fd >= 0 else -1
        except (OSError, AttributeError):
            self._fd = -1

    @property
    def uses_inotify(self) -> bool:
        return self._fd >= 0

    def add(self, path: str) -> None:
        if self._fd < 0 or path in self._wds:
            return
        wd = self._add(self._fd, os.fsencode(path), _MASK)
        if wd >= 0:
            self._wds[path] = wd

    def remove(self, path: str) -> None:
        wd = self._wds.pop(path, None)
        if wd is not None and self._fd >= 0 and wd not in self._wds.values():
            self._rm(self._fd, wd)

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    def wait(self, timeout: float) -> None:
        fds = [self._wake_r] + ([self._fd] if self._fd >= 0 else [])
        if self._fd < 0:
            timeout = min(timeout, POLL_INTERVAL_S)
        ready, _, _ = select.select(fds, [], [], max(0.0, timeout))
        for fd in ready:
            self._drain(fd)

    @staticmethod
    def _drain(fd: int) -> None:
        try:
            while os.read(fd, 65536):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        for fd in (self._fd, self._wake_r, self._wake_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fd = -1

