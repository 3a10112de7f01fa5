"""Opening and hashing the files a workload reads, with errors that name the path."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

from tokenpath.config.files import MAX_DATA_BYTES, open_input


@contextmanager
def open_text(path: str | os.PathLike[str], what: str) -> Iterator[IO[str]]:
    """Open `path` as UTF-8 text (a leading byte-order mark is dropped); a `UserError` if that fails,
    if it is not a regular file of at most MAX_DATA_BYTES, or if it is not UTF-8."""
    with open_input(path, what, MAX_DATA_BYTES, encoding="utf-8-sig") as file:
        yield file


def sha256_file(path: str | os.PathLike[str], what: str, max_bytes: int = MAX_DATA_BYTES) -> str:
    """The hex sha256 of the file's bytes."""
    digest = hashlib.sha256()
    with open_input(path, what, max_bytes, binary=True) as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
