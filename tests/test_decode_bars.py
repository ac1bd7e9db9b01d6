"""tqdm bars, parsed in general and checked against tqdm's own output where tqdm is installed."""

from __future__ import annotations

import io

import pytest

from eaglewatch.decode.bars import parse_bar, parse_interval, parse_number
from eaglewatch.decode.decoder import Decoder, decode_bytes
from eaglewatch.decode.events import BarUpdate


def bar(text: str) -> BarUpdate:
    found = parse_bar(text, "lane")
    assert found is not None, text
    return found[0]


def test_vllm_shard_loading_bar() -> None:
    got = bar("Loading safetensors checkpoint shards:  70% Completed | 45/64 [17:35<05:33, 17.56s/it]")
    assert got.desc == "Loading safetensors checkpoint shards"
    assert (got.n, got.total, got.percent) == (45, 64, 70)
    assert (got.elapsed_s, got.remaining_s) == (17 * 60 + 35, 5 * 60 + 33)
    assert (got.rate, got.rate_unit) == (17.56, "s/it")
    assert got.per_second == pytest.approx(1 / 17.56)
    # ETA from n, total and the rate agrees with the bar's own remaining time.
    assert got.eta_s == pytest.approx(19 * 17.56)
    assert abs(got.eta_s - got.remaining_s) < 1


def test_default_bar_with_postfix_and_unknown_rate() -> None:
    got = bar("Processed prompts:   0%|          | 0/3 [00:00<?, ?it/s, est. speed input: 0.00 toks/s, "
              "output: 0.00 toks/s]")
    assert (got.desc, got.n, got.total, got.percent) == ("Processed prompts", 0, 3, 0)
    assert got.rate is None and got.remaining_s is None and got.eta_s is None
    assert got.postfix == "est. speed input: 0.00 toks/s, output: 0.00 toks/s"


def test_bar_without_total_and_without_description() -> None:
    got = bar("Scanned: 123file [00:05, 22.36file/s]")
    assert (got.desc, got.n, got.total, got.unit, got.rate_unit) == ("Scanned", 123, None, "file", "file/s")
    assert got.eta_s is None and not got.done
    got = bar("  5%|5         | 5/100 [00:03<00:57,  1.67it/s]")
    assert (got.desc, got.n, got.total) == ("", 5, 100)


def test_si_scaled_counts_and_hours() -> None:
    got = bar("Download:   4%|\u258d         | 45.2M/1.20G [00:12<05:06, 3.77MB/s]")
    assert (got.n, got.total, got.unit, got.rate) == (45.2e6, 1.2e9, "B", 3.77e6)
    assert abs(got.eta_s - got.remaining_s) < 5
    got = bar("long:  50%|#####     | 50/100 [2:01:40<2:01:40, 146.00s/it]")
    assert got.elapsed_s == 2 * 3600 + 100 and got.eta_s == pytest.approx(7300)


def test_eta_from_average_pace_when_rate_is_missing() -> None:
    got = BarUpdate("l", "d", n=25, total=100, percent=25, elapsed_s=10, remaining_s=None, rate=None,
                    rate_unit=None, postfix=None)
    assert got.eta_s == pytest.approx(30)


def test_text_glued_after_a_bar_is_left_for_the_caller() -> None:
    text = "Processed prompts:   0%|          | 0/3 [00:00<?, ?it/s](Worker pid=7) ERROR x"
    found = parse_bar(text, "main")
    assert found is not None and text[found[1]:] == "(Worker pid=7) ERROR x"


@pytest.mark.parametrize(
    "text",
    ["[probe] LLM() init took 32.7s", "Elapsed time [00:05]", "Step 5 [00:10<00:20, 2.00it/s]",
     "INFO 11-30 01:28:09 [api_utils.py:286] args", "plain", "ratio 3/4 [done]"],
)
def test_not_bars(text: str) -> None:
    assert parse_bar(text, "lane") is None


def test_number_and_interval_parsing() -> None:
    assert parse_number("1.23k") == 1230 and parse_number("7") == 7
    assert parse_interval("01:02") == 62 and parse_interval("1:00:01") == 3601 and parse_interval("?") is None


