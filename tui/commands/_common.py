"""What the host commands (launch, runs, attach, stop, restart) and the dashboard share: HOST and SSH options,
resolving HOST (named hosts from the config file included), connecting, turning connection errors into one clear
sentence."""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, NoReturn, Optional, ParamSpec, TypeVar

from eaglewatch.errors import UserError
from eaglewatch.safetext import safe_text
from eaglewatch.tui import config
from eaglewatch.tui.messages import RunSummary
from eaglewatch.tui.runend import DIR_GONE_TEXT, run_end

if TYPE_CHECKING:
    from eaglewatch.tui.connection import Connection, SSHOptions, UnknownHostKeyError

P = ParamSpec("P")
T = TypeVar("T")

REMOTE_PYTHON_ENV = "EAGLEWATCH_REMOTE_PYTHON"
DEFAULT_REMOTE_PYTHON = "python3"
HOST_HELP = "a host from the config file, an ssh-config alias, user@host[:port], or 'local'"


def command_prefix(argv0: Optional[str] = None, executable: Optional[str] = None) -> str:
    """How to write the ``eaglewatch`` command in a hint this process prints (``Reattach: PREFIX local RUN``), so
    that the hint runs as printed in the operator's shell: ``eaglewatch`` where that name on the PATH is the
    program that runs now, else the program's absolute path (``/home/me/eaglewatch/.venv/bin/eaglewatch`` after
    ``./run demo``, whose ``.venv/bin`` is not on the PATH). Run as ``python -m eaglewatch``, the console script
    beside that Python is named where there is one: it imports the package from its installation whatever folder
    it runs in, where ``python -m`` would first look in the working directory. ``argv0`` and ``executable``
    default to ``sys.argv[0]`` and ``sys.executable``."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    executable = sys.executable if executable is None else executable
    script: Optional[str] = None
    if argv0 and os.path.basename(argv0) == "eaglewatch" and os.path.isfile(argv0):
        script = os.path.abspath(argv0)  # the console script, as the shell found it
    elif executable:
        beside = os.path.join(os.path.dirname(os.path.abspath(executable)), "eaglewatch")
        if os.path.isfile(beside) and os.access(beside, os.X_OK):
            script = beside
    if script is None:
        return f"{_shortest_command(executable or 'python3')} -m eaglewatch"
    return _shortest_command(script)


def hint_command(*words: object) -> str:
    """A command for the operator to run, as a hint prints it: :func:`command_prefix`, then ``words`` (a host, a run
    id, options), each quoted for a shell and shown through safe_text, so that it runs as printed."""
    return safe_text(" ".join([command_prefix(), *(shlex.quote(str(word)) for word in words)]))


def where_options(args: argparse.Namespace) -> list[str]:
    """The options of this command line that say where runs are (``--run-root``, ``--config``, ``--ssh-config``
    when not the default), for a hint that must find the same runs."""
    words: list[str] = []
    for option, name, default in (("--run-root", "run_root", None), ("--config", "config", None),
                                  ("--ssh-config", "ssh_config", "~/.ssh/config")):
        value = getattr(args, name, None)
        if value is not None and value != default:
            words += [option, str(value)]
    return words


def _shortest_command(path: str) -> str:
    """``path``'s base name where the PATH finds that very file under it, else ``path`` itself; quoted for a shell."""
    name = os.path.basename(path)
    found = shutil.which(name)
    try:
        if found is not None and os.path.samefile(found, path):
            return shlex.quote(name)
    except OSError:
        pass
    return shlex.quote(os.path.abspath(path))


def add_host_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("host", metavar="HOST", help=HOST_HELP)
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
    ssh.add_argument("--python", default=None,
                     help="Python on the host that runs the agent (default: the host's python in the config file, "
                          f"else ${REMOTE_PYTHON_ENV}, else {DEFAULT_REMOTE_PYTHON})")
    ssh.add_argument("--agent-env", action="append", default=[], metavar="NAME=VALUE",
                     help="environment of the agent on the host, beside its SSH session's: what sbatch, squeue and "
                          "the jobs it starts see (e.g. SLURM_CONF=/etc/slurm/slurm.conf); repeat for several "
                          "(default: the host's agent_env in the config file)")
    ssh.add_argument("--accept-host-key", metavar="FINGERPRINT", default=None,
                     help="accept an unknown host key with this SHA256 fingerprint and record it in known_hosts")
    ssh.add_argument("--config", default=None, metavar="FILE",
                     help=f"config file with named hosts (default: ${config.CONFIG_ENV} or {config.DEFAULT_CONFIG})")


