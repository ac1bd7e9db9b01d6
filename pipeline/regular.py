"""Opening a file that a user, a download or another run put there: regular files only, read with a bound.

A model folder's ``config.json``, a shard, a manifest or a sample file can be a FIFO (whose open waits for a writer
that never comes), a device (``/dev/zero`` never ends) or a file far larger than what it claims to be. Every such read
on the GPU side goes through :func:`open_regular` or :func:`read_regular`: the ``stat`` first keeps a device from being
opened at all, ``O_NONBLOCK`` keeps a FIFO swapped in after it from blocking the open, and ``fstat`` checks what was
opened. What is not a regular file raises :class:`NotRegularFile`, an ``OSError`` whose text names what it is, so the
callers' "cannot read" paths say it in their one line.

Standard library only.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


class NotRegularFile(OSError):
    """``path`` is there but is not a regular file; ``kind`` says what it is ("a FIFO")."""

    def __init__(self, path: str | os.PathLike[str], kind: str) -> None:
        super().__init__(errno.EINVAL, f"it is {kind}, not a regular file", os.fspath(path))
        self.kind = kind


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading in binary, when it is a regular file (links followed); NotRegularFile else."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegularFile(path, _kind(mode))
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, _kind(mode))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The whole of the regular file ``path``; OSError (EFBIG) when it holds more than ``limit`` bytes."""
    with open_regular(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"it holds more than {limit} bytes, far more than such a file does", os.fspath(path))
    return data


__all__ = ["NotRegularFile", "open_regular", "read_regular"]
