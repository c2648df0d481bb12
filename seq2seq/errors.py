"""The exceptions for what a user can cause and fix: a bad file, flag, config or checkpoint
(``UserError``), and a write the operating system refused (``OutputError``)."""


class UserError(Exception):
    """An error caused by user input. CLIs print its message without a traceback and exit 2.

    The message must name the file, line or flag at fault and say how to fix it.
    """


class OutputError(UserError):
    """The operating system refused a write the user can fix: no space left, a read-only file system,
    permission denied, a path that is a file, too many open files. The command failed (CLIs exit 1, not
    2: it is not a usage error); the message names the path, what was being written and what survived."""
