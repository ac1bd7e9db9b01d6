"""The dashboard's collector policy: a settle frees cyclic garbage and freezes the survivors; a freeze keeps
long-lived objects out of later collections; a later settle still frees what died after being frozen."""

from __future__ import annotations

import gc
import weakref

from eaglewatch.tui.app import gcpolicy


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cycle collector frees it


def test_settle_frees_cycles_and_freezes_what_is_left() -> None:
    try:
        garbage = _Node()
        gone = weakref.ref(garbage)
        del garbage
        assert gone() is not None  # reference counting alone cannot free a cycle
        gcpolicy.settle()
        assert gone() is None
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_frozen_cycles_wait_for_the_next_settle_and_are_freed_then() -> None:
    try:
        survivor = _Node()
        alive = weakref.ref(survivor)
        frozen = gcpolicy.freeze_survivors()
        assert frozen > 0  # (the count can drop at once: frozen objects are still freed by reference counting)
        del survivor
        gc.collect()  # the frozen cycle is out of the collector's reach
        assert alive() is not None
        gcpolicy.settle()  # unfreezes first
        assert alive() is None
    finally:
        gc.unfreeze()
