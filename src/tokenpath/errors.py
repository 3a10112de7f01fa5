"""The one exception type for mistakes in a user's input."""


class UserError(Exception):
    """A mistake in the user's input.

    The message is one line that names the field, file or line at fault and says how to fix it.
    The CLI prints it without a traceback and exits with status 2.
    """
