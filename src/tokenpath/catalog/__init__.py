"""Embedded, cited data: model shapes (models.toml) and chip specifications (chips.toml).

Each file holds one table per entry, keyed by its canonical name; an entry may list `aliases`.
Names match case-insensitively, with '_' read as '-' and a leading 'org/' (a Hugging Face id)
dropped.
"""

from __future__ import annotations

import difflib
import functools
from importlib import resources

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from tokenpath.config.errors import UserError, quoted

MODELS_FILE = "models.toml"
CHIPS_FILE = "chips.toml"


@functools.cache
def _load(filename: str) -> dict[str, dict]:
    text = resources.files(__name__).joinpath(filename).read_text(encoding="utf-8")
    return tomllib.loads(text)


@functools.cache
def _aliases(filename: str) -> dict[str, str]:
    """Every accepted name (canonical names and aliases, normalized) -> canonical name."""
    index: dict[str, str] = {}
    for canonical, entry in _load(filename).items():
        for name in (canonical, *entry.get("aliases", ())):
            index[normalize_name(name)] = canonical
    return index


def normalize_name(name: str) -> str:
    """'Meta-Llama/Llama-3.1-8B' -> 'llama-3.1-8b'; 'H100_SXM' -> 'h100-sxm'."""
    return name.strip().rsplit("/", 1)[-1].lower().replace("_", "-")


def entry_names(filename: str) -> list[str]:
    """Canonical names in file order."""
    return list(_load(filename))


def lookup(filename: str, name: str, kind: str, list_command: str) -> tuple[str, dict]:
    """(canonical name, a copy of its table); an unknown name raises UserError with the nearest match.

    Suggestions come from canonical names first, then aliases, so a near miss points at the entry
    the catalog lists rather than one of its aliases.
    """
    index = _aliases(filename)
    canonical = index.get(normalize_name(name))
    if canonical is not None:
        return canonical, dict(_load(filename)[canonical])
    key = normalize_name(name)[:200]
    close = difflib.get_close_matches(key, entry_names(filename), n=1) or difflib.get_close_matches(
        key, list(index), n=1
    )
    hint = f"did you mean {close[0]!r}?" if close else f"known {kind}s: {', '.join(entry_names(filename))}."
    raise UserError(f"unknown {kind} {quoted(name)}; {hint} See `tokenpath {list_command}`.")
