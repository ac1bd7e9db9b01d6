"""A byte pipe to one agent process: a local subprocess, or a command on one SSH channel.

A link carries one agent's lifetime. When it dies the connection makes a new one; nothing is reused.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import secrets
import select
import shlex
import socket
import subprocess
import sys
import threading
from typing import Any, Protocol, Sequence, cast

from eaglewatch import protocol
from eaglewatch.safetext import safe_text
from eaglewatch.tui.connection import bundle
from eaglewatch.tui.connection.errors import AgentStartError, ConnectionFailed
from eaglewatch.tui.connection.ssh import SSHChain, SSHOptions, connect
from eaglewatch.tui.connection.target import Endpoint

TIMEOUT = object()  # what recv returns when nothing arrived in time

# The shell upload: $1 folder, $2 partial name, $3 final name, $4 expected SHA-256, $5 the host's Python, $6 the
# Python that prints a file's SHA-256. A partial that does not match is removed, never renamed into place.
_SHELL_INSTALL = (
    'umask 077 && mkdir -p -- "$1" && cd -- "$1" || exit 1; '
    'cat > "$2" || { rm -f -- "$2"; exit 1; }; '
    'got=$("$5" -c "$6" "$2") || { rm -f -- "$2"; exit 1; }; '
    'if [ "$got" != "$4" ]; then rm -f -- "$2"; '
    'echo "the uploaded agent does not match its SHA-256 (cut short, or altered)" >&2; exit 3; fi; '
    'chmod 644 "$2" && mv -f -- "$2" "$3" && pwd'
)
_SHA256_OF_FILE = "import hashlib,sys;print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())"

# The local agent, started so that the working directory cannot stand in for the package: ``python -m`` and
# ``python -c`` look in it first, and a folder there named ``eaglewatch`` (the top of a checkout called so, as
# ``git clone … eaglewatch`` makes) would be imported as the package in place of the installed one (an editable
# install's finder comes after the working directory). So the working directory is taken off the path before the
# first import; the agent still runs in it, and the jobs it starts do too. Any Python 3 runs this (``-P`` needs
# 3.11).
LOCAL_AGENT_ENTRY = (
    "-c",
    "import sys;sys.path[:1]=[p for p in sys.path[:1] if p not in ('','.')];"
    "from eaglewatch.pipeline.agent.cli import main;sys.exit(main())",
)
# How much of a dead agent's stderr a start error quotes: its last lines (a traceback's root cause is last).
START_ERROR_LINES = 12
START_ERROR_LINE_CHARS = 300


class Link(Protocol):
    description: str

    def send(self, data: bytes) -> None: ...

    def recv(self, timeout: float) -> bytes | object:
        """Bytes; b"" at end of stream; TIMEOUT when nothing arrived within timeout."""

    def stderr_text(self) -> str: ...

    def transport_alive(self) -> bool:
        """False when the carrier itself (the SSH transport) is gone, as opposed to the agent process ending."""

    def close(self) -> None: ...


def agent_argv(python: str, entry: Sequence[str], run_root: str | None, idle_exit_s: float | None,
               env: Sequence[tuple[str, str]] = ()) -> list[str]:
    # env(1) sets the agent's environment on the host whatever its login shell is.
    argv = ["env", *(f"{name}={value}" for name, value in env)] if env else []
    argv += [python, *entry, "serve", "--protocol", str(protocol.PROTOCOL_VERSION)]
    if run_root:
        argv += ["--run-root", run_root]
    if idle_exit_s is not None:
        argv += ["--idle-exit", f"{idle_exit_s:g}"]
    return argv


def remote_command(argv: Sequence[str]) -> str:
    """The one string an SSH exec request carries, built from argv: every word quoted for the remote shell."""
    return " ".join(shlex.quote(str(word)) for word in argv)


class LocalLink:
    """The agent as a child process of this one (``local`` target: the demo, tests, an operator on the host)."""

    def __init__(self, run_root: str | None, idle_exit_s: float | None = None, python: str | None = None,
                 env: Sequence[tuple[str, str]] = ()) -> None:
        argv = agent_argv(python or sys.executable, LOCAL_AGENT_ENTRY, run_root, idle_exit_s)
        self.description = "local agent"
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      env={**os.environ, **dict(env)} if env else None)
        self._stderr = bytearray()
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True, name="eaglewatch-local-stderr")
        self._stderr_thread.start()
        self._send_lock = threading.Lock()
        # recv works on the raw fd. Closing it while a reader waits in select() would let the number be reused by
        # the next pipe this process opens (the next local agent's), and the stale reader would steal its
        # greeting or a reply: so close and a whole recv never overlap.
        self._recv_lock = threading.Lock()
        self._closed = False

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _drain_stderr(self) -> None:
        stderr = cast(io.BufferedReader, self._proc.stderr)  # a PIPE with Popen's default buffering
        for chunk in iter(lambda: stderr.read1(4096), b""):
            self._stderr += chunk
            del self._stderr[:-8192]

    def send(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        with self._send_lock:
            self._proc.stdin.write(data)
            self._proc.stdin.flush()

    def recv(self, timeout: float) -> bytes | object:
        with self._recv_lock:
            if self._closed:
                return b""
            try:
                fd = self._proc.stdout.fileno()  # type: ignore[union-attr]
                ready, _, _ = select.select([fd], [], [], timeout)
                if not ready:
                    return TIMEOUT
                return os.read(fd, 65536)
            except (OSError, ValueError):
                return b""

    def transport_alive(self) -> bool:
        return True

    def stderr_text(self) -> str:
        self._stderr_thread.join(timeout=0.2)
        return bytes(self._stderr).decode("utf-8", "replace")

    def close(self) -> None:
        try:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        with self._recv_lock:  # waits out a recv in progress (at most its timeout)
            self._closed = True
        for stream in (self._proc.stdout, self._proc.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass


class AgentUploader:
    """Puts the agent zipapp on the host over SFTP, once per content hash, atomically: upload to a temporary name,
    check its SHA-256, then rename. A file already at the agent's name is used only when its SHA-256 is the
    bundle's; otherwise (a cut upload, an edited or corrupted file) it is replaced the same way. So a half-written
    or altered agent is never run.

    Hosts that refuse the SFTP subsystem get it through ``cat`` on an exec channel instead, checked with the host's
    Python (the one that runs the agent) before the same atomic rename.
    """

    def __init__(self) -> None:
        self._known: dict[str, str] = {}  # endpoint -> remote path known to be in place

    def forget(self, endpoint: Endpoint) -> None:
        self._known.pop(str(endpoint), None)

    def ensure(self, chain: SSHChain, endpoint: Endpoint, options: SSHOptions) -> str:
        key = str(endpoint)
        if key in self._known:
            return self._known[key]
        import paramiko

        data, digest = bundle.build()
        try:
            sftp = paramiko.SFTPClient.from_transport(chain.transport)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            remote = self._upload_without_sftp(chain, endpoint, options, data, digest, exc)
            self._known[key] = remote
            return remote
        try:
            home = sftp.normalize(".")
            folder = options.agent_dir if options.agent_dir.startswith("/") else posixpath.join(home, options.agent_dir)
            remote = posixpath.join(folder, bundle.file_name())
            if not self._holds(sftp, remote, len(data), digest):
                self._mkdirs(sftp, folder)
                partial = f"{remote}.part-{secrets.token_hex(4)}"
                try:
                    with sftp.open(partial, "wb") as fh:
                        fh.set_pipelined(True)
                        fh.write(data)
                    if not self._holds(sftp, partial, len(data), digest):
                        raise ConnectionFailed(f"cannot install the agent on {endpoint}: the uploaded file does not "
                                               "match the agent's SHA-256 (cut short, or altered on the host)")
                    sftp.chmod(partial, 0o644)
                    sftp.posix_rename(partial, remote)
                except BaseException:
                    try:
                        sftp.remove(partial)
                    except (OSError, paramiko.SSHException, EOFError):
                        pass
                    raise
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise ConnectionFailed(f"cannot install the agent on {endpoint} over SFTP: {safe_text(exc)}") from None
        finally:
            sftp.close()
        self._known[key] = remote
        return remote

    @staticmethod
    def _holds(sftp: Any, path: str, size: int, digest: str) -> bool:
        """Whether the file at ``path`` is the agent: its size, then the SHA-256 of what it holds."""
        try:
            if sftp.stat(path).st_size != size:
                return False
            with sftp.open(path, "rb") as fh:
                fh.prefetch(size)
                content = fh.read(size + 1)
        except FileNotFoundError:
            return False
        return hashlib.sha256(content).hexdigest() == digest

    @staticmethod
    def _upload_without_sftp(chain: SSHChain, endpoint: Endpoint, options: SSHOptions, data: bytes, digest: str,
                             sftp_error: BaseException) -> str:
        """``cat`` into a partial file, check its SHA-256 with the host's Python, then rename; the script prints
        the folder's absolute path. Every word travels as a quoted argument of ``sh -c``."""
        name = bundle.file_name()
        partial = f"{name}.part-{secrets.token_hex(4)}"
        command = remote_command(["sh", "-c", _SHELL_INSTALL, "sh", options.agent_dir, partial, name, digest,
                                  options.python, _SHA256_OF_FILE])
        try:
            channel = chain.transport.open_session(timeout=10)
            channel.settimeout(max(30.0, options.connect_timeout_s))
            channel.exec_command(command)
            channel.sendall(data)
            channel.shutdown_write()
            out = bytearray()
            while True:
                chunk = channel.recv(65536)
                if not chunk:
                    break
                out += chunk
            status = channel.recv_exit_status()
            err = channel.recv_stderr(4096).decode("utf-8", "replace").strip() if channel.recv_stderr_ready() else ""
            channel.close()
        except Exception as exc:
            raise ConnectionFailed(f"cannot install the agent on {endpoint}: SFTP refused ({safe_text(sftp_error)}), "
                                   f"and the upload through the shell failed: {safe_text(exc)}") from None
        folder = out.decode("utf-8", "replace").strip()
        if status != 0 or not folder.startswith("/"):
            raise ConnectionFailed(f"cannot install the agent on {endpoint}: SFTP refused ({safe_text(sftp_error)}), "
                                   f"and the upload through the shell exited with {status}"
                                   + (f": {safe_text(err)}" if err else ""))
        return posixpath.join(folder, name)

    @staticmethod
    def _mkdirs(sftp: Any, folder: str) -> None:
        parts = folder.split("/")
        for index in range(2, len(parts) + 1):
            path = "/".join(parts[:index])
            if not path:
                continue
            try:
                sftp.stat(path)
            except FileNotFoundError:
                sftp.mkdir(path, 0o700)


