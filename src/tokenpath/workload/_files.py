"""Opening and hashing the files a workload reads, with errors that name the path."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

from tokenpath.errors import UserError


@contextmanager
def open_text(path: str | os.PathLike[str], what: str) -> Iterator[IO[str]]:
    """Open `path` as UTF-8 text (a leading byte-order mark is dropped); a `UserError` if that fails."""
    try:
        file = open(path, encoding="utf-8-sig", newline="")
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found; check the path") from None
    except OSError as error:
        raise UserError(f"{path}: cannot open {what}: {error.strerror}; check the path") from None
    with file:
        try:
            yield file
        except UnicodeDecodeError:
            raise UserError(f"{path}: {what} is not UTF-8 text; convert it or point at the right file") from None


def sha256_file(path: str | os.PathLike[str], what: str) -> str:
    """The hex sha256 of the file's bytes."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as file:
            for chunk in iter(lambda: file.read(1 << 20), b""):
                digest.update(chunk)
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found; check the path") from None
    except OSError as error:
        raise UserError(f"{path}: cannot read {what}: {error.strerror}; check the path") from None
    return digest.hexdigest()