@dataclass(frozen=True)
class HostTarget:
    """HOST resolved: what to connect to, with which run root and SSH options."""

    name: str  # as the operator wrote it (a named host, an alias, user@host[:port], local)
    spec: str  # what Connection takes: 'local', an ssh-config alias, user@host[:port]
    run_root: Optional[str]
    ssh_options: "SSHOptions"
    # The Python named for the host (--python, the config entry, $EAGLEWATCH_REMOTE_PYTHON); None when none is.
    # It runs the agent, and an ``eaglewatch …`` job too, which must then find vLLM and torch there.
    named_python: Optional[str] = None
    # Where the runs launched here send their alerts (config.Config.alerts_for), or None.
    alerts: Optional[dict] = None


def resolve_host(args: argparse.Namespace, host: Optional[str] = None,
                 cfg: Optional[config.Config] = None) -> HostTarget:
    """The one way HOST is read, by every command that takes one: ``host`` (else ``args.host``, else local) is a
    named host of the config file (``cfg``, else the one ``--config`` or the default place names) or a target
    itself. Options given on the command line win over the named host's ``run_root`` and ``python``."""
    from eaglewatch.tui.connection import SSHOptions

    cfg = cfg if cfg is not None else config.load(args.config)
    name = host if host is not None else getattr(args, "host", None)
    if name is None:
        name = "local"
    if not name.strip():
        raise UserError(f"HOST is empty: {HOST_HELP}")
    entry = cfg.host(name)
    named = args.python or entry.python or os.environ.get(REMOTE_PYTHON_ENV) or None
    python = named or DEFAULT_REMOTE_PYTHON
    agent_env = {**entry.agent_env, **_agent_env(getattr(args, "agent_env", None) or [])}
    options = SSHOptions(
        config_path=args.ssh_config,
        known_hosts=tuple(args.known_hosts) if args.known_hosts else None,
        identity_files=tuple(args.identity),
        use_ssh_agent=not args.no_ssh_agent,
        python=python,
        agent_env=tuple(agent_env.items()),
    )
    target = HostTarget(name, entry.target, args.run_root or entry.run_root, options, named, cfg.alerts_for(name))
    warn_ssh_config(target)
    return target


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _agent_env(words: list[str]) -> dict[str, str]:
    """``--agent-env NAME=VALUE`` words as a mapping; a word that is not one is one line."""
    env: dict[str, str] = {}
    for word in words:
        name, sep, value = word.partition("=")
        if not sep or "\0" in value or not _ENV_NAME.fullmatch(name):
            raise UserError(f"--agent-env {safe_text(word)!s}: give NAME=VALUE, NAME made of letters, digits and _")
        env[name] = value
    return env


_SSH_CONFIG_WARNED: set[tuple[str, str]] = set()


def warn_ssh_config(target: HostTarget) -> None:
    """Name on stderr, once per host and ssh config in this process, every option of the host's ssh-config entry
    that eaglewatch does not apply (``target.SSH_CONFIG_OPTIONS``): connecting without one is never silent."""
    from eaglewatch.tui.connection.target import config_warnings, is_local, resolve

    path = target.ssh_options.config_path
    key = (target.spec, str(path))
    if is_local(target.spec) or key in _SSH_CONFIG_WARNED:
        return
    _SSH_CONFIG_WARNED.add(key)
    try:
        endpoint = resolve(target.spec, path)
    except ValueError:
        return  # a bad HOST or ssh config: connecting says so, in the command's error line
    for line in config_warnings(endpoint, target.name, path):
        print(f"eaglewatch: {safe_text(line)}", file=sys.stderr)


def ssh_config_hint(connection: "Connection") -> str:
    """What to add to a failed connection's error when the host's ssh config reaches it through a ProxyCommand that
    was not applied (the warning was printed before; the failure is most likely why)."""
    endpoint = connection.endpoint
    hops = [endpoint, *endpoint.jumps] if endpoint is not None else []
    if any(name.lower() == "proxycommand" for hop in hops for name in hop.not_applied):
        return "; the host's ssh config has a ProxyCommand, which eaglewatch does not run: use ProxyJump instead"
    return ""


