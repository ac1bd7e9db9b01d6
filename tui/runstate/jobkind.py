"""Jobs other than ``eaglewatch extract`` that the dashboard knows: what they are and where their progress is.

speculators' own pipeline (``vllm serve`` configured for hidden-state extraction, then ``speculators
generate-offline-data`` against it) reports no events; its progress is the client's tqdm bar, one tick per sample
whatever its outcome, with the outcomes in the postfix::

     45%|████▌     | 450/1000 [00:10<00:12, 44.12it/s, ok=447, err=3, rps=44.1, vllm=120ms, write=3ms]

Until the first success the postfix is only ``ok=0, err=N``. Plain Python: the run model asks, the widgets show.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

from eaglewatch.decode import BarUpdate

SPECULATORS_DATAGEN = "speculators data generation"
_SPECULATORS_WORDS = ("generate-offline-data", "data_generation_offline", "data_generation_offline.py")
# The banner the client prints first, for jobs whose command is a wrapper script.
SPECULATORS_BANNER = "EAGLE Offline Data Generation"
_FIELD = re.compile(r"(?P<key>ok|err|rps)=(?P<value>[0-9.]+(?:e[+-]?\d+)?)")


@dataclass(frozen=True)
class SampleCounts:
    """One sample-bar frame: samples handled (n of total), and how they went."""

    n: int
    total: Optional[int]
    ok: Optional[int]
    err: Optional[int]
    per_second: Optional[float]
    remaining_s: Optional[float]


def kind_of_command(argv: Sequence[str]) -> Optional[str]:
    """The job kind its command names, or None (any other command, eaglewatch's own included)."""
    for word in argv:
        if any(word.endswith(w) or word == w for w in _SPECULATORS_WORDS):
            return SPECULATORS_DATAGEN
    return None


def sample_counts(bar: BarUpdate) -> Optional[SampleCounts]:
    """The counts of speculators' sample bar, or None for any other bar (a shard loader's, a trainer's)."""
    postfix = bar.postfix or ""
    if "ok=" not in postfix or "err=" not in postfix:
        return None
    fields = {m.group("key"): float(m.group("value")) for m in _FIELD.finditer(postfix)}
    if "ok" not in fields or "err" not in fields:
        return None
    # rps counts successes per second of the whole run; the bar's rate counts every tick.
    rate = fields.get("rps", bar.per_second)
    return SampleCounts(n=int(bar.n), total=int(bar.total) if bar.total is not None else None,
                        ok=int(fields["ok"]), err=int(fields["err"]), per_second=rate,
                        remaining_s=bar.remaining_s)


# eaglewatch's own commands that load no model: their runs get no loading, extraction or GPU panels.
ENGINE_FREE_TOOLS = {
    "prepare": "tokenizes the data into prepared samples",
    "verify": "checks an output folder against its manifest (and the reference, if asked)",
    "export": "writes the speculators view of an output folder",
    "tiny": "builds a tiny model from a config",
}


def engine_free_tool(argv: Sequence[str]) -> Optional[str]:
    """``prepare``/``verify``/``export``/``tiny`` when the command is that eaglewatch subcommand, else None."""
    words = [str(word) for word in argv]
    for i, word in enumerate(words[:-1]):
        if word.endswith("eaglewatch") or (word == "-m" and words[i + 1] == "eaglewatch"):
            rest = words[i + 1:] if word.endswith("eaglewatch") else words[i + 2:]
            if rest and rest[0] in ENGINE_FREE_TOOLS:
                return rest[0]
            return None
    return None
