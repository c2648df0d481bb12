#!/usr/bin/env python
"""Shim for ``seq2seq translate`` (works from a clone without installing the command)."""
import sys

from seq2seq.cli.translate import main

if __name__ == "__main__":
    sys.exit(main())