class SSHLink:
    """The agent on the far end of one SSH session channel (exec, no pty)."""

    def __init__(self, chain: SSHChain, command: str, endpoint: Endpoint) -> None:
        self.description = f"agent on {endpoint}"
        self.chain = chain
        self._stderr = bytearray()
        try:
            self.channel = chain.transport.open_session(timeout=10)
            self.channel.exec_command(command)
        except Exception as exc:
            chain.close()
            raise ConnectionFailed(f"cannot start the agent on {endpoint}: {safe_text(exc)}") from None

    def send(self, data: bytes) -> None:
        self.channel.sendall(data)

    def recv(self, timeout: float) -> bytes | object:
        self.channel.settimeout(timeout)
        try:
            data = self.channel.recv(65536)
        except socket.timeout:
            return TIMEOUT
        except OSError:
            return b""
        if data == b"" and not self.chain.transport.is_active():
            return b""
        return data

    def transport_alive(self) -> bool:
        return bool(self.chain.transport.is_active())

    def stderr_text(self) -> str:
        try:
            while self.channel.recv_stderr_ready():
                self._stderr += self.channel.recv_stderr(8192)
        except Exception:
            pass
        return bytes(self._stderr[-8192:]).decode("utf-8", "replace")

    def close(self) -> None:
        # Closing a transport whose peer hangs must not hang us: paramiko's close does not wait for the peer.
        try:
            self.channel.close()
        except Exception:
            pass
        self.chain.close()


