"""``eaglewatch preflight``: the same flags as ``extract``; checks, then the miniature. Exit 2 on a failure."""

from __future__ import annotations

import argparse
import json
import sys

from eaglewatch.errors import UserError
from eaglewatch.pipeline import output, plan
from eaglewatch.pipeline.events import EventLog
from eaglewatch.pipeline.output_lock import describe_writers

HELP = "check an extraction in seconds (model, layers, TP, data, memory, disk, versions) and run a miniature"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    plan.add_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--events", metavar="PATH", help="also append each check and stage as an event (JSON lines, "
                                                          "with its details: the miniature's stage times) to PATH")


def run(args: argparse.Namespace) -> int:
    from eaglewatch.pipeline.preflight import print_progress, print_row, print_summary, run_preflight

    from eaglewatch.pipeline.preflight.checks import WARN, CheckResult

    cfg = plan.ExtractConfig.from_args(args)
    # Each check's line as it finishes, and a running miniature's stage every few seconds: nothing waits silent.
    # (--json prints one document at the end.)
    show = None if args.json else (lambda result: print_row(result, sys.stdout))
    tick = None if args.json else (lambda stage, elapsed, line: print_progress("miniature", stage, elapsed, line,
                                                                                sys.stdout))
    events = EventLog(args.events, echo=None, include_env=False) if args.events else None
    try:
        report = run_preflight(cfg, events, miniature=not args.no_miniature, miniature_samples=args.miniature_samples,
                               runs_here=False, on_result=show, on_tick=tick)
    except OSError as exc:  # a path given that cannot be read (permissions, a loop of links)
        raise UserError(output.describe_os_error(exc)) from None
    finally:
        if events is not None:
            events.close()
    writers = describe_writers(cfg.output_path) if cfg.output_path.is_dir() else []
    if writers:
        busy = CheckResult("output folder", WARN, f"{cfg.output_path} is being written by {'; '.join(writers)}",
                           "extract refuses a folder another run writes: wait for that run or stop it")
        report.results.append(busy)
        if show is not None:
            show(busy)
    if args.json:
        print(json.dumps({"passed": report.passed, "results": [r.as_dict() for r in report.results]}, indent=2))
    else:
        print_summary(report, sys.stdout)
    return 0 if report.passed else 2
