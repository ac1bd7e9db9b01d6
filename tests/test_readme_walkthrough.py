"""README's GPU-host walkthrough, run as written against the real test sshd on 127.0.0.1.

The commands are read from README.md itself ("The complete walkthrough" block) and run through bash one by one;
only what names the reader's world is replaced (the host, its Python, the model, the data folder, eight GPUs, the
layer ids of a 61-layer model), and each replacement must find its text, so a README that changes is run as it now
reads. The extraction uses the transformers engine (seconds here; the vLLM path has its own tests)."""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent_support import run_root, wait_for  # noqa: F401  (run_root: fixture)
from sshd import Sshd, sshd_server  # noqa: F401  (sshd_server: fixture)

from eaglewatch.assets import SAMPLE_CHAT_DATA

pytest.importorskip("paramiko")
pytestmark = [pytest.mark.ssh, pytest.mark.slow]

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK_LEAD = "The complete walkthrough, every path absolute:"


def walkthrough_commands() -> list[str]:
    """The walkthrough block's commands, continuation lines joined and comments dropped."""
    text = README.read_text()
    assert BLOCK_LEAD in text, "the README's walkthrough block moved: update this test"
    block = text.split(BLOCK_LEAD, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands, pending = [], ""
    for line in block.splitlines():
        line = re.sub(r"\s+#\s.*$", "", line) if "#" in line else line
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        if pending + line.strip():
            commands.append(" ".join((pending + line).split()))
        pending = ""
    return commands


def replaced(commands: list[str], replacements: list[tuple[str, str]]) -> list[str]:
    script = "\n".join(commands)
    for old, new in replacements:
        assert old in script, f"the walkthrough no longer holds {old!r}: update this test"
        script = script.replace(old, new)
    return script.split("\n")


@pytest.fixture
def host_files(tmp_path: Path, tiny_llama: Path) -> dict[str, Path]:
    """The model and the chat data where the walkthrough says they must be before it starts: on the host."""
    data = tmp_path / "data-ew"
    data.mkdir()
    shutil.copy(SAMPLE_CHAT_DATA, data / "chats.jsonl")  # the README's `rsync -a chats.jsonl gpu-box:/data/ew/`
    return {"model": tiny_llama, "data": data}


def test_the_walkthrough_runs_as_the_readme_writes_it(sshd_server: Sshd, run_root: Path, tmp_path: Path,
                                                       host_files: dict[str, Path]) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")  # first contact: the host key is not known yet
    host = shlex.join(["testhost", "--ssh-config", str(sshd_server.ssh_config), "--known-hosts", str(known),
                       "--run-root", str(run_root)])
    data = host_files["data"]
    commands = replaced(walkthrough_commands(), [
        ("gpu-box --python /opt/vllm-env/bin/python", f"{host} --python {shlex.quote(sys.executable)}"),
        ("SHA256:...", sshd_server.host_fingerprint()),
        ("/shared/kimi-k2.5", str(host_files["model"])),
        ("/data/ew", str(data)),
        ("--tp-size 8", "--tp-size 1"),
        ("--layer-ids 2 30 58 61", "--layer-ids 1 2 4 --engine hf"),
    ])
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    if not (Path(sys.executable).parent / "eaglewatch").exists():
        pytest.skip("the walkthrough runs the `eaglewatch` command: not installed beside this Python")
    assignments: list[str] = []
    results: list[tuple[str, subprocess.CompletedProcess[str]]] = []
    for command in commands:
        if re.match(r"^[A-Z]+=", command):
            assignments.append(command)
            continue
        done = subprocess.run(["bash", "-c", "\n".join([*assignments, command])], capture_output=True, text=True,
                              timeout=300, env=env, cwd=tmp_path)
        results.append((command, done))
        if " extract " in command:  # the dashboard would show it to its end; here the run's exit record does
            (run_dir,) = [path for path in run_root.iterdir() if path.name.endswith("-kimi")]
            exit_record = run_dir / "exit.json"
            wait_for(exit_record.exists, 240, 0.5, "the extraction's end")
            assert json.loads(exit_record.read_text())["code"] == 0, (run_dir / "log").read_text()[-3000:]
    said = [(command.split(" -- ")[-1][:60], done.returncode, done.stdout[-300:], done.stderr[-1500:])
            for command, done in results]
    first_contact, accepted, prepare, preflight, extract, verify = (done for _, done in results)
    assert first_contact.returncode == 2 and sshd_server.host_fingerprint() in first_contact.stderr, said[0]
    assert "--accept-host-key" in first_contact.stderr, said[0]
    assert accepted.returncode == 0 and accepted.stdout.strip() == "no runs", said[1]
    assert prepare.returncode == 0 and (data / "prepared.jsonl").exists(), said[2]
    assert preflight.returncode == 0 and "preflight: passed" in preflight.stdout + preflight.stderr, said[3]
    assert extract.returncode == 0, said[4]
    assert verify.returncode == 0, said[5]
    assert len(list((data / "hidden_states").glob("hs_*.safetensors"))) == 64


def test_relative_paths_start_in_the_host_home_unless_cwd_names_another(sshd_server: Sshd, run_root: Path,
                                                                        tmp_path: Path,
                                                                        host_files: dict[str, Path]) -> None:
    base = [sys.executable, "-m", "eaglewatch", "launch", "testhost", "--ssh-config", str(sshd_server.ssh_config),
            "--known-hosts", str(sshd_server.known_hosts), "--run-root", str(run_root), "--python", sys.executable]
    home = pwd.getpwuid(os.getuid()).pw_dir  # the SSH user's (the test sshd logs in as this user)
    plain = subprocess.run([*base, "--attach", "--", "pwd"], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines()[-1] == home
    assert f"eaglewatch: it runs in {home} (no --cwd: the agent's, the home directory over SSH" in plain.stderr
    data = host_files["data"]
    relative = subprocess.run([*base, "--cwd", str(data), "--attach", "--", "eaglewatch", "prepare", "--model-path",
                               str(host_files["model"]), "--input", "chats.jsonl", "--output", "prepared-here.jsonl"],
                              capture_output=True, text=True, timeout=300)
    assert relative.returncode == 0, relative.stderr[-2000:]
    assert f"eaglewatch: it runs in {data}\n" in relative.stderr
    assert (data / "prepared-here.jsonl").exists()