tqdm = pytest.importorskip("tqdm")


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(n=45, total=64, elapsed=1055, prefix="Loading safetensors checkpoint shards", rate=1 / 17.56),
        dict(n=3, total=3, elapsed=0.02, prefix="Rendering prompts"),
        dict(n=0, total=3, elapsed=0, prefix="Processed prompts", postfix="est. speed input: 0.00 toks/s"),
        dict(n=123, total=None, elapsed=5.5, prefix="Scanned", unit="file"),
        dict(n=45_200_000, total=1_200_000_000, elapsed=12, unit="B", unit_scale=True, prefix="Download"),
        dict(n=5, total=100, elapsed=3, ascii=True),
        dict(n=5, total=100, elapsed=3, prefix="desc: with colon"),
        dict(n=1234, total=None, elapsed=10, unit_scale=True),
        dict(n=50, total=100, elapsed=7300, prefix="hours"),
        dict(n=999, total=1000, elapsed=59, prefix="almost", unit="tok"),
        # the pipeline's own bar (pipeline/extract.py)
        dict(n=20, total=64, elapsed=3, prefix="Extracting hidden states", unit="sample", ncols=100),
    ],
)
def test_tqdm_format_meter(kwargs: dict) -> None:
    text = tqdm.tqdm.format_meter(**kwargs)
    got = bar(text)
    assert got.desc == kwargs.get("prefix", "")
    assert got.n == pytest.approx(kwargs["n"], rel=0.01)
    if kwargs["total"] is None:
        assert got.total is None
    else:
        assert got.total == pytest.approx(kwargs["total"], rel=0.01)
        if got.remaining_s is not None and got.eta_s is not None:
            # tqdm rounds the rate to 2 decimals and the remaining time to the second.
            assert abs(got.eta_s - got.remaining_s) <= max(1.5, 0.02 * got.remaining_s)


def test_real_tqdm_stream_keeps_only_the_last_state_and_adds_no_lines() -> None:
    sink = io.StringIO()
    for _ in tqdm.tqdm(range(40), desc="Writing hidden states", file=sink, mininterval=0, miniters=1,
                       ascii=False, total=40):
        pass
    data = sink.getvalue().encode("utf-8")
    assert data.count(b"\r") > 10
    events, state = decode_bytes(data)
    bars = [e for e in events if isinstance(e, BarUpdate)]
    # Read in one go, a rewrite that the next one replaces at once is skipped; the 100 % one is kept.
    assert [b.n for b in bars] == [40, 40]
    (only,) = state.bars_list()
    assert (only.desc, only.last.n, only.last.total, only.last.done) == ("Writing hidden states", 40, 40, True)
    assert sum(lane.lines for lane in state.lanes_list()) == 0

    # Arriving as tqdm writes them, each rewrite is news when it comes, and every one is read.
    decoder = Decoder()
    live = []
    for piece in data.split(b"\r")[1:]:
        live += [e for e in decoder.feed(b"\r" + piece) if isinstance(e, BarUpdate)]
    live += [e for e in decoder.finish() if isinstance(e, BarUpdate)]
    assert [b.n for b in live] == [b.n for b in (bar(t) for t in data.decode().split("\r")[1:])]


def test_rewrites_of_one_bar_in_one_chunk_collapse_but_other_bars_and_lines_do_not() -> None:
    data = (b"\rLoading: 10%|#| 1/10 [00:01<00:09, 1.00it/s]\rLoading: 20%|##| 2/10 [00:02<00:08, 1.00it/s]"
            b"\rSaving: 50%|#####| 1/2 [00:01<00:01, 1.00it/s]\rSaving: 100%|##########| 2/2 [00:02<00:00, 1.00it/s]"
            b"\rSaving: 0%| | 0/2 [00:00<?, ?it/s]\rRuntimeError: boom [x]\rLoading: 30%|###| 3/10 [00:03<00:07, 1.00it/s]\n")
    events, state = decode_bytes(data)
    bars = [(e.desc, e.n) for e in events if isinstance(e, BarUpdate)]
    # Loading at 1 and Saving at 1 are rewritten at once by the same bar: skipped. Saving at 100 % stays although
    # Saving at 0 follows; Saving at 0 stays, the next segment is not a bar.
    assert bars == [("Loading", 2), ("Saving", 2), ("Saving", 0), ("Loading", 3)]
    assert state.failures_ranked()[0].exc_type == "RuntimeError"
