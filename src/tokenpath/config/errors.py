"""The one exception type for mistakes in a user's input, how an error line quotes a bad value, and the
line for a file written by another version of tokenpath."""

import reprlib

# An error line quotes at most about this many characters of a bad value: enough to recognise it,
# never a megabyte of it.
QUOTE_CHARS = 100

_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxdict = 3, 8, 8, 8
_SHORT.maxstring = _SHORT.maxother = QUOTE_CHARS


class UserError(Exception):
    """A mistake in the user's input.

    The message is one line that names the field, file or line at fault and says how to fix it.
    The CLI prints it without a traceback and exits with status 2.
    """


class DoesNotFit(UserError):
    """A deployment whose chips cannot hold the model's weights, or the KV cache of one request of the
    workload: a `UserError` that a search over deployments tells apart from an impossible split."""


def quoted(value: object) -> str:
    """`repr(value)` cut to about QUOTE_CHARS characters, saying how long it was when cut.

    A huge integer is described by its size: printing all of a 5,000-digit number is refused by
    Python itself (sys.get_int_max_str_digits) and helps nobody.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3 * QUOTE_CHARS:
        digits = value.bit_length() * 30103 // 100000  # bits x log10(2)
        return f"a number of about {digits:,} digits"
    if isinstance(value, str) and len(value) > QUOTE_CHARS:
        return f"{value[:QUOTE_CHARS]!r}... ({len(value):,} characters)"
    if isinstance(value, (str, int, float, bool)) or value is None:
        return repr(value)
    text = _SHORT.repr(value)
    return text if len(text) <= 2 * QUOTE_CHARS else f"{text[:QUOTE_CHARS]}..."


def same_family(schema: object, current: str) -> bool:
    """Whether `schema` is a version of `current`'s kind of document (the part up to its "/"), this one or another."""
    return isinstance(schema, str) and schema.startswith(current.rpartition("/")[0] + "/")


def check_version(schema: object, current: str, where: str, what: str, again: str) -> None:
    """A `UserError` for a document of `current`'s kind but another version (written by another release of
    tokenpath): which schema it has, which this version reads, and `again`, how to write it anew."""
    if same_family(schema, current) and schema != current:
        raise UserError(f"{where}: {what} of schema {quoted(schema)}, but this version of tokenpath reads "
                        f"{current!r}; {again}")
