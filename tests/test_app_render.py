"""The panels' text, from a RunView: pure functions, no app."""

from __future__ import annotations

import dataclasses

from app_support import extracting_model

from eaglewatch.tui.app.widgets.render import extraction_text, load_text


def test_the_load_panel_shows_the_engines_latest_step_and_its_age():
    view = dataclasses.replace(extracting_model().snapshot(), phase="loading",
                               load_step="Model loading took 1.88 GiB memory and 0.95 seconds", load_step_age_s=123.0)
    text = load_text(view, 60).plain
    assert text.splitlines()[-1] == "2m03s ago Model loading took 1.88 GiB memory and 0.95 secon…"
    assert "ago" not in load_text(dataclasses.replace(view, load_step=None), 60).plain


def test_the_disk_line_says_what_the_rest_needs_rather_than_when_the_disk_would_fill():
    view = extracting_model().snapshot()
    ex = dataclasses.replace(view.extraction, disk_free=47 * 10**9, disk_total=270 * 10**9, disk_full_in_s=35.0,
                             bytes_to_go=None)
    rate_only = extraction_text(dataclasses.replace(view, extraction=ex), 80).plain
    assert "full in 35s" in rate_only
    known = extraction_text(dataclasses.replace(view, extraction=dataclasses.replace(ex, bytes_to_go=8 * 10**9)),
                            80).plain
    assert "needs 7.5 GiB more" in known and "full in" not in known
