"""Bytes to segments: newline and carriage-return splitting, UTF-8 and escape sequences across chunks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglewatch.decode.lines import LineSplitter, decode_segment, strip_ansi


def segments(chunks: list[bytes], max_segment: int = 1 << 20) -> list[tuple[str, bool]]:
    splitter = LineSplitter(max_segment=max_segment)
    out: list[tuple[str, bool]] = []
    for chunk in chunks:
        out += splitter.feed(chunk)
    return out + splitter.finish()


def test_newlines_and_carriage_returns_mark_segments() -> None:
    got = segments([b"one\r\ntwo\rthree\nfour"])
    assert got == [("one", False), ("", True), ("two", False), ("three", True), ("four", True)]


def test_incomplete_line_waits_for_the_next_chunk() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"(Worker pid=1) INFO 11-30 ") == []
    assert splitter.pending == b"(Worker pid=1) INFO 11-30 "
    assert splitter.feed(b"01:02:03 [x.py:1] hi\n") == [("(Worker pid=1) INFO 11-30 01:02:03 [x.py:1] hi", True)]


def test_carriage_return_segment_is_delivered_before_the_line_ends() -> None:
    splitter = LineSplitter()
    # A live tqdm bar: the rewrite must be visible before any newline arrives.
    assert splitter.feed(b"\rbar 1%\rbar 2") == [("", False), ("bar 1%", False)]
    assert splitter.feed(b"%\n") == [("bar 2%", True)]


@pytest.mark.parametrize("cut", range(1, 12))
def test_utf8_character_split_across_chunks(cut: int) -> None:
    data = "€ é 漢\u2588\n".encode("utf-8")
    assert segments([data[:cut], data[cut:]]) == [("€ é 漢\u2588", True)]


def test_invalid_utf8_becomes_replacement_character() -> None:
    assert segments([b"bad \xff byte\n"]) == [("bad \ufffd byte", True)]


@pytest.mark.parametrize("cut", range(1, 30))
def test_ansi_sequence_split_across_chunks(cut: int) -> None:
    data = b"\x1b[0;36m(Worker_TP0 pid=7)\x1b[0;0m \x1b[32mINFO\x1b[0m msg\n"
    assert segments([data[:cut], data[cut:]]) == [("(Worker_TP0 pid=7) INFO msg", True)]


def test_strip_ansi_handles_csi_osc_and_lone_escape() -> None:
    assert strip_ansi("\x1b[1;31mred\x1b[0m") == "red"
    assert strip_ansi("\x1b]0;title\x07text") == "text"
    assert strip_ansi("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\") == "link"
    assert strip_ansi("up\x1b[Adown") == "updown"
    assert strip_ansi("lone\x1b") == "lone"
    assert strip_ansi("plain") == "plain"


def test_long_run_without_line_end_is_cut_the_same_way_whatever_the_chunking() -> None:
    data = ("x" * 25 + "é" * 10 + "\n").encode("utf-8")
    whole = segments([data], max_segment=8)
    by_byte = segments([data[i : i + 1] for i in range(len(data))], max_segment=8)
    assert whole == by_byte
    assert "".join(text for text, _ in whole) == "x" * 25 + "é" * 10
    assert all(len(text.encode("utf-8")) <= 8 for text, _ in whole)


def test_finish_returns_the_unterminated_last_line_once() -> None:
    splitter = LineSplitter()
    splitter.feed(b"last words")
    assert splitter.finish() == [("last words", True)]
    assert splitter.finish() == []


def _segment_by_segment(data: bytes) -> list[tuple[str, bool]]:
    """The splitter's contract written out plainly: split the bytes, then decode and clean each segment."""
    out: list[tuple[str, bool]] = []
    lines = data.split(b"\n")
    tail = lines.pop()
    for raw in lines:
        parts = raw.split(b"\r")
        out += [(decode_segment(part), False) for part in parts[:-1]] + [(decode_segment(parts[-1]), True)]
    parts = tail.split(b"\r")
    out += [(decode_segment(part), False) for part in parts[:-1]]
    return out + ([(decode_segment(parts[-1]), True)] if parts[-1] else [])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"\n", b"\r", b"\r\n", b"ok ", b"\xe2\x82\xac", b"\xe2\x82", b"\xff", b"\x1b[31m",
                                 b"\x1b]0;t\x07", b"\x1b", b"Processed: 10%|#| 1/9 [00:01<00:08, 1.0it/s]"]),
                max_size=40),
       st.lists(st.integers(0, 400), max_size=8))
def test_any_chunking_gives_what_segment_by_segment_decoding_gives(pieces: list[bytes], cuts: list[int]) -> None:
    data = b"".join(pieces)
    splitter = LineSplitter()
    got: list[tuple[str, bool]] = []
    start = 0
    for cut in sorted({c for c in cuts if c <= len(data)}) + [len(data)]:
        got += splitter.feed(data[start:cut])
        start = cut
    got += splitter.finish()
    assert got == _segment_by_segment(data)
