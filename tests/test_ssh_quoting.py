"""Shell metacharacters in every field an operator types are inert, end to end through the real sshd.

Property tests: hypothesis picks run names, arguments, working directories, environment values and run roots
made of shell syntax (``;``, ``$()``, backquotes, quotes, spaces, newlines, globs, ``~``); each example runs a real
command on the host and checks that the command saw exactly those strings and that no injected command ran.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_support import PYTHON, collect, stop_leftovers
from eaglewatch.tui.connection import Connection
from sshd import Sshd, sshd_server  # noqa: F401  (fixture)

pytestmark = pytest.mark.ssh

REPORT = textwrap.dedent(
    """
    import json, os, sys
    with open(os.path.join(os.environ["EAGLEWATCH_RUN_DIR"], "seen.json"), "w") as fh:
        json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": os.environ.get("EW_VALUE")}, fh)
    """
)


@pytest.fixture(scope="module")
def canary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("canary") / "injected"


def nasty_text(canary: Path, *, path_part: bool = False, max_pieces: int = 5) -> st.SearchStrategy[str]:
    payloads = [
        f"; touch {canary}", f"$(touch {canary})", f"`touch {canary}`", f"' ; touch {canary}; '",
        f'" ; touch {canary}; "', f"\n touch {canary}\n", f"&& touch {canary}", f"| touch {canary}",
        f"> {canary}", "$HOME", "${IFS}", "~", "*", "?", "\\", "'", '"', " ", "\n", "\t", "#", "!", "%s", "--",
    ]
    forbidden = "\0/" if path_part else "\0"
    letters = st.text(alphabet=st.characters(blacklist_characters=forbidden, blacklist_categories=("Cs",)),
                      max_size=6)
    pieces = st.one_of(st.sampled_from([p for p in payloads if not (path_part and "/" in p)]), letters)
    text = st.lists(pieces, min_size=1, max_size=max_pieces).map("".join)
    if path_part:
        text = text.filter(lambda t: t not in (".", "..") and 0 < len(t.encode()) < 200)
    return text


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("quoting")


@pytest.fixture(scope="module")
def weird_root(workdir: Path, canary: Path) -> Path:
    # Holds a path, so the injected command (were it ever run) would create the canary itself.
    return workdir / f"runs $(touch {canary}); 'q' \"dq\" `touch {canary}`\nline2"


@pytest.fixture(scope="module")
def conn(sshd_server: Sshd, weird_root: Path):
    connection = Connection(sshd_server.spec, run_root=str(weird_root), ssh_options=sshd_server.options())
    connection.connect()
    yield connection
    connection.close()
    stop_leftovers(weird_root)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_names_args_cwd_and_env_reach_the_job_verbatim(conn: Connection, workdir: Path, canary: Path,
                                                      weird_root: Path, data: st.DataObject) -> None:
    name = data.draw(nasty_text(canary).filter(bool), label="name")
    args = data.draw(st.lists(nasty_text(canary), max_size=4), label="args")
    folder = data.draw(nasty_text(canary, path_part=True), label="cwd")
    value = data.draw(nasty_text(canary), label="env")
    cwd = workdir / "cwds" / folder
    cwd.mkdir(parents=True, exist_ok=True)
    summary = conn.launch([PYTHON, "-c", REPORT, *args], cwd=str(cwd), env={"EW_VALUE": value}, name=name)
    got = collect(conn.watch(summary["run"]))
    assert got.states[-1].exit["code"] == 0, bytes(got.log)
    seen = json.loads((Path(summary["run_dir"]) / "seen.json").read_text())
    assert seen == {"argv": args, "cwd": str(cwd), "env": value}
    assert summary["name"] == name and conn.status(name)["run"] == summary["run"]
    assert Path(summary["run_dir"]).parent == weird_root
    assert not canary.exists()


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_cli_passes_fields_verbatim(sshd_server: Sshd, workdir: Path, canary: Path, data: st.DataObject) -> None:
    root_name = data.draw(nasty_text(canary, path_part=True, max_pieces=3), label="run root")
    name = data.draw(nasty_text(canary, max_pieces=3).filter(lambda t: t and not t.startswith("-")), label="name")
    args = data.draw(st.lists(nasty_text(canary, max_pieces=3), max_size=3), label="args")
    root = workdir / "cli-roots" / root_name
    options = ["--run-root", str(root), "--ssh-config", str(sshd_server.ssh_config), "--known-hosts",
               str(sshd_server.known_hosts), "--no-ssh-agent", "--python", PYTHON]
    try:
        launched = subprocess.run(
            [sys.executable, "-m", "eaglewatch", "launch", "testhost", *options, "--name", name, "--attach", "--",
             PYTHON, "-c", REPORT, *args],
            capture_output=True, timeout=60,
        )
        assert launched.returncode == 0, launched.stderr
        run_id = launched.stdout.decode().splitlines()[0]
        seen = json.loads((root / run_id / "seen.json").read_text())
        assert seen["argv"] == args
        listed = subprocess.run([sys.executable, "-m", "eaglewatch", "runs", "testhost", *options, "--json"],
                                capture_output=True, timeout=60)
        assert [json.loads(line)["name"] for line in listed.stdout.splitlines()][0] == name
        assert not canary.exists()
    finally:
        stop_leftovers(root)
