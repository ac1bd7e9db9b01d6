"""The supervisor's alert watcher, piece by piece: its stall rule, the disk's time left, Slurm's time format, the
settings it reads; and the operator's config that fills them."""

from __future__ import annotations

import pytest

from eaglewatch.errors import UserError
from eaglewatch.pipeline.agent.runwatch import AlertSettings, _Progress, parse_slurm_time, time_left
from eaglewatch.tui import config


def test_a_job_that_says_no_phase_stalls_on_silence():
    progress = _Progress(moved_at=0.0, output_at=10.0)
    assert progress.stalled_for(100.0, 0.0) == 90.0


@pytest.mark.parametrize("phase", ["validating", "loading", "extracting"])
def test_a_pipeline_phase_stalls_when_nothing_moves_not_when_it_prints(phase):
    progress = _Progress(phase=phase, moved_at=10.0, output_at=99.0)  # printing (a warning each minute) is no progress
    assert progress.stalled_for(100.0, 0.0) == 90.0
    assert progress.stalled_for(100.0, 95.0) == 5.0  # a bar that moved is


@pytest.mark.parametrize("phase", ["done", "failed", "prepared"])
def test_other_phases_never_stall(phase):
    assert _Progress(phase=phase).stalled_for(1e9, 0.0) is None


def test_time_left_at_the_current_rate():
    assert time_left([(0.0, 1000), (10.0, 900)]) == pytest.approx(90.0)
    assert time_left([(0.0, 900), (10.0, 1000)]) is None  # growing free space: never full
    assert time_left([(0.0, 900)]) is None


@pytest.mark.parametrize("text,seconds", [("1-02:03:04", 93784.0), ("02:03:04", 7384.0), ("03:04", 184.0),
                                          ("UNLIMITED", None), ("INVALID", None), ("", None), ("x-01:00", None)])
def test_slurm_time_left(text, seconds):
    assert parse_slurm_time([text] if text else []) == seconds


def test_settings_keep_the_thresholds_and_name_bad_sinks_without_the_url():
    good = AlertSettings.from_record({"webhook": "https://ntfy.sh/secret-topic", "format": "ntfy",
                                      "stall_after_s": 120, "low_disk_bytes": 5})
    assert good.sinks.webhook and good.stall_after_s == 120 and good.low_disk_bytes == 5 and not good.problems
    bad = AlertSettings.from_record({"webhook": "ftp://x/secret-topic", "stall_after_s": float("nan")})
    assert bad.sinks.empty and bad.stall_after_s == 300.0
    assert bad.problems and not any("secret-topic" in problem for problem in bad.problems)
    assert AlertSettings.from_record([1]).problems


CONFIG = """\
[dashboard]
stall_after_min = 2

[alerts]
webhook = "https://ntfy.sh/everyone"
format = "ntfy"

[hosts.h200]
target = "u@h"
alerts = { command = ["/usr/local/bin/page-me", "--team", "ml"] }

[profiles.p]
host = "h200"
argv = ["python", "x.py"]
alerts = { webhook = "https://hooks.slack.com/services/T/B/X", format = "slack" }
"""


def test_the_most_specific_alerts_win_and_carry_the_dashboard_thresholds():
    cfg = config.parse(CONFIG)
    assert cfg.alerts_for("other") == {"format": "ntfy", "webhook": "https://ntfy.sh/everyone",
                                       "stall_after_s": 120.0, "low_disk_bytes": 2 * 1024**3}
    assert cfg.alerts_for("h200")["command"] == ["/usr/local/bin/page-me", "--team", "ml"]
    assert cfg.alerts_for("h200", cfg.profiles["p"])["format"] == "slack"
    assert config.parse("").alerts_for("h200") is None


@pytest.mark.parametrize("table,problem", [
    ('[alerts]\nwebhook = "ntfy.sh/x"', "http:// or https://"),
    ('[alerts]\nformat = "json"', "needs a command or a webhook"),
    ('[alerts]\nwebhook = "https://x/y"\nformat = "teams"', "must be one of json, ntfy, slack"),
    ('[alerts]\ncommand = "page-me"', "non-empty list of strings"),
    ('[alerts]\nwebhook = "https://x/y"\nretries = 3', "unknown key"),
    ('[hosts.h]\nalerts = { webhook = "https://x/y", colour = 1 }', "unknown key"),
])
def test_a_bad_alerts_table_is_one_line_naming_it(table, problem):
    with pytest.raises(UserError) as caught:
        config.parse(table)
    assert problem in str(caught.value) and "alerts" in str(caught.value)
