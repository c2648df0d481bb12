"""What a command does, above everything it composes: typed configs and paths in, files out.

``translate`` (``seq2seq translate``: streamed translation with scores, alignments, attributions,
plots and the HTML viewer), ``align`` (``seq2seq align``: forced alignment and AER), ``compare``
(``seq2seq compare``: the side-by-side report) and ``analyze`` (``seq2seq analyze``: corpus-level
head statistics). The argparse Namespace stops in ``seq2seq/cli/``: nothing here receives one."""