def _confirm_interactively(error: "UnknownHostKeyError") -> bool:
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return False
    print(f"eaglewatch: {safe_text(error)}", file=sys.stderr)
    answer = input(f"Accept {safe_text(error.key_type)} {safe_text(error.fingerprint)} for "
                   f"{safe_text(error.host_id)}? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def user_error(what: object, keep: str = "") -> UserError:
    """A UserError whose text may quote the host (its stderr, its banner, a run's name): shown through safe_text.
    ``keep="\\n"`` for a message that holds whole lines (an agent's stderr on a failed start)."""
    return UserError(safe_text(what, keep=keep))


def connect(args: argparse.Namespace) -> "Connection":
    """A connected Connection to HOST (see resolve_host), or a UserError that says what went wrong and what to do."""
    from eaglewatch.tui.connection import AgentStartError, Connection, ConnectionFailed, UnknownHostKeyError

    target = resolve_host(args)
    try:
        connection = Connection(target.spec, run_root=target.run_root, ssh_options=target.ssh_options)
    except ValueError as exc:
        raise user_error(exc) from None
    for _ in range(2):
        try:
            connection.connect()
            return connection
        except UnknownHostKeyError as exc:
            if args.accept_host_key is not None and args.accept_host_key != exc.fingerprint:
                raise user_error(
                    f"{exc.host_id} presents {exc.fingerprint}, not the {args.accept_host_key} you accepted; "
                    "nothing was recorded"
                ) from None
            if args.accept_host_key is None and not _confirm_interactively(exc):
                raise user_error(f"{exc}. To accept it, run again with --accept-host-key {exc.fingerprint}") from None
            written = connection.accept_host_key(exc)
            print(f"eaglewatch: recorded {safe_text(exc.host_id)} {safe_text(exc.key_type)} "
                  f"{safe_text(exc.fingerprint)} in {safe_text(written)}", file=sys.stderr)
        except ConnectionFailed as exc:
            # A failed agent start quotes its stderr as lines (a traceback): they stay lines.
            keep = "\n" if isinstance(exc, AgentStartError) else ""
            raise user_error(f"{exc}{ssh_config_hint(connection)}", keep=keep) from None
    raise UserError("could not connect after accepting the host key")


def agent_call(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run one connection call, turning the agent's refusals into UserError."""
    from eaglewatch.tui.connection import AgentError, LinkLost

    try:
        return function(*args, **kwargs)
    except AgentError as exc:
        raise user_error(exc) from None
    except LinkLost as exc:
        raise user_error(f"the link to the host was lost: {exc}") from None
    except TimeoutError as exc:
        raise user_error(f"{exc}; the host may be overloaded, or the link hangs") from None


def positive(text: str) -> float:
    """An argparse type: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number above 0")
    return value


def seconds(text: str) -> float:
    """An argparse type: a finite, non-negative number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number of seconds, 0 or more")
    return value


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise user_error(f"{message} (options go between HOST and --)")


def split_command(args: argparse.Namespace, add_options: Callable[[argparse.ArgumentParser], None]) -> list[str]:
    """The command after ``--``. Options written after the positional arguments (which argparse leaves in the
    remainder) are parsed here with the same definitions, so ``launch HOST --name x -- CMD`` and ``restart HOST RUN
    --grace 5`` work."""
    words = list(args.cmd_argv)
    if "--" in words:
        cut = words.index("--")
        options, command = words[:cut], words[cut + 1 :]
    elif words and words[0].startswith("-"):
        options, command = words, []  # options only: a wrong one is named, and the command is missing
    else:
        options, command = [], words
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


def describe_exit(summary: RunSummary) -> str:
    """How the run ended (eaglewatch.tui.runend), or its state while it has not; safe for a terminal."""
    end = run_end(summary.get("state"), summary.get("exit"), bool(summary.get("run_dir_gone")))
    if end is not None:
        return safe_text(end.text)
    state = safe_text(summary.get("state"))
    return f"{state}, {DIR_GONE_TEXT}" if summary.get("run_dir_gone") else state


def exit_status(summary: RunSummary) -> int:
    """The shell's convention: the job's code, or 128 + the signal that killed it; 1 when unknown."""
    end = run_end(summary.get("state"), summary.get("exit"), bool(summary.get("run_dir_gone")))
    return end.status if end is not None else 1


def close_quietly(connection: "Connection") -> None:
    try:
        connection.close()
    except Exception:
        pass
