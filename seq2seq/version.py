"""The package version (one place; ``seq2seq.__version__`` and the records read it)."""

__version__ = "0.1.0"
