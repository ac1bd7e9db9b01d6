"""The extraction's recent pace: the rate of the last minute (which the ETA follows) and what sets it, the disk or
the engine, from the time the stream waited on the writer alone."""

from __future__ import annotations

from eaglewatch.pipeline.extract import WRITER_BOUND_SHARE, recent_pace


def test_the_recent_rate_not_the_average_since_the_start():
    # 100k tokens in the first 10 s (page cache), then 10k tokens a minute (the disk): the recent rate is the latter.
    looks = [(60.0, 110_000, 0.0), (120.0, 120_000, 0.0)]
    rate, pace, share = recent_pace(looks, measured=True)
    assert rate == 10_000 / 60 and pace == "engine" and share == 0.0


def test_waiting_on_the_writer_most_of_the_window_is_disk_bound():
    looks = [(0.0, 0, 10.0), (60.0, 60_000, 10.0 + 60 * WRITER_BOUND_SHARE)]
    assert recent_pace(looks, measured=True)[1] == "disk"
    looks = [(0.0, 0, 10.0), (60.0, 60_000, 10.0 + 60 * WRITER_BOUND_SHARE - 1)]
    assert recent_pace(looks, measured=True)[1] == "engine"


def test_no_pace_without_two_looks_or_a_measure():
    assert recent_pace([(0.0, 0, 0.0)], measured=True) == (None, None, None)
    assert recent_pace([(0.0, 0, 0.0), (10.0, 100, 0.0)], measured=False) == (10.0, None, None)
