"""``python -m eaglewatch.pipeline.agent``: the same as ``eaglewatch agent``."""

import sys

import eaglewatch

if getattr(eaglewatch, "__file__", None) is None:
    # A namespace package: a folder named eaglewatch on the path (a checkout's top folder in the working directory,
    # which ``python -m`` searches first) stood in for the package. Say so in one line rather than fail on an import.
    where = ", ".join(sorted(getattr(eaglewatch, "__path__", []))) or "a folder on the path"
    sys.exit(f"eaglewatch agent: {where} stands in for the eaglewatch package (python -m looks in the working "
             "directory first): start the agent from another folder, or with python -P (Python 3.11+)")

from eaglewatch.pipeline.agent.cli import main  # noqa: E402  (after the check above)

if __name__ == "__main__":
    sys.exit(main())
