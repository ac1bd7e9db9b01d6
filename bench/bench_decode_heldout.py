"""Score the decoder on a held-out set of real logs: root cause first, as an expert named it.

    python bench/bench_decode_heldout.py [FOLDER]   # default bench/heldout-logs-2 (the newest set)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_decode_real_logs import decode_bytes, describe, is_type  # noqa: E402  (the test's own rule)

HERE = Path(__file__).resolve().parent


def main() -> int:
    held = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "heldout-logs-2"
    cases = json.loads((held / "cases.json").read_text())
    right = 0
    for case in cases:
        _events, state = decode_bytes((held / f"{case['slug']}.log").read_bytes())
        failures = state.failures_ranked()
        want = case["root_cause"]
        good = False
        if failures:
            root = failures[0]
            text = "\n".join((root.message, f"{root.exc_type}: {root.message}", root.first.text))
            good = is_type(root, want["exc_type"]) and want["message_contains"] in text
        right += good
        got = describe(failures[0]) if failures else "no failure"
        print(f"{'right' if good else 'WRONG'}  {case['slug']}: {got}; expected {want['exc_type']}")
    print(f"{right} of {len(cases)} held-out logs decoded to the expected root cause")
    return 0


if __name__ == "__main__":
    sys.exit(main())
