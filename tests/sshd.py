"""A real OpenSSH sshd on 127.0.0.1 for the SSH tests and the benchmark: no system service, fresh keys.

Used as ``from sshd import Sshd, sshd_server`` (the fixture) in tests/test_ssh_*.py, and by bench/bench_ssh.py.
sshd dies with the process that started it (PR_SET_PDEATHSIG), so a killed test run leaves none behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

try:
    import pytest
except ImportError:  # the benchmark uses Sshd without pytest
    pytest = None  # type: ignore[assignment]

SSHD = "/usr/sbin/sshd"
_SSHD_EXES = ("sshd", "sshd-session", "sshd-auth")
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _free_port() -> int:
    """A port free right now. Another process may take it before sshd binds it: Sshd.start retries on that."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PORT_TAKEN = b"Address already in use"
FIRST_BIND_ATTEMPTS = 20


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "eaglewatch-test", "-f", str(path)],
                   check=True)
    return path


def _children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if int(fields[1]) == pid:
            out.append(int(name))
    return out


def _is_sshd(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")) in _SSHD_EXES
    except OSError:
        return False


class Sshd:
    """One sshd with its own host key, client key, authorized_keys, known_hosts and ssh config."""

    def __init__(self, workdir: Path, sftp: bool = True) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sftp = sftp
        self.host_key = keygen(self.dir / "host_ed25519")
        self.client_key = keygen(self.dir / "client_ed25519")
        self.authorized_keys = self.dir / "authorized_keys"
        self.authorized_keys.write_text((self.dir / "client_ed25519.pub").read_text())
        self.known_hosts = self.dir / "known_hosts"
        self.ssh_config = self.dir / "ssh_config"
        self.config = self.dir / "sshd_config"
        self.log = self.dir / "sshd.log"
        self.proc: subprocess.Popen | None = None
        # The port is settled by the first start that binds it; restarts keep it (clients have it in their config).
        self._port_bound = False
        self._use_port(_free_port())

    def _use_port(self, port: int) -> None:
        """Write every file that names the port."""
        self.port = port
        self.known_hosts.write_text(self.known_hosts_line())
        self.ssh_config.write_text(
            f"Host testhost\n  HostName 127.0.0.1\n  Port {self.port}\n  User {self.user}\n"
            f"  IdentityFile {self.client_key}\n\n"
            f"Host jumped\n  HostName 127.0.0.1\n  Port {self.port}\n  User {self.user}\n"
            f"  IdentityFile {self.client_key}\n  ProxyJump testhost\n"
        )
        self.config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.host_key}\n"
            f"AuthorizedKeysFile {self.authorized_keys}\nStrictModes no\nPidFile none\nUsePAM no\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
            "PermitRootLogin prohibit-password\nAllowTcpForwarding yes\n"
            + ("Subsystem sftp internal-sftp\n" if self.sftp else "")
            + "MaxStartups 100\nMaxSessions 50\nLogLevel INFO\n"
        )

    @property
    def user(self) -> str:
        import getpass

        return getpass.getuser()

    def known_hosts_line(self) -> str:
        key_type, blob = (self.dir / "host_ed25519.pub").read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {key_type} {blob}\n"

    def host_fingerprint(self) -> str:
        out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(self.host_key) + ".pub"],
                             check=True, capture_output=True, text=True).stdout
        return out.split()[1]

    @property
    def spec(self) -> str:
        return f"{self.user}@127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> None:
        """Start sshd and wait until it listens. The port was only free when it was picked, so another process
        may hold it by now: before the first successful start another port is tried; on a restart the port must
        stay, and binding it is retried until ``timeout_s`` (its last holder may still be going away)."""
        deadline = time.monotonic() + timeout_s
        attempts = 0
        while True:
            attempts += 1
            output = self._start_once(deadline)
            if output is None:
                self._port_bound = True
                return
            said = output.decode(errors="replace")
            if PORT_TAKEN not in output:
                raise RuntimeError(f"sshd exited: {said}")
            if not self._port_bound:
                if attempts >= FIRST_BIND_ATTEMPTS:
                    raise RuntimeError(f"sshd found no free port in {attempts} tries: {said}")
                self._use_port(_free_port())
            elif time.monotonic() > deadline:
                raise RuntimeError(f"port {self.port} stayed taken for {timeout_s} s: {said}")
            else:
                time.sleep(0.1)

    def _start_once(self, deadline: float) -> bytes | None:
        """One sshd start: None once it listens, else what it said before it exited."""
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        log = open(self.log, "ab")
        start_at = self.log.stat().st_size
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)], stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=log, preexec_fn=_die_with_parent)
        log.close()
        while True:
            with open(self.log, "rb") as fh:
                fh.seek(start_at)
                text = fh.read()
            if b"Server listening" in text:
                return None
            if self.proc.poll() is not None:
                with open(self.log, "rb") as fh:  # all it wrote before it exited
                    fh.seek(start_at)
                    text = fh.read()
                self.proc = None
                return text
            if time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                self.proc = None
                raise RuntimeError(f"sshd did not start listening: {text.decode(errors='replace')}")
            time.sleep(0.005)

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes (children and grandchildren of the listener that are sshd)."""
        if self.proc is None:
            return []
        found, frontier = [], [self.proc.pid]
        while frontier:
            parent = frontier.pop()
            for child in _children(parent):
                if _is_sshd(child):
                    found.append(child)
                    frontier.append(child)
        return found

    def kill_all(self) -> int:
        """SIGKILL the listener and every per-connection sshd; returns how many processes were killed."""
        if self.proc is None:
            return 0
        victims = self.session_pids()
        self.proc.kill()
        self.proc.wait()
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc = None
        return len(victims) + 1

    def restart(self) -> None:
        self.kill_all()
        self.start()

    def signal_sessions(self, signum: int) -> list[int]:
        pids = self.session_pids()
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        return pids

    def stop(self) -> None:
        for pid in self.session_pids():
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def options(self, **overrides):
        """SSHOptions that use only this server's files (never the operator's ~/.ssh)."""
        import sys

        from eaglewatch.tui.connection import SSHOptions

        values = dict(
            config_path=str(self.ssh_config),
            known_hosts=(str(self.known_hosts),),
            identity_files=(str(self.client_key),),
            use_ssh_agent=False,
            connect_timeout_s=5.0,
            python=sys.executable,
            agent_dir=str(self.dir / "agent-install"),
        )
        values.update(overrides)
        return SSHOptions(**values)


def require_sshd() -> None:
    if not os.path.exists(SSHD):
        message = f"{SSHD} is missing: apt-get install -y --no-install-recommends openssh-server"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


if pytest is not None:

    @pytest.fixture(scope="module")
    def sshd_server(tmp_path_factory: pytest.TempPathFactory):
        require_sshd()
        server = Sshd(tmp_path_factory.mktemp("sshd"))
        server.start()
        yield server
        server.stop()
