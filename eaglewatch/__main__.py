import sys

from eaglewatch.cli import main

if __name__ == "__main__":
    sys.exit(main())
