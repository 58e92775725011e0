"""``python -m qdebug.cli``: the same as the ``qdebug`` console script."""

from qdebug.cli import console_main

if __name__ == "__main__":
    console_main()
