"""Process prefixes: which process (lane) a line came from.

vLLM puts ``(NAME pid=N) `` in front of every line its child processes write: ``Worker``, ``Worker_TP3``,
``Worker_DP0_TP1``, ``EngineCore``, ``EngineCore_DP0``, ``APIServer``, ``MainProcess``, ``VllmWorker-2``,
``VllmWorker rank=3``. Ray writes ``(RayWorkerWrapper pid=N, ip=A)`` or ``(pid=N)``; torchrun writes
``[rank3]: ``. Lines without a prefix belong to the lane ``main``: the launched command's own output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional

MAIN_LANE = "main"
# The preflight's miniature runs beside the job and its lines carry this name in front of their own
# (``(Miniature_EngineCore_DP0 pid=7)``): a lane of its own, never taken for the job's.
MINIATURE_LANE = "Miniature"

KIND_WORKER = "worker"
KIND_ENGINE = "engine"
KIND_API = "api"
KIND_MAIN = "main"
KIND_OTHER = "other"
KIND_MINIATURE = "miniature"

# A name is a word, optionally followed by "key=N" or rank tokens ("VllmWorker rank=3", "VllmWorker TP0").
_NAME = r"[A-Za-z_][\w.\-]*(?: (?:[A-Za-z_]\w*=\d+|[A-Z]{1,4}\d+))*"
_PREFIX = re.compile(r"\((?:(?P<name>" + _NAME + r") )?pid=(?P<pid>\d+)(?:, ip=[^)\s]*)?\)")
_TORCHRUN = re.compile(r"\[(?P<name>(?:rank|default)\d+)\]:")
# A named prefix in the middle of a segment: another process's line glued to an unfinished one (a bar).
_EMBEDDED = re.compile(r"\((?P<name>" + _NAME + r") pid=(?P<pid>\d+)(?:, ip=[^)\s]*)?\) ")

_RANK_TOKEN = re.compile(r"[_ ](DP|TP|PP|EP|PCP|DCP|CP|SP)(\d+)")
_DASH_RANK = re.compile(r"-(\d+)$")
_KEY_RANK = re.compile(r"\brank=(\d+)")
_TORCHRUN_RANK = re.compile(r"^(?:rank|default)(\d+)$")


@dataclass(frozen=True, slots=True)
class LaneId:
    """A lane as its prefix names it."""

    name: str
    pid: Optional[int]
    kind: str
    ranks: tuple[tuple[str, int], ...] = ()  # e.g. (("DP", 0), ("TP", 1)) or (("rank", 3),)


MAIN = LaneId(MAIN_LANE, None, KIND_MAIN)


def lane_kind(name: str) -> str:
    if name == MAIN_LANE or name.startswith("MainProcess"):
        return KIND_MAIN
    if name.startswith(MINIATURE_LANE):
        return KIND_MINIATURE
    if "EngineCore" in name or name.startswith("Engine"):
        return KIND_ENGINE
    lowered = name.lower()
    if "apiserver" in lowered or "api_server" in lowered:
        return KIND_API
    if "worker" in lowered or _TORCHRUN_RANK.match(name) or _RANK_TOKEN.search(name) or "rank=" in name:
        return KIND_WORKER
    return KIND_OTHER


def lane_ranks(name: str) -> tuple[tuple[str, int], ...]:
    ranks = [(axis, int(num)) for axis, num in _RANK_TOKEN.findall(name)]
    if not ranks:
        for pattern in (_KEY_RANK, _TORCHRUN_RANK):
            found = pattern.search(name)
            if found:
                ranks.append(("rank", int(found.group(1))))
                break
        else:
            found = _DASH_RANK.search(name)
            if found and "worker" in name.lower():
                ranks.append(("rank", int(found.group(1))))
    return tuple(ranks)


def make_lane(name: str, pid: Optional[int]) -> LaneId:
    return LaneId(name, pid, lane_kind(name), lane_ranks(name))


def name_score(name: str) -> int:
    """How much a name says about its process: tensor/data/pipeline ranks count most, a bare rank less.

    One process may print under several names (``VllmWorker-0``, then ``Worker``, then ``Worker_TP0``);
    its lane shows the most telling one.
    """
    return 2 * len(_RANK_TOKEN.findall(name)) + (1 if lane_ranks(name) else 0)


def split_prefix(text: str) -> tuple[Optional[str], int]:
    """The prefix text at the start of ``text`` (up to its closing bracket) and where the rest begins.

    Only the shape is checked here; :func:`lane_from_prefix` says whether it really names a lane.
    """
    first = text[:1]
    if first == "(":
        end = text.find(")", 1, 120) + 1
        if end <= 0:
            return None, 0
    elif first == "[" and text.startswith(("[rank", "[default")):
        end = text.find("]:", 1, 40) + 2
        if end <= 1:
            return None, 0
    else:
        return None, 0
    if end < len(text):
        if text[end] == " ":
            return text[:end], end + 1
        if first == "[" and text[end] == "[":
            # torch's C++ warnings in a distributed process: "[rank1]:[W1130 05:42:09.06 TCPStore.cpp:106] ..."
            return text[:end], end
        return None, 0
    return text[:end], end


class PrefixParser:
    """Finds the lane prefix at the start of a segment, caching what each distinct prefix means."""

    __slots__ = ("_cache",)

    _CACHE_LIMIT = 4096

    def __init__(self) -> None:
        # prefix text up to its closing bracket -> the lane, or None when it is not a lane prefix
        self._cache: dict[str, Optional[LaneId]] = {}

    def lane(self, key: str) -> Optional[LaneId]:
        lane = self._cache.get(key, False)
        if lane is False:
            lane = lane_from_prefix(key)
            if len(self._cache) >= self._CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = lane
        return lane  # type: ignore[return-value]

    def parse(self, text: str) -> tuple[Optional[LaneId], int]:
        """The lane named at the start of ``text`` and where the rest begins; ``(None, 0)`` when none."""
        key, rest = split_prefix(text)
        if key is None:
            return None, 0
        lane = self.lane(key)
        if lane is None:
            return None, 0
        return lane, rest

    @staticmethod
    def find_embedded(text: str, start: int = 1) -> int:
        """Where a named process prefix starts inside ``text`` (not at 0), or -1."""
        if "pid=" not in text:
            return -1
        found = _EMBEDDED.search(text, start)
        return found.start() if found else -1


def lane_from_prefix(key: str) -> Optional[LaneId]:
    """``"(Worker_TP0 pid=12)"`` -> its LaneId; None when the text is not a lane prefix."""
    if key[0] == "(":
        found = _PREFIX.fullmatch(key)
        if not found:
            return None
        pid = int(found.group("pid"))
        return make_lane(found.group("name") or f"pid={pid}", pid)
    found = _TORCHRUN.fullmatch(key)
    return make_lane(found.group("name"), None) if found else None


def _ranges(numbers: list[int]) -> str:
    numbers = sorted(set(numbers))
    parts: list[str] = []
    start = prev = numbers[0]
    following: list[Optional[int]] = [*numbers[1:], None]
    for num in following:
        if num is not None and num == prev + 1:
            prev = num
            continue
        parts.append(str(start) if start == prev else f"{start}\u2013{prev}")
        if num is not None:
            start = prev = num
    return ",".join(parts)


_LAST_NUMBER = re.compile(r"(\d+)(?!.*\d)")


def compress_names(names: Iterable[str]) -> str:
    """``["Worker_TP0", ..., "Worker_TP7"]`` -> ``"Worker_TP0–7"``; names that differ elsewhere stay apart."""
    groups: dict[tuple[str, str], list[int]] = {}
    plain: list[str] = []
    order: list[str | tuple[str, str]] = []
    for name in names:
        found = _LAST_NUMBER.search(name)
        if not found:
            if name not in plain:
                plain.append(name)
                order.append(name)
            continue
        key = (name[: found.start()], name[found.end() :])
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(found.group(1)))
    out: list[str] = []
    for item in order:
        if isinstance(item, str):
            out.append(item)
        else:
            head, tail = item
            out.append(f"{head}{_ranges(groups[item])}{tail}")
    return ", ".join(out)
