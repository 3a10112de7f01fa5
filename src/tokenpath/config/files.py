"""Files a user names (scenarios, traces, configs, outputs), opened so that a bad path is one clear error.

Every such path is checked before use: no NUL byte, no name longer than the file system takes. Input
files must be regular files of bounded size, so `/dev/zero`, a FIFO or a folder is refused at once
instead of hanging or filling memory. Output paths are checked before a long run, so its result is
not lost at the end for a missing folder.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Annotated

import tomllib
from pydantic import AfterValidator, Field

from tokenpath.config.errors import UserError

# Linux limits (limits.h): NAME_MAX bytes in one path component, PATH_MAX bytes in a whole path
# including its terminating NUL.
NAME_MAX_BYTES = 255
PATH_MAX_BYTES = 4096
# Largest text file read whole into memory: scenarios, topology files, model configs, calibrations
# (real ones are a few kB).
MAX_CONFIG_BYTES = 16 * 2**20
# Largest trace or lengths file: public LLM serving traces are from a few MB to a few hundred MB.
MAX_DATA_BYTES = 2 * 2**30


def shown(path: str | os.PathLike[str]) -> str:
    """A path for an error line: whole when short, else its start and its end (the file's name)."""
    text = os.fspath(path)
    text = text if isinstance(text, str) else text.decode("utf-8", "replace")
    return text if len(text) <= 120 else f"{text[:50]}...{text[-50:]}"


def path_problem(path: str | os.PathLike[str]) -> str | None:
    """Why `path` cannot name a file on this system (a NUL byte, a name too long), or None."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    if not text:
        return "the path is empty"
    if "\0" in text:
        return "the path contains a NUL byte"
    try:
        encoded = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return "the path is not valid Unicode"
    if len(encoded) >= PATH_MAX_BYTES:
        return f"the path is {len(encoded):,} bytes long; paths are limited to {PATH_MAX_BYTES - 1:,}"
    longest = max((len(part) for part in encoded.split(b"/")), default=0)
    if longest > NAME_MAX_BYTES:
        return f"a name in the path is {longest:,} bytes long; names are limited to {NAME_MAX_BYTES}"
    return None


def _valid_path(value: str) -> str:
    problem = path_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


# A config field holding a path (or a name that may be one): refused at the edge if it cannot name a file.
PathText = Annotated[str, Field(max_length=PATH_MAX_BYTES), AfterValidator(_valid_path)]


def check_path(path: str | os.PathLike[str], what: str) -> None:
    """A UserError naming `what` if `path` cannot name a file."""
    problem = path_problem(path)
    if problem is not None:
        raise UserError(f"{what} {shown(path)!r}: {problem}; give a valid path")


def is_file(path: str | os.PathLike[str]) -> bool:
    """Whether `path` names an existing regular file (False for any path that cannot name one)."""
    return _holds(os.path.isfile, path)


def exists(path: str | os.PathLike[str]) -> bool:
    """Whether `path` names anything (False for any path that cannot name a file)."""
    return _holds(os.path.exists, path)


def _holds(test, path: str | os.PathLike[str]) -> bool:
    if path_problem(path) is not None:
        return False
    try:
        return test(path)
    except (OSError, ValueError):
        return False


def _checked_size(path: str | os.PathLike[str], what: str, max_bytes: int) -> int:
    """Stat `path` as an input file: it must be a regular file of at most `max_bytes`."""
    check_path(path, what)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise UserError(f"{shown(path)}: {what} not found; check the path") from None
    except OSError as error:
        raise UserError(f"{shown(path)}: cannot open {what}: {error.strerror}; check the path") from None
    if stat.S_ISDIR(info.st_mode):
        raise UserError(f"{shown(path)}: {what} is a folder; give the path of a file")
    if not stat.S_ISREG(info.st_mode):
        raise UserError(f"{shown(path)}: {what} is not a regular file (a device, pipe or socket); "
                        "give the path of a file")
    if info.st_size > max_bytes:
        raise UserError(f"{shown(path)}: {what} is {info.st_size:,} bytes, more than the {max_bytes:,} read; "
                        "give a smaller file")
    return info.st_size


@contextmanager
def open_input(path: str | os.PathLike[str], what: str, max_bytes: int, *, binary: bool = False,
               encoding: str = "utf-8") -> Iterator[IO]:
    """Open a regular file of at most `max_bytes` for reading; a UserError if that fails or the text is
    not `encoding` while it is read."""
    _checked_size(path, what, max_bytes)
    try:
        file = open(path, "rb") if binary else open(path, encoding=encoding, newline="")
    except OSError as error:
        raise UserError(f"{shown(path)}: cannot open {what}: {error.strerror}; check the path") from None
    with file:
        try:
            yield file
        except UnicodeDecodeError:
            raise UserError(f"{shown(path)}: {what} is not UTF-8 text; convert it or point at the right file") from None
        except OSError as error:
            raise UserError(f"{shown(path)}: cannot read {what}: {error.strerror}") from None


def read_text(path: str | os.PathLike[str], what: str, max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """The whole of a UTF-8 text file (a leading byte-order mark dropped); UserErrors name `what`."""
    with open_input(path, what, max_bytes, binary=True) as file:
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew since it was checked
        raise UserError(f"{shown(path)}: {what} is more than the {max_bytes:,} bytes read; give a smaller file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise UserError(f"{shown(path)}: {what} is not UTF-8 text (byte {error.start:,} is not); convert it "
                        "or point at the right file") from None


def parse_toml(text: str, source: str) -> dict:
    """A TOML document's table; any way the text fails to parse is a one-line UserError."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise UserError(f"{source}: not valid TOML: {error}") from None
    except RecursionError:
        raise UserError(f"{source}: not valid TOML: arrays or inline tables nested too deep; flatten them") from None
    except ValueError as error:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise UserError(f"{source}: not valid TOML: {str(error).split(';')[0]}; write a smaller number") from None


def check_apart(path: str, flag: str, other: str | None, other_flag: str) -> None:
    """Refuse two outputs of one run written to the same file (the second would replace the first)."""
    if other is not None and other != "-" and os.path.realpath(path) == os.path.realpath(other):
        raise UserError(f"{flag} {shown(path)}: the same file as {other_flag}; give each its own path")


def check_writable(path: str, flag: str) -> None:
    """Refuse, before any work, an output path that cannot be written: a missing or read-only folder,
    a folder in its place, a bad name. '-' (stdout) passes."""
    if path == "-":
        return
    problem = path_problem(path)
    if problem is not None:
        raise UserError(f"{flag} {shown(path)!r}: {problem}; give a valid path")
    if os.path.isdir(path):
        raise UserError(f"{flag} {shown(path)}: is a folder; give a file path")
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            raise UserError(f"{flag} {shown(path)}: not writable; check its permissions or choose another path")
        return
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise UserError(f"{flag} {shown(path)}: the folder {folder} does not exist; create it or choose another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {shown(path)}: the folder {folder} is not writable; choose another path")
    try:  # what the permissions do not say (a root user may write anywhere, a folder like /proc takes no file)
        with open(path, "x"):
            pass
    except OSError as error:
        raise UserError(f"{flag} {shown(path)}: cannot be created ({error.strerror}); choose another path") from None
    os.unlink(path)  # (a check leaves nothing behind)
