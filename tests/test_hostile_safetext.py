"""The one rule for host text on the operator's terminal (eaglewatch.safetext): what it shows, and that nothing it
lets through can drive a terminal, for strings and for byte streams cut anywhere."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hostile_support import HOSTILE, HOSTILE_LOG, NUL, SHOWN, assert_safe

from eaglewatch.safetext import TerminalStream, safe_text


def test_each_hostile_sequence_is_shown_visibly():
    for hostile in (*HOSTILE, NUL):
        shown = safe_text(f"run-{hostile}-x")
        assert shown == f"run-{SHOWN[hostile]}-x"
        assert_safe(shown, what=repr(hostile))


def test_ordinary_text_of_any_script_passes_unchanged():
    for text in ("extract llama-3 (tp=8)", "日本語のラン", "naïve café ✓ 🚀", "a\\x1b is only a backslash", "",
                 "עברית", "emoji with joiner 👩‍💻"):
        assert safe_text(text) == text


def test_line_ends_and_tabs_are_escaped_unless_kept():
    assert safe_text("a\nb\tc\rd") == "a\\nb\\tc\\rd"
    assert safe_text("a\nb\tc\rd", keep="\n") == "a\nb\\tc\\rd"
    assert safe_text("a\nb\tc\rd", keep="\n\t\r") == "a\nb\tc\rd"


def test_anything_is_shown_as_text_and_lone_surrogates_can_be_printed():
    assert safe_text(None) == ""
    assert safe_text(42) == "42"
    assert safe_text(["\x1b[2J"]) == "['\\x1b[2J']"  # the list's repr already escaped it
    shown = safe_text("bad \udc80 half")
    assert shown == "bad \\udc80 half"
    shown.encode("utf-8")  # strict: would raise for a lone surrogate


@given(st.text())
def test_safe_text_is_safe_and_idempotent(text):
    shown = safe_text(text)
    assert_safe(shown)
    assert safe_text(shown) == shown
    shown.encode("utf-8")


def _stream(data: bytes, cuts: list[int]) -> bytes:
    stream = TerminalStream()
    out, last = [], 0
    for cut in sorted(set(cuts)):
        out.append(stream.feed(data[last:cut]))
        last = cut
    out.append(stream.feed(data[last:]))
    out.append(stream.finish())
    return b"".join(out)


def test_the_stream_keeps_text_line_ends_tabs_and_colour_and_shows_the_rest():
    out = _stream(HOSTILE_LOG, [])
    assert_safe(out, allow_sgr=True, allow_cr=True, what="attach stream")
    text = out.decode()
    assert "plain line one\n" in text and "plain last line\n" in text
    assert "\x1b[1;31mred words\x1b[0m and \x1b[32mgreen\x1b[0m\n" in text  # SGR as it was
    assert "progress 10%\rprogress 20%\rprogress 100%\n" in text and "tab\tend" in text
    for hostile in (*HOSTILE, NUL):
        assert SHOWN[hostile] in text, hostile
    assert "\\x9b2J raw 8-bit csi" in text  # a byte that is not UTF-8 is shown, not passed


def test_a_colour_sequence_cut_by_a_chunk_boundary_still_arrives_whole():
    data = "\x1b[1;31mred\x1b[0m ✓ \x1b]0;PW\x07\n".encode()
    whole = _stream(data, [])
    for cut in range(1, len(data)):
        assert _stream(data, [cut]) == whole, cut
    assert whole == "\x1b[1;31mred\x1b[0m ✓ ␛]0;PW\\x07\n".encode()


def test_a_stream_that_ends_inside_a_sequence_shows_what_was_held():
    stream = TerminalStream()
    assert stream.feed(b"tail \x1b[3") == b"tail "
    assert stream.finish() == "␛[3".encode()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=6))
def test_any_bytes_cut_anywhere_come_out_safe_and_the_same(data, cuts):
    whole = _stream(data, [])
    assert_safe(whole, allow_sgr=True, allow_cr=True)
    assert _stream(data, [cut for cut in cuts if cut <= len(data)]) == whole


def test_the_rule_imports_only_the_standard_library():
    # Both sides import it, and the agent's zipapp carries it to a bare Python on the host.
    import ast
    import sys

    import eaglewatch.safetext as module
    from eaglewatch.tui.connection import bundle

    tree = ast.parse(open(module.__file__, encoding="utf-8").read())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert imported - {"__future__"} <= set(sys.stdlib_module_names)
    assert "eaglewatch/safetext.py" in {name for name, _ in bundle._files()}
