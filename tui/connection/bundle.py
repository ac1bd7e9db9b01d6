"""The agent as one zipapp file, built from this installation, to upload to a host that has no eaglewatch.

It holds eaglewatch's GPU side whole: the agent, ``pipeline/`` (prepare, extract, verify, preflight, the tiny
models, telemetry), the decoder, the command line and the bundled data, all pure Python; torch, vLLM and
transformers come from the host's environment. The agent itself uses only its stdlib-only modules; an
``eaglewatch …`` job it launches runs the rest (see ``pipeline/agent/jobpython.py``), so the job's code is the
operator's version. The operator side (``tui/``) and the demo stay out. The file name carries the version and a hash
of the content, so a changed bundle is a new file and two versions never mix.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from functools import lru_cache
from pathlib import Path

_MAIN = (
    "import sys\n"
    "from eaglewatch.pipeline.agent.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def _package_dir(module_name: str) -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec(module_name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


# What stays on the operator's side: the dashboard and its connection, and the demo that opens it.
_LEFT_OUT = ("eaglewatch/tui/", "eaglewatch/demo.py")


def _files() -> list[tuple[str, Path]]:
    top = _package_dir("eaglewatch")
    if top is None or _package_dir("eaglewatch.pipeline.agent") is None:
        raise RuntimeError("the eaglewatch agent package cannot be found in this installation")
    files: list[tuple[str, Path]] = []
    # os.walk follows the package's links (eaglewatch/pipeline -> ../pipeline), as the import system does.
    for folder, dirs, names in os.walk(top, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for name in sorted(names):
            path = Path(folder) / name
            archived = "eaglewatch/" + path.relative_to(top).as_posix()
            if archived.startswith(_LEFT_OUT) or not _travels(archived):
                continue
            files.append((archived, path))
    return files


def _travels(archived: str) -> bool:
    if archived.endswith(".py"):
        return True
    # Bundled data the GPU side reads (sample chat data for the tiny models); not the dashboard's styles or images.
    return archived.startswith("eaglewatch/assets/data/")


@lru_cache(maxsize=1)
def build() -> tuple[bytes, str]:
    """(zipapp bytes, sha256 hex). Deterministic: the same sources give the same bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        entries = [("__main__.py", _MAIN.encode())] + [(name, path.read_bytes()) for name, path in _files()]
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()


def file_name() -> str:
    from eaglewatch import __version__

    _, digest = build()
    return f"eaglewatch-agent-{__version__}-{digest[:12]}.pyz"


def write(path: str | os.PathLike[str]) -> Path:
    data, _ = build()
    target = Path(path)
    target.write_bytes(data)
    return target
