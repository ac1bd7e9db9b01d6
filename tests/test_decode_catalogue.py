"""The catalogue of one-line shapes (eaglewatch/decode/lineshapes.py): every row's example decodes as that row says,
and the gate made from the rows lets every example through.

Each row has an example file, ``tests/fixtures/shapes/<name>.log`` (lines as its public thread shows them, the URL
in the row), and a golden file beside it with what the decoder names as the root cause. After an intended change:
``pytest tests/test_decode_catalogue.py --update-goldens``, then read the diff of the golden files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglewatch.decode import decode_bytes
from eaglewatch.decode.lineshapes import MARKERS, REPORTS, SHAPES, ReportShape, Shape, may_be_shape

SHAPES_DIR = Path(__file__).parent / "fixtures" / "shapes"
DOCS = Path(__file__).parent.parent / "docs" / "decode.md"


ALL = (*SHAPES, *REPORTS)


def decoded(shape: Shape | ReportShape) -> dict[str, object]:
    _, state = decode_bytes((SHAPES_DIR / f"{shape.name}.log").read_bytes())
    failures = state.failures_ranked()
    assert failures, f"{shape.name}: its example decodes to no failure"
    root = failures[0]
    return {"exc_type": root.exc_type, "message": root.message, "kind": root.first.kind,
            "signal": root.first.signal, "basis": root.basis}


@pytest.mark.parametrize("shape", ALL, ids=[shape.name for shape in ALL])
def test_each_row_reads_its_own_example(shape: Shape | ReportShape, request: pytest.FixtureRequest) -> None:
    got = decoded(shape)
    assert got["basis"] == shape.basis, f"{shape.name}'s example was read by another shape: {got}"
    golden = SHAPES_DIR / f"{shape.name}.golden.json"
    if request.config.getoption("--update-goldens"):
        golden.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    assert golden.exists(), f"no golden for {shape.name}: run with --update-goldens"
    assert got == json.loads(golden.read_text(encoding="utf-8"))


def test_rows_are_whole_and_their_files_are_all_there() -> None:
    names = [shape.name for shape in ALL]
    assert len(set(names)) == len(names)
    assert {f"{name}.log" for name in names} == {p.name for p in SHAPES_DIR.glob("*.log")}
    assert {f"{name}.golden.json" for name in names} == {p.name for p in SHAPES_DIR.glob("*.golden.json")}
    for shape in SHAPES:
        assert shape.examples and all(url.startswith("https://github.com/") for url in shape.examples), shape.name
        assert shape.triggers and shape.summary and shape.basis, shape.name
        text = (SHAPES_DIR / f"{shape.name}.log").read_text(encoding="utf-8")
        # The gate is made from the rows: each example line holds one of its row's triggers, which the gate finds.
        assert any(trigger in text for trigger in shape.triggers), shape.name
        assert may_be_shape(text), shape.name
    assert MARKERS == tuple(sorted({shape.after for shape in SHAPES if shape.after}))


def test_the_docs_table_lists_every_row() -> None:
    text = DOCS.read_text(encoding="utf-8")
    table = text[text.index("<!-- shapes table -->"):text.index("<!-- end of shapes table -->")]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [shape.name for shape in ALL]
    for shape, row in zip(ALL, rows):
        assert shape.summary in row and shape.examples[0] in row, shape.name


def test_a_usage_error_needs_its_usage_line() -> None:
    """``PROG: error: ...`` in a program's own words is a usage error only after argparse's ``usage:`` line;
    argparse's own wordings (the ``argparse-error`` row) are one without it."""
    alone = b"TRL CLI: error: no config file was found in the working directory\n"
    _, state = decode_bytes(alone)
    assert not state.failures_ranked()
    _, state = decode_bytes(b"usage: trl\n" + b"noise\n" * 50 + alone)
    assert not state.failures_ranked()  # too far from its usage line
    _, state = decode_bytes(b"usage: trl\n" + alone)
    assert [(g.exc_type, g.basis) for g in state.failures_ranked()] == [("Usage error", "command-line usage error")]
    for line in (b"TRL CLI: error: argument command: invalid choice: 'vllm-serve' (choose from 'chat', 'sft')",
                 b"vllm: error: unrecognized arguments: --config",
                 b"train.py: error: the following arguments are required: --model_name_or_path",
                 b"serve: error: argument --port: invalid int value: 'abc'"):
        _, state = decode_bytes(line + b"\n")
        found = [(g.exc_type, g.basis) for g in state.failures_ranked()]
        assert found == [("Usage error", "argparse error line")], line


def test_the_start_gate_is_made_of_the_start_rules() -> None:
    from eaglewatch.decode.traceback import EXCEPTION_SUFFIXES, START_RULES, TracebackAssembler, may_start, start_gate

    for rule in START_RULES:
        assert callable(getattr(TracebackAssembler, rule.reader)), rule.name
        for trigger in rule.triggers:
            assert start_gate(f"x {trigger} y"), (rule.name, trigger)
            assert may_start(f"x {trigger} y", "ERROR")
    # The exception line's triggers are the class-name endings its pattern accepts: one list for both.
    exception_line = next(rule for rule in START_RULES if rule.name == "exception line")
    assert set(EXCEPTION_SUFFIXES) <= set(exception_line.triggers)
    assert not may_start("all good here", "ERROR")


def test_the_gates_anchors_cover_every_trigger() -> None:
    from eaglewatch.decode.gate import anchors, make_gate

    triggers = [t for shape in SHAPES for t in shape.triggers]
    keys = anchors(triggers)
    assert len(keys) < len(set(triggers)) and all(any(key in t for key in keys) for t in triggers)
    gate = make_gate(["CUDA error: ", "las error", "UCX"])
    assert gate("x rocblas error: y") and gate("UCX") and not gate("an error") and not gate("")
