"""``python -m qdebug``: the same as the ``qdebug`` command."""

from qdebug._entry import console_main

if __name__ == "__main__":
    console_main()
