"""When Python's cycle collector may pause the dashboard.

A full (generation 2) collection walks every tracked object while it holds the GIL: with a run screen's log on
display (Textual keeps each line as a ``Strip`` with seven small caches) that is 100-300 ms on a 2-core machine,
at a moment the interpreter picks, and a crash that arrives then is painted that much later
(BENCHMARKS.md, "Crash to paint"). So the dashboard chooses the moments:

* :func:`settle` collects everything and then freezes what is left (``gc.freeze``: the collector ignores it from
  then on). It runs when a run screen opens, while the new run has nothing to show yet, and every
  ``SETTLE_EVERY_S`` seconds.
* :func:`freeze_survivors` only freezes (cheap: the objects are moved, not walked), every ``FREEZE_EVERY_S``
  seconds, so that what has lived that long, a run's log lines mostly, stays out of later collections.

Frozen objects are still freed by reference counting, which is how log lines and frames go; only frozen garbage in
reference cycles waits for the next :func:`settle`, which unfreezes everything first.
"""

from __future__ import annotations

import gc

SETTLE_EVERY_S = 600.0
FREEZE_EVERY_S = 20.0


def settle() -> int:
    """Collect all generations with nothing frozen, then freeze the survivors; returns how many were freed."""
    gc.unfreeze()
    freed = gc.collect()
    gc.freeze()
    return freed


def freeze_survivors() -> int:
    """Freeze what the collector tracks now; returns how many objects are frozen in all."""
    gc.freeze()
    return gc.get_freeze_count()
