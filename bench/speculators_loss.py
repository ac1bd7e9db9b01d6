"""The loss curve in a `speculators train` log: (global step, train/loss) pairs, and the validation losses.

speculators logs its metrics through rich, wrapped at the terminal's width: a record's ``train/loss=...`` and its
``global_step=...`` are on different physical lines, in that order.

    python bench/speculators_loss.py TRAIN_LOG     # prints a Markdown table of every 50th step
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_LOSS = re.compile(r"train/loss=(?P<loss>[0-9.]+(?:e[+-]?\d+)?)")
_STEP = re.compile(r"global_step=(?P<step>\d+)")
_VAL = re.compile(r"val/loss_epoch=(?P<loss>[0-9.]+(?:e[+-]?\d+)?)")


def loss_curve(text: str) -> list[tuple[int, float]]:
    """Each logged step's loss: a ``train/loss=`` closes at the next ``global_step=``."""
    curve: list[tuple[int, float]] = []
    pending: float | None = None
    for line in text.splitlines():
        found = _LOSS.search(line)
        if found:
            pending = float(found.group("loss"))
        step = _STEP.search(line)
        if step and pending is not None:
            curve.append((int(step.group("step")), pending))
            pending = None
    return curve


def validation_losses(text: str) -> list[float]:
    return [float(m.group("loss")) for m in _VAL.finditer(text)]


def main() -> int:
    text = Path(sys.argv[1]).read_text(errors="replace")
    curve = loss_curve(text)
    print("| step | train/loss |")
    print("| --- | --- |")
    for step, loss in curve:
        if step % 50 == 0 or (step, loss) == curve[-1]:
            print(f"| {step} | {loss:.3f} |")
    val = validation_losses(text)
    if val:
        print(f"\nvalidation loss by epoch: {', '.join(f'{v:.3f}' for v in val[:5])}{' …' if len(val) > 5 else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
