"""The decoder on logs that real users pasted into public issue threads (tests/fixtures/real-logs/).

Each log is decoded whole; the first failure group must be the root cause an expert named in ``cases.json``:
the same exception type (dotted, as printed) and a message that contains ``message_contains``.

Failures that are not Python exceptions are named in ``cases.json`` by a short kind; this is how they map to
what the decoder reports (``docs/decode.md``, "Failure kinds"):

==============================  ==========================================================================
``NCCL watchdog timeout``       ``kind == "watchdog"`` (a ``[E ProcessGroupNCCL.cpp]`` watchdog line, or a C++
                                abort whose ``what()`` is the watchdog's collective timeout)
``CUDA Error``                  ``kind == "native"`` and ``exc_type == "CUDA Error"`` (a C++ CUDA check)
``Killed``                      ``signal == "SIGKILL"`` (a death notice, the OOM killer, a memory monitor)
``Segmentation fault``          ``signal == "SIGSEGV"`` (a faulthandler dump, a fatal-signal banner, a death)
``Floating point exception``    ``signal == "SIGFPE"`` (the same, for an arithmetic fault)
``C++ abort``                   ``kind == "abort"`` (``terminate called after throwing ...``)
``argparse error``              ``kind == "native"`` and ``exc_type == "Usage error"`` (argparse's
                                ``PROG: error: ...``, with or without its ``usage:`` line)
==============================  ==========================================================================
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eaglewatch.decode import Decoder, FailureGroup, decode_bytes

REAL = Path(__file__).parent / "fixtures" / "real-logs"
CASES: list[dict[str, Any]] = json.loads((REAL / "cases.json").read_text())

KINDS: dict[str, Callable[[FailureGroup], bool]] = {
    "NCCL watchdog timeout": lambda g: g.first.kind == "watchdog",
    "CUDA Error": lambda g: g.first.kind == "native" and g.exc_type == "CUDA Error",
    "Killed": lambda g: g.first.signal == "SIGKILL",
    "Segmentation fault": lambda g: g.first.signal == "SIGSEGV",
    "Floating point exception": lambda g: g.first.signal == "SIGFPE",
    "C++ abort": lambda g: g.first.kind == "abort",
    "argparse error": lambda g: g.first.kind == "native" and g.exc_type == "Usage error",
}


def is_type(group: FailureGroup, expected: str) -> bool:
    test = KINDS.get(expected)
    if test is not None:
        return test(group)
    return group.exc_type == expected


def describe(group: FailureGroup) -> str:
    first = group.first
    return (f"{group.summary!r} (kind {first.kind}, signal {first.signal}, tier {group.tier}, "
            f"confidence {group.confidence}: {group.basis})")


def test_cases_are_well_formed() -> None:
    slugs = [case["slug"] for case in CASES]
    assert slugs == sorted(slugs)
    assert {f"{slug}.log" for slug in slugs} == {p.name for p in REAL.glob("*.log")}
    for case in CASES:
        text = (REAL / f"{case['slug']}.log").read_text(encoding="utf-8", errors="replace")
        assert case["root_cause"]["message_contains"] in text, case["slug"]


@pytest.mark.parametrize("case", CASES, ids=[case["slug"] for case in CASES])
def test_root_cause_of_a_real_log(case: dict[str, Any]) -> None:
    data = (REAL / f"{case['slug']}.log").read_bytes()
    _events, state = decode_bytes(data)
    failures = state.failures_ranked()
    expected = case["root_cause"]
    assert failures, f"no failure found; expected {expected['exc_type']}: {expected['message_contains']!r}"
    root = failures[0]
    others = "; ".join(describe(g) for g in failures[1:4])
    assert is_type(root, expected["exc_type"]), (
        f"root is {describe(root)}, expected {expected['exc_type']} ({case['why']}); then: {others}")
    first = root.first
    haystack = "\n".join((root.message, f"{root.exc_type}: {root.message}", first.text))
    assert expected["message_contains"] in haystack, f"root is {describe(root)}"
    assert not root.provisional  # a decoded whole file has nothing left open
    assert root.confidence in ("certain", "likely", "guess") and root.basis


def _pasted_differently(data: bytes) -> dict[str, bytes]:
    lines = data.decode("utf-8", "replace").split("\n")
    return {
        "double-spaced": "\n\n".join(lines).encode(),
        "code-fenced": ("```\n" + "\n".join(lines) + "\n```\n").encode(),
        "crlf": "\r\n".join(lines).encode(),
        "cri-collector": "\n".join(f"2025-01-02T03:04:05.123456789Z stderr F {line}" for line in lines).encode(),
    }


@pytest.mark.parametrize("case", CASES, ids=[case["slug"] for case in CASES])
def test_root_cause_survives_other_ways_of_pasting(case: dict[str, Any]) -> None:
    """The same log, double-spaced, in a code fence, with CRLF line ends, or behind a container runtime's
    prefix on every line: the same root cause."""
    expected = case["root_cause"]
    for how, data in _pasted_differently((REAL / f"{case['slug']}.log").read_bytes()).items():
        _events, state = decode_bytes(data)
        failures = state.failures_ranked()
        assert failures, how
        root = failures[0]
        haystack = "\n".join((root.message, f"{root.exc_type}: {root.message}", root.first.text))
        assert is_type(root, expected["exc_type"]) and expected["message_contains"] in haystack, (
            f"{how}: root is {describe(root)}")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([case["slug"] for case in CASES]), st.data())
def test_chunking_never_changes_the_events(slug: str, data: st.DataObject) -> None:
    content = (REAL / f"{slug}.log").read_bytes()
    whole, _ = decode_bytes(content)
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(content)), max_size=40))))
    decoder = Decoder(clock=lambda: 0.0)
    events: list[object] = []
    start = 0
    for cut in [*cuts, len(content)]:
        events += decoder.feed(content[start:cut])
        start = cut
    assert events + decoder.finish() == whole