def open_ssh_link(
    endpoint: Endpoint,
    options: SSHOptions,
    uploader: AgentUploader,
    run_root: str | None,
    idle_exit_s: float | None = None,
) -> SSHLink:
    chain = connect(endpoint, options)
    try:
        remote = uploader.ensure(chain, endpoint, options)
    except BaseException:
        chain.close()
        raise
    argv = agent_argv(options.python, [remote], run_root, idle_exit_s, options.agent_env)
    return SSHLink(chain, remote_command(argv), endpoint)


def stderr_lines(text: str, limit: int = START_ERROR_LINES) -> list[str]:
    """The last ``limit`` non-blank lines of an agent's stderr, each through safe_text and cut to a readable length:
    lines to show as lines, never one line full of ``\\n``."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n") if line.strip()][-limit:]
    return [safe_text(line if len(line) <= START_ERROR_LINE_CHARS else line[:START_ERROR_LINE_CHARS] + "…")
            for line in lines]


def start_error(link: Link, what: str) -> AgentStartError:
    """``what`` went wrong as the agent started; its last lines on stderr follow, one a line, indented."""
    lines = stderr_lines(link.stderr_text())
    said = "; it said:" + "".join(f"\n    {line}" for line in lines) if lines else ""
    return AgentStartError(f"{what} ({link.description}){said}")
