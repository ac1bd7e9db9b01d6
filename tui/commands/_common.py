"""What the host commands (launch, runs, attach, stop, restart) share: HOST and SSH options, connecting,
turning connection errors into one clear sentence."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from eaglewatch.errors import UserError

REMOTE_PYTHON_ENV = "EAGLEWATCH_REMOTE_PYTHON"


def add_host_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("host", metavar="HOST", help="an ssh-config alias, user@host[:port], or 'local'")
    add_connection_options(parser)


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    ssh = parser.add_argument_group("connection")
    ssh.add_argument("--run-root", default=None,
                     help="run root on the host (default: the host's $EAGLEWATCH_RUN_ROOT or ~/.eaglewatch/runs)")
    ssh.add_argument("--ssh-config", default="~/.ssh/config", help="OpenSSH client config (default: %(default)s)")
    ssh.add_argument("--known-hosts", action="append", default=None, metavar="FILE",
                     help="known_hosts file; repeat for several (default: the host's UserKnownHostsFile and "
                          "GlobalKnownHostsFile in the ssh config, else ~/.ssh/known_hosts and the system one)")
    ssh.add_argument("-i", "--identity", action="append", default=[], metavar="FILE", help="private key file")
    ssh.add_argument("--no-ssh-agent", action="store_true", help="do not use keys from ssh-agent")
    ssh.add_argument("--python", default=os.environ.get(REMOTE_PYTHON_ENV, "python3"),
                     help=f"Python on the host that runs the agent (default: ${REMOTE_PYTHON_ENV} or python3)")
    ssh.add_argument("--accept-host-key", metavar="FINGERPRINT", default=None,
                     help="accept an unknown host key with this SHA256 fingerprint and record it in known_hosts")


def ssh_options(args: argparse.Namespace) -> Any:
    from eaglewatch.tui.connection import SSHOptions

    return SSHOptions(
        config_path=args.ssh_config,
        known_hosts=tuple(args.known_hosts) if args.known_hosts else None,
        identity_files=tuple(args.identity),
        use_ssh_agent=not args.no_ssh_agent,
        python=args.python,
    )


def _confirm_interactively(error: Any) -> bool:
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return False
    print(f"eaglewatch: {error}", file=sys.stderr)
    answer = input(f"Accept {error.key_type} {error.fingerprint} for {error.host_id}? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def connect(args: argparse.Namespace) -> Any:
    """A connected Connection, or a UserError that says what went wrong and what to do."""
    from eaglewatch.tui.connection import Connection, ConnectionFailed, UnknownHostKeyError

    try:
        connection = Connection(args.host, run_root=args.run_root, ssh_options=ssh_options(args))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    for _ in range(2):
        try:
            connection.connect()
            return connection
        except UnknownHostKeyError as exc:
            if args.accept_host_key is not None and args.accept_host_key != exc.fingerprint:
                raise UserError(
                    f"{exc.host_id} presents {exc.fingerprint}, not the {args.accept_host_key} you accepted; "
                    "nothing was recorded"
                ) from None
            if args.accept_host_key is None and not _confirm_interactively(exc):
                raise UserError(f"{exc}. To accept it, run again with --accept-host-key {exc.fingerprint}") from None
            written = connection.accept_host_key(exc)
            print(f"eaglewatch: recorded {exc.host_id} {exc.key_type} {exc.fingerprint} in {written}", file=sys.stderr)
        except ConnectionFailed as exc:
            raise UserError(str(exc)) from None
    raise UserError("could not connect after accepting the host key")


def agent_call(function: Any, *args: Any, **kwargs: Any) -> Any:
    """Run one connection call, turning the agent's refusals into UserError."""
    from eaglewatch.tui.connection import AgentError, LinkLost

    try:
        return function(*args, **kwargs)
    except AgentError as exc:
        raise UserError(str(exc)) from None
    except LinkLost as exc:
        raise UserError(f"the link to the host was lost: {exc}") from None


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise UserError(f"{message} (options go between HOST and --)")


def split_command(args: argparse.Namespace, add_options: Any) -> list[str]:
    """The command after ``--``. Options written between HOST and ``--`` (which argparse leaves in the
    remainder) are parsed here with the same definitions, so ``launch HOST --name x -- CMD`` works."""
    words = list(args.cmd_argv)
    if "--" not in words:
        if words and words[0].startswith("-"):
            raise UserError(f"unknown option {words[0]!r}; put the command after --")
        return words
    cut = words.index("--")
    options, command = words[:cut], words[cut + 1 :]
    if options:
        parser = _RaisingParser(prog="eaglewatch", add_help=False)
        add_connection_options(parser)
        add_options(parser)
        parser.parse_args(options, namespace=args)
    return command


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserError(f"--env takes NAME=VALUE, not {pair!r}")
        env[key] = value
    return env


def describe_exit(summary: dict[str, Any]) -> str:
    state = summary.get("state")
    info = summary.get("exit") or {}
    if state == "exited":
        if info.get("signal"):
            return f"killed by {info.get('signal_name') or info['signal']}"
        return f"exit code {info.get('code')}"
    return str(state)


def exit_status(summary: dict[str, Any]) -> int:
    """The shell's convention: the job's code, or 128 + the signal that killed it; 1 when unknown."""
    info = summary.get("exit") or {}
    if info.get("signal"):
        return 128 + int(info["signal"])
    if info.get("code") is not None:
        return int(info["code"])
    return 1


def close_quietly(connection: Any) -> None:
    try:
        connection.close()
    except Exception:
        pass
