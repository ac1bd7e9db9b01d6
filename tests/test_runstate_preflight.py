"""RunModel and the preflight's check events: the checklist, the miniature's stage and ticking time, a failed
miniature in the failures with its decoded root cause. No Textual."""

from __future__ import annotations

from eaglewatch import protocol as p
from eaglewatch.tui.runstate import RunModel

ROOT_CAUSE = {"summary": "AssertionError at vllm_connector.py:142 in _submit: assert self._writes_submitted < "
                         "self._fault_after [VllmWorker-0]",
              "exc_type": "AssertionError", "hint": "an assertion inside vLLM's worker"}
# The printed table of the same run, as extract writes it to its log.
TABLE = (b"  [ok  ] model folder  LlamaForCausalLM: 4 layers, hidden 128, 8 shards\n"
         b"  [FAIL] miniature     the 4-layer miniature failed: " + ROOT_CAUSE["summary"].encode() + b"\n"
         b"                       fix: see /tmp/mini/miniature.log; fix this before the real load\n"
         b"preflight: FAILED (1 failed, 0 warnings, 2 checks)\n")


class Wall:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def check(t: float, name: str, status: str, reason: str = "", **fields):
    return {**p.make_event(p.EVENT_CHECK, name=name, status=status, reason=reason, fix=fields.pop("fix", "")),
            "t": t, **fields}


def stage(t: float, name: str, stage: str, elapsed_s: float):
    return {**p.make_event(p.EVENT_CHECK_STAGE, name=name, stage=stage, elapsed_s=elapsed_s), "t": t}


def validating_model(wall: Wall) -> RunModel:
    model = RunModel("h", {"run": "r", "state": "running", "started_at": 990.0}, wall=wall, clock=lambda: 0.0)
    model.feed_event({**p.make_event(p.EVENT_PHASE, phase=p.PHASE_VALIDATING, detail=""), "t": 995.0})
    return model


def test_each_check_shows_as_it_comes_and_the_miniature_ticks_through_its_stages():
    wall = Wall(1_000.0)
    model = validating_model(wall)
    model.feed_event(check(1_000.0, "model folder", "pass", "LlamaForCausalLM: 4 layers"))
    model.feed_event(check(1_000.1, "disk", "warn", "12 GB free", fix="free some space"))
    model.feed_event(stage(1_000.2, "miniature", "building", 0.0))
    wall.now = 1_003.2
    checks = model.snapshot().checks
    assert [(c.name, c.status) for c in checks] == [("model folder", "pass"), ("disk", "warn"),
                                                    ("miniature", "running")]
    mini = checks[-1]
    assert mini.stage == "building" and round(mini.elapsed_s, 1) == 3.0

    model.feed_event(stage(1_004.2, "miniature", "extracting", 4.0))
    seen = model.version
    wall.now = 1_010.7
    model.tick()  # the feed loop's tick: a running check's time moves the view once a second
    assert model.version > seen
    mini = model.snapshot().checks[-1]
    assert (mini.stage, round(mini.elapsed_s, 1), round(mini.stage_elapsed_s, 1)) == ("extracting", 10.5, 6.5)
    seen = model.version
    model.tick()
    assert model.version == seen  # the same second: nothing to redraw

    model.feed_event(check(1_030.0, "miniature", "pass", "the 4-layer miniature extracted 4 samples",
                           details={"seconds": 29.8, "layer_map": {"1": 1}}))
    mini = model.snapshot().checks[-1]
    assert (mini.status, mini.stage, mini.elapsed_s) == ("pass", None, 29.8)
    assert [c.name for c in model.snapshot().checks] == ["model folder", "disk", "miniature"]
    assert model.snapshot().failures == () and model.alerts_since(0) == []


def test_a_failed_miniature_leads_the_failures_with_its_root_cause_and_alerts_once():
    wall = Wall(1_000.0)
    model = validating_model(wall)
    model.feed_event(stage(1_000.2, "miniature", "building", 0.0))
    # The table reaches the log before the check's event is read: its copy of the failure alerts first.
    model.feed_log(TABLE)
    model.feed_event(check(1_040.0, "miniature", "fail", "the 4-layer miniature failed: " + ROOT_CAUSE["summary"],
                           fix="see /tmp/mini/miniature.log; fix this before the real load",
                           details={"seconds": 39.8, "root_cause": ROOT_CAUSE, "layer_map": {"1": 1}}))
    model.finish_log()
    view = model.snapshot()
    first = view.failures[0]
    assert first.summary == ROOT_CAUSE["summary"] and first.lanes == "preflight · miniature"
    assert first.hint_title == ROOT_CAUSE["hint"] and first.ident == "check:miniature"
    assert "root cause: " + ROOT_CAUSE["summary"] + " (AssertionError)" in first.traceback
    assert "fix: see /tmp/mini/miniature.log" in first.traceback
    # The table's row is the same failure: not listed twice.
    assert not any(f.summary.startswith("PreflightCheckFailed") for f in view.failures)
    assert [a.kind for a in model.alerts_since(0)] == ["failure"]
    assert view.checks[-1].status == "fail" and view.checks[-1].elapsed_s == 39.8


def test_check_events_of_an_older_pipeline_still_show():
    """A check event without ``details``, and no stage events (an older pipeline): a checklist row all the same."""
    model = validating_model(Wall(1_000.0))
    model.feed_event({"v": 1, "kind": "check", "t": 999.0, "name": "data", "status": "fail",
                      "reason": "no samples", "fix": "check --prepared-data"})
    view = model.snapshot()
    assert [(c.name, c.status, c.elapsed_s) for c in view.checks] == [("data", "fail", None)]
    assert view.failures[0].summary == "data: no samples"
