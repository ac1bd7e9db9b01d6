"""When a command's lines come, from its launch: its first line, its first check line, the miniature's verdict.

    python bench/first_sign.py RESULT.json -- eaglewatch preflight ... --events EVENTS.jsonl

Writes RESULT.json with the seconds from the launch to each of those lines, the exit code, the total, and every
line with its time; the miniature's own stage times come from the events file the command writes (--events).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

CHECK_LINE = ("  [ok  ] ", "  [warn] ", "  [FAIL] ")


def main() -> int:
    out, argv = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    lines: list[tuple[float, str]] = []
    for line in proc.stdout:
        lines.append((round(time.monotonic() - started, 2), line.rstrip("\n")))
        print(f"[{lines[-1][0]:7.2f}] {line}", end="", flush=True)
    code = proc.wait()
    total = time.monotonic() - started

    def first(test) -> float | None:
        return next((t for t, text in lines if test(text)), None)

    result = {
        "argv": argv, "exit_code": code, "total_s": round(total, 2),
        "first_line_s": lines[0][0] if lines else None,
        "first_check_s": first(lambda text: text.startswith(CHECK_LINE)),
        "verdict_s": first(lambda text: text.startswith(CHECK_LINE) and text[9:].startswith("miniature ")),
        "verdict": next((text for _, text in lines if text.startswith(CHECK_LINE)
                         and text[9:].startswith("miniature ")), None),
        "lines": lines,
    }
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main())
