"""Which pid is which tensor-parallel rank: from vLLM's log prefixes and from the pipeline's own events.

vLLM prefixes every line a worker prints with its process name and pid, for example
``(Worker_TP0 pid=255658)``, ``(Worker_PP1_TP3 pid=…)``, ``(VllmWorker-0 pid=…)``, ``(EngineCore pid=…)`` or
``(EngineCore_DP0 pid=…)``, possibly wrapped in ANSI colour codes. The same pid can appear under several names (a
TP worker also prints as plain ``Worker``), so names that carry a rank win over names that do not, and among names of
equal weight the latest one wins (a pid reused by a restarted job).

Before a vLLM worker takes its rank name it prints as plain ``Worker``, but says its global rank in
``(Worker pid=2444) INFO ... world_size=2 rank=1 local_rank=1``: that gives ``Worker rank=1`` for the minutes
of loading before the first ``Worker_TP1`` line (seen on two H200s: 70 s).

The pipeline can state the mapping itself with an event carrying ``pid`` and either ``rank`` (a label such as
``"Worker_TP0"``) or ``tp_rank`` (an integer, labelled ``Worker_TP<n>``); such an event outweighs any log line.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

_PREFIX = re.compile(rb"\((?P<name>[A-Za-z][A-Za-z0-9_.\-]{0,63}) pid=(?P<pid>\d{1,10})\)")
_RANKED = re.compile(r"(?:_(?:TP|PP|DP|EP|PCP|DCP)\d+)|^VllmWorker-\d+$")
_GLOBAL_RANK = re.compile(rb"\((?P<name>Worker[A-Za-z0-9_]{0,32}) pid=(?P<pid>\d{1,10})\)[^\n]{0,200}?"
                          rb"\bworld_size=\d+ rank=(?P<rank>\d+)")
# Bytes of a chunk kept for the next one, so that a prefix (or a rank line) split across two chunks is still found.
_CARRY = 320

WEIGHT_EVENT = 5
WEIGHT_RANKED = 4
WEIGHT_GLOBAL_RANK = 3
WEIGHT_WORKER = 2
WEIGHT_OTHER = 1


def name_weight(name: str) -> int:
    if _RANKED.search(name):
        return WEIGHT_RANKED
    if name.startswith(("Worker", "EngineCore")):
        return WEIGHT_WORKER
    return WEIGHT_OTHER


def iter_log_prefixes(data: bytes) -> Iterable[tuple[int, str]]:
    """(pid, name) for every worker prefix in ``data``, in order."""
    for match in _PREFIX.finditer(data):
        yield int(match.group("pid")), match.group("name").decode("ascii", "replace")


def event_rank(event: Mapping[str, Any]) -> tuple[int, str] | None:
    """The (pid, label) an event states, if it states one."""
    inner = event.get("event")
    if isinstance(inner, Mapping):  # an agent "event" message wrapping a pipeline event
        event = inner
    pid = event.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    label = event.get("rank")
    if isinstance(label, str) and label:
        return pid, label
    tp_rank = event.get("tp_rank")
    if isinstance(tp_rank, int) and not isinstance(tp_rank, bool) and tp_rank >= 0:
        return pid, f"Worker_TP{tp_rank}"
    return None


class RankMap:
    """pid → rank label, fed incrementally with log chunks and events. Calling it returns the current map,
    so an instance can be passed as ``rank_map_fn`` to the sampler."""

    def __init__(self) -> None:
        self._labels: dict[int, tuple[int, str]] = {}
        self._tail = b""

    def _offer(self, pid: int, name: str, weight: int) -> None:
        current = self._labels.get(pid)
        if current is None or weight >= current[0]:
            self._labels[pid] = (weight, name)

    def feed_log(self, chunk: bytes) -> None:
        data = self._tail + chunk
        for pid, name in iter_log_prefixes(data):
            self._offer(pid, name, name_weight(name))
        if b"world_size=" in data:
            for match in _GLOBAL_RANK.finditer(data):
                name = match.group("name").decode("ascii", "replace")
                self._offer(int(match.group("pid")), f"{name} rank={int(match.group('rank'))}", WEIGHT_GLOBAL_RANK)
        # Matches inside the kept tail are seen again next time; offering the same label twice is harmless.
        self._tail = data[-_CARRY:]

    def feed_event(self, event: Mapping[str, Any]) -> None:
        stated = event_rank(event)
        if stated is not None:
            self._offer(stated[0], stated[1], WEIGHT_EVENT)

    def feed_events(self, events: Iterable[Mapping[str, Any]]) -> None:
        for event in events:
            self.feed_event(event)

    def get(self, pid: int) -> str | None:
        entry = self._labels.get(pid)
        return entry[1] if entry else None

    def as_dict(self) -> dict[int, str]:
        return {pid: name for pid, (_, name) in self._labels.items()}

    def __call__(self) -> dict[int, str]:
        return self.as_dict()


def ranks_from_log(data: bytes) -> dict[int, str]:
    """pid → rank label from a whole log."""
    ranks = RankMap()
    ranks.feed_log(data)
    return ranks.as_dict()


def ranks_from_events(events: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    """pid → rank label from pipeline events (or agent ``event`` messages wrapping them)."""
    ranks = RankMap()
    ranks.feed_events(events)
    return ranks.as_dict()
