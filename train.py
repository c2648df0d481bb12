#!/usr/bin/env python
"""Shim for ``seq2seq train`` (works from a clone without installing the command)."""
import sys

from seq2seq.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
