"""The one exception type for mistakes a user can make (bad file, flag, config, checkpoint)."""


class UserError(Exception):
    """An error caused by user input. CLIs print its message without a traceback and exit 2.

    The message must name the file, line or flag at fault and say how to fix it.
    """
