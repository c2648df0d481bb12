"""``python -m seq2seq``: the same as the ``seq2seq`` command."""
import sys

from .cli import main

sys.exit(main())
