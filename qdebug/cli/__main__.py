"""``python -m qdebug.cli``: the same as the ``qdebug`` console script."""

import sys

from qdebug.cli import main

if __name__ == "__main__":
    sys.exit(main())
