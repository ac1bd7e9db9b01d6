"""The agent as one zipapp file, built from this installation, to upload to a host that has no eaglewatch.

It holds only the stdlib-only modules the agent needs (eaglewatch/__init__, protocol, errors, safetext,
pipeline/__init__, pipeline/agent, and pipeline/telemetry when present, whose heavy parts are imported lazily). The
file name carries the version and a hash of the content, so a changed agent is a new file and two versions never
mix.
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


def _files() -> list[tuple[str, Path]]:
    top = _package_dir("eaglewatch")
    pipeline = _package_dir("eaglewatch.pipeline")
    agent = _package_dir("eaglewatch.pipeline.agent")
    if top is None or pipeline is None or agent is None:
        raise RuntimeError("the eaglewatch agent package cannot be found in this installation")
    files = [
        ("eaglewatch/__init__.py", top / "__init__.py"),
        ("eaglewatch/protocol.py", top / "protocol.py"),
        ("eaglewatch/errors.py", top / "errors.py"),
        ("eaglewatch/safetext.py", top / "safetext.py"),
        ("eaglewatch/pipeline/__init__.py", pipeline / "__init__.py"),
    ]
    files += [(f"eaglewatch/pipeline/agent/{path.name}", path) for path in sorted(agent.glob("*.py"))]
    telemetry = _package_dir("eaglewatch.pipeline.telemetry")
    if telemetry is not None:
        files += [(f"eaglewatch/pipeline/telemetry/{path.name}", path) for path in sorted(telemetry.glob("*.py"))]
    return files


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
