"""Nothing to install on the GPU host: an ``eaglewatch …`` job runs the copy that travels with the agent, under the
host's Python that has vLLM, through the real sshd; a Python without vLLM is refused before anything starts."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytest.importorskip("paramiko")

from agent_support import run_root, wait_for  # noqa: F401  (fixture)
from app_support import screen_text, wait_until
from conftest import run_cli
from sshd import Sshd, sshd_server  # noqa: F401  (fixture)
from test_app_local import run_screen

from eaglewatch.pipeline.agent import jobpython
from eaglewatch.tui.connection import AgentError, Connection

pytestmark = pytest.mark.ssh


def make_host_python(folder: Path, with_packages: bool) -> Path:
    """A Python environment as a GPU host has one: torch, vLLM and transformers (this suite's, through a .pth line),
    and no eaglewatch. A path in a .pth file is not itself scanned for .pth files, so the suite's editable install
    of eaglewatch does not come along."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    if with_packages:
        (site / "suite_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    lacks = subprocess.run([str(python), "-c", "import eaglewatch"], capture_output=True, cwd=folder)
    assert lacks.returncode != 0, "the host's Python must not have eaglewatch"
    return python


@pytest.fixture(scope="module")
def host_python(tmp_path_factory) -> Path:
    return make_host_python(tmp_path_factory.mktemp("host-env") / "vllm-env", with_packages=True)


def test_a_launched_extraction_runs_the_agents_eaglewatch_on_a_host_without_one(
        sshd_server: Sshd, run_root: Path, tmp_path: Path, host_python: Path, tiny_llama: Path, prepared_data: Path):
    out = tmp_path / "out"
    argv = ["eaglewatch", "extract", "--engine", "vllm", "--model-path", str(tiny_llama), "--prepared-data",
            str(prepared_data), "--output-dir", str(out), "--layer-ids", "1", "2", "4", "--max-seq-len", "512",
            "--no-miniature"]
    # The agent runs on the host's vLLM Python: the job finds it there, as the agent's own.
    options = sshd_server.options(python=str(host_python))
    with Connection(sshd_server.spec, run_root=str(run_root), ssh_options=options) as connection:
        summary = connection.launch(argv, name="no eaglewatch on the host", cwd=str(tmp_path))
        run = summary["run"]
        cmd = json.loads((run_root / run / "cmd.json").read_text())
        assert cmd["requested_argv"] == argv and summary["argv"] == argv
        job = cmd["job"]
        assert job["eaglewatch"] == "bundle" and job["python"] == str(host_python)
        assert job["python_found_by"] == "the agent's own" and "vllm" in job["python_has"]
        assert cmd["argv"][:3] == [str(host_python), "-m", "eaglewatch"]
        unpacked = Path(job["eaglewatch_path"])
        assert unpacked.name.endswith(".pyz.d") and (unpacked / "eaglewatch" / "pipeline" / "extract.py").is_file()
        assert not (unpacked / "eaglewatch" / "tui").exists()

        # The dashboard on the same run, over the same sshd.
        from eaglewatch.tui.app.app import DashboardApp

        app = DashboardApp(sshd_server.spec, run=run, connection=connection)

        async def scenario():
            async with app.run_test(size=(120, 40)) as pilot:
                screen = await wait_until(pilot, lambda: run_screen(app), 60, what="run screen")
                await wait_until(pilot, lambda: screen.model.snapshot().exit_text is not None, 400, step_s=0.5,
                                 what="the run's end")
                await wait_until(pilot, lambda: all(w in screen_text(app) for w in ("DONE", "64/64", "exit code 0")),
                                 60, what="the painted end")
                view = screen.model.snapshot()
                assert view.phase == "done" and (view.extraction.done, view.extraction.total) == (64, 64)
                assert view.failures == ()
                await pilot.press("q")

        asyncio.run(scenario())
    assert len(list(out.glob("hs_*.safetensors"))) == 64
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "done" and manifest["engine"] == "vllm"


def test_a_python_without_vllm_is_refused_before_anything_starts(sshd_server: Sshd, run_root: Path, tmp_path: Path,
                                                                 host_python: Path):
    bare = make_host_python(tmp_path / "bare-env", with_packages=False)
    argv = ["eaglewatch", "extract", "--model-path", "/nowhere", "--prepared-data", "/nowhere.jsonl",
            "--output-dir", str(tmp_path / "out")]
    with Connection(sshd_server.spec, run_root=str(run_root), ssh_options=sshd_server.options()) as connection:
        with pytest.raises(AgentError) as refused:
            connection.launch(argv, python=str(bare))
        assert f"{bare} (named) has no torch" in str(refused.value) and "--python" in str(refused.value)
        # The same through the command an operator types, with its one line and exit code 2.
        cli = run_cli("launch", sshd_server.spec, "--ssh-config", sshd_server.ssh_config, "--known-hosts",
                      sshd_server.known_hosts, "-i", sshd_server.client_key, "--no-ssh-agent", "--python", bare,
                      "--run-root", run_root, "--no-tui", "--", *argv, env={"EAGLEWATCH_CONFIG": ""})
        assert cli.returncode == 2, cli.stdout + cli.stderr
        assert "has no torch" in cli.stderr and "Traceback" not in cli.stderr
        # --engine hf needs torch only: a named Python with torch and no vLLM would do; this one has neither.
        with pytest.raises(AgentError, match="has no torch"):
            connection.launch([*argv, "--engine", "hf"], python=str(bare))
    assert not run_root.exists() or not any(run_root.iterdir()), "nothing was started"


def test_without_a_named_python_the_agent_looks_for_one_and_says_what_it_found(tmp_path, host_python):
    home = tmp_path / "home"
    (home / "miniconda3" / "envs").mkdir(parents=True)
    (home / "miniconda3" / "envs" / "vllm").symlink_to(host_python.parent.parent)
    found = jobpython.candidates(home=str(home), environ={"PATH": "/nonexistent"})
    assert str(home / "miniconda3" / "envs" / "vllm" / "bin" / "python") in found
    command = jobpython.job_command(["eaglewatch", "prepare", "--help"], {}, home=str(home))
    # The agent's own Python (this suite's) has vLLM and torch: it is the first choice.
    assert command.record["python"] == sys.executable and command.record["python_found_by"] == "the agent's own"
    assert command.argv[1:3] == ["-m", "eaglewatch"] and command.env["PYTHONPATH"].split(":")[0]
    assert jobpython.job_command(["eaglewatch", "decode", "log"], {}).record["python_found_by"] == "the agent's own"
    assert jobpython.job_command(["bash", "-c", "true"], {}).argv == ["bash", "-c", "true"]
    installed = jobpython.job_command(["eaglewatch", "extract"], {}, installed=True)
    assert installed.argv == ["eaglewatch", "extract"] and installed.record["eaglewatch"] == "installed"


def test_what_a_job_needs_is_read_from_its_command():
    assert jobpython.needs(["eaglewatch", "extract", "--tp-size", "4"]) == (True, True, 4)
    assert jobpython.needs(["eaglewatch", "extract", "--engine=hf"]) == (False, True, 0)
    assert jobpython.needs(["eaglewatch", "prepare", "in", "out"]) == (False, True, 0)
    assert jobpython.needs(["eaglewatch", "decode", "log"]) == (False, False, 0)
