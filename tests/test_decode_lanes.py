"""Lane prefixes: every form vLLM, Ray and torchrun print."""

from __future__ import annotations

import pytest

from eaglewatch.decode.lanes import (
    KIND_API,
    KIND_ENGINE,
    KIND_MAIN,
    KIND_OTHER,
    KIND_WORKER,
    PrefixParser,
    compress_names,
    name_score,
)


@pytest.mark.parametrize(
    ("line", "name", "pid", "kind", "ranks", "rest"),
    [
        ("(Worker pid=255658) INFO x", "Worker", 255658, KIND_WORKER, (), "INFO x"),
        ("(Worker_TP3 pid=12) INFO x", "Worker_TP3", 12, KIND_WORKER, (("TP", 3),), "INFO x"),
        ("(Worker_DP1_TP0 pid=12) x", "Worker_DP1_TP0", 12, KIND_WORKER, (("DP", 1), ("TP", 0)), "x"),
        ("(Worker_PP1_TP2 pid=12) x", "Worker_PP1_TP2", 12, KIND_WORKER, (("PP", 1), ("TP", 2)), "x"),
        ("(EngineCore pid=9) x", "EngineCore", 9, KIND_ENGINE, (), "x"),
        ("(EngineCore_DP0 pid=9) x", "EngineCore_DP0", 9, KIND_ENGINE, (("DP", 0),), "x"),
        ("(APIServer pid=3) x", "APIServer", 3, KIND_API, (), "x"),
        ("(MainProcess pid=3) x", "MainProcess", 3, KIND_MAIN, (), "x"),
        ("(VllmWorker-5 pid=3) x", "VllmWorker-5", 3, KIND_WORKER, (("rank", 5),), "x"),
        ("(VllmWorker TP1 pid=3) x", "VllmWorker TP1", 3, KIND_WORKER, (("TP", 1),), "x"),
        ("(VllmWorker rank=3 pid=2147132) ERROR x", "VllmWorker rank=3", 2147132, KIND_WORKER, (("rank", 3),),
         "ERROR x"),
        ("(RayWorkerWrapper pid=41, ip=10.0.0.2) x", "RayWorkerWrapper", 41, KIND_WORKER, (), "x"),
        ("(pid=41) x", "pid=41", 41, KIND_OTHER, (), "x"),
        ("[rank1]: Traceback", "rank1", None, KIND_WORKER, (("rank", 1),), "Traceback"),
        # torch's C++ warnings in a distributed process, as a stuck TP1 worker printed them on an H200
        ("[rank1]:[W1130 05:42:09.064502209 TCPStore.cpp:106] [c10d] sendBytes failed", "rank1", None, KIND_WORKER,
         (("rank", 1),), "[W1130 05:42:09.064502209 TCPStore.cpp:106] [c10d] sendBytes failed"),
        ("(EngineCore pid=835) ", "EngineCore", 835, KIND_ENGINE, (), ""),
        ("(EngineCore pid=835)", "EngineCore", 835, KIND_ENGINE, (), ""),
    ],
)
def test_prefix_forms(line: str, name: str, pid: int, kind: str, ranks: tuple, rest: str) -> None:
    lane, offset = PrefixParser().parse(line)
    assert lane is not None
    assert (lane.name, lane.pid, lane.kind, lane.ranks) == (name, pid, kind, ranks)
    assert line[offset:] == rest


@pytest.mark.parametrize(
    "line",
    ["(foo) bar", "(Worker pid=1)glued", "[rank1]:glued", "(see above) error", "[probe] import took 3s", "[W1130 01:28:53 x.cc:1] w",
     "plain text", "", "(unterminated pid=3"],
)
def test_things_that_are_not_prefixes(line: str) -> None:
    assert PrefixParser().parse(line) == (None, 0)


def test_embedded_prefix_after_an_unfinished_bar() -> None:
    text = "Processed prompts:   0%|          | 0/3 [00:00<?, ?it/s](Worker pid=20007) ERROR 11-30 x"
    cut = PrefixParser.find_embedded(text)
    assert text[cut:].startswith("(Worker pid=20007) ERROR")
    # A nameless "(pid=N)" inside a message is not a lane switch.
    assert PrefixParser.find_embedded("killing process (pid=456) now") == -1


def test_compress_names() -> None:
    workers = [f"Worker_TP{i}" for i in range(8)]
    assert compress_names(workers) == "Worker_TP0\u20137"
    assert compress_names(["Worker_TP0", "Worker_TP1", "Worker_TP3", "EngineCore"]) == "Worker_TP0\u20131,3, EngineCore"
    assert compress_names(["VllmWorker rank=2", "VllmWorker rank=0", "VllmWorker rank=1"]) == "VllmWorker rank=0\u20132"
    assert compress_names(["Worker_DP0_TP1", "Worker_DP1_TP1"]) == "Worker_DP0_TP1, Worker_DP1_TP1"


def test_name_score_prefers_the_most_telling_name() -> None:
    assert name_score("Worker_TP0") > name_score("VllmWorker-0") > name_score("Worker")
    assert name_score("Worker_DP0_TP1") > name_score("Worker_TP1")
