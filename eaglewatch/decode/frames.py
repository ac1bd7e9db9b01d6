"""Where a stack frame's code lives: the operator's own code, a library, the standard library, or neither."""

from __future__ import annotations

import re

from eaglewatch.decode.events import FRAME_INTERNAL, FRAME_LIBRARY, FRAME_STDLIB, FRAME_USER

# Packages that count as the operator's own code even when pip put them in site-packages.
USER_PACKAGES = frozenset({"eaglewatch"})
# Libraries that are often installed from a checkout (pip install -e), so their frames lie outside
# site-packages. A path with one of these as a directory is library code.
KNOWN_LIBRARIES = frozenset(
    {"vllm", "torch", "transformers", "safetensors", "tokenizers", "triton", "flashinfer", "ray", "numpy",
     "huggingface_hub", "accelerate", "zmq", "tqdm", "xformers", "flash_attn", "vllm_flash_attn"}
)

_STDLIB = re.compile(r"/lib(?:64)?/python\d(?:\.\d+)?t?/")
_PACKAGE_AFTER = re.compile(r"/(?:site|dist)-packages/([^/]+)")
_CPP_SUFFIXES = (".cpp", ".cc", ".cu", ".h", ".hpp", ".cuh", ".c")


def frame_kind(path: str) -> str:
    if not path or path.startswith("<"):
        return FRAME_INTERNAL
    path = path.replace("\\", "/")
    if "-packages/" in path:
        found = _PACKAGE_AFTER.search(path)
        if found and found.group(1) in USER_PACKAGES:
            return FRAME_USER
        return FRAME_LIBRARY
    if _STDLIB.search(path) or "/Lib/" in path:
        return FRAME_STDLIB
    if path.endswith(_CPP_SUFFIXES):
        return FRAME_INTERNAL
    # A library checkout: the package directory with at least one more directory below it
    # (/src/vllm/vllm/v1/core.py), which a user's /srv/vllm/run.py does not have.
    parts = path.split("/")[:-2]
    if any(part in KNOWN_LIBRARIES for part in parts):
        return FRAME_LIBRARY
    return FRAME_USER
