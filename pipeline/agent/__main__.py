"""``python -m eaglewatch.pipeline.agent``: the same as ``eaglewatch agent``."""

import sys

from eaglewatch.pipeline.agent.cli import main

if __name__ == "__main__":
    sys.exit(main())
