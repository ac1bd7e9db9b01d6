"""``eaglewatch preflight``: the same flags as ``extract``; checks, then the miniature. Exit 2 on a failure."""

from __future__ import annotations

import argparse
import json
import sys

from eaglewatch.pipeline import plan

HELP = "check an extraction in seconds (model, layers, TP, data, memory, disk, versions) and run a miniature"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    plan.add_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def run(args: argparse.Namespace) -> int:
    from eaglewatch.pipeline.preflight import print_table, run_preflight

    cfg = plan.ExtractConfig.from_args(args)
    report = run_preflight(cfg, miniature=not args.no_miniature, miniature_samples=args.miniature_samples)
    if args.json:
        print(json.dumps({"passed": report.passed, "results": [r.as_dict() for r in report.results]}, indent=2))
    else:
        print_table(report, sys.stdout)
    return 0 if report.passed else 2
