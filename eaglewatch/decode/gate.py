"""A cheap test of whether a line holds one of many trigger strings, made from the triggers themselves.

The decoder asks it of every line, so it has to cost what a few ``in`` tests cost: a regular expression of forty
alternatives costs four times that in CPython's ``re``. So the triggers are covered by a few short *anchors*,
substrings that several of them share (``rror`` is in ``CUDA error: ``, ``: error: `` and ``las error``), chosen
by a greedy set cover; a line that holds no anchor holds no trigger, and only a line that holds one is searched
for the triggers themselves. Both come from the same list, so no hand-kept filter can drift from it.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

ANCHOR_SIZE = 4


def _rarity(text: str) -> int:
    """How unusual a candidate anchor's characters are in ordinary log text: capitals and digits narrow a search
    down more than lowercase letters do, and a space or a punctuation mark more still (``ARN `` is not in every
    ``WARNING``, ``WARN`` is)."""
    ends = 1 if text and not text[-1].isalnum() else 0  # a word's end: "ARN " is in no "WARNING"
    return sum(0 if char.islower() else 1 if char.isalnum() else 2 for char in text) + ends


def anchors(triggers: Iterable[str], size: int = ANCHOR_SIZE) -> tuple[str, ...]:
    """Substrings of at most ``size`` characters such that every trigger holds at least one: a greedy set cover,
    most triggers first, then the rarest characters, then the text (so the choice is the same every run)."""
    todo = sorted(set(triggers))
    chosen: list[str] = []
    while todo:
        cover: dict[str, set[str]] = {}
        for trigger in todo:
            last = max(1, len(trigger) - size + 1)
            pieces = {trigger[i:i + size] for i in range(last)}
            for piece in pieces:
                cover.setdefault(piece, set()).add(trigger)
        best = max(sorted(cover), key=lambda piece: (len(cover[piece]), _rarity(piece)))
        chosen.append(best)
        todo = [trigger for trigger in todo if trigger not in cover[best]]
    return tuple(chosen)


def holds_any(strings: Iterable[str]) -> Callable[[str], bool]:
    """``test(line)``: whether the line holds one of ``strings``, as one expression of ``in`` tests (a loop or
    ``any()`` over them costs several times as much per line)."""
    listed = sorted(set(strings))
    if not listed:
        return lambda line: False
    return eval(  # noqa: S307 - the decoder's own literals, through repr
        "lambda line: " + " or ".join(f"{text!r} in line" for text in listed), {})


def make_gate(triggers: Iterable[str]) -> Callable[[str], bool]:
    """``gate(line)``: whether the line holds one of ``triggers``."""
    listed = sorted(set(triggers), key=len, reverse=True)
    pattern = re.compile("|".join(map(re.escape, listed)))
    keys = anchors(listed)

    any_anchor = holds_any(keys)

    def gate(line: str) -> bool:
        return any_anchor(line) and pattern.search(line) is not None

    gate.anchors = keys  # type: ignore[attr-defined]
    gate.any_anchor = any_anchor  # type: ignore[attr-defined]  # the first stage alone: a necessary condition
    return gate
