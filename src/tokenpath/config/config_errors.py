"""Pydantic validation errors as one line: where, what, and how to fix it.

Shared by every table a user writes (scenarios, topology files). Tagged unions (a `kind` key choosing
the model) are walked through, so an unknown key lists the keys allowed for that kind.
"""

from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from tokenpath.config.errors import QUOTE_CHARS, quoted


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (through Optional, Union and Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found += _models_in(arg)
    return found


def _walk(root: Any, loc: tuple[Any, ...]) -> tuple[type[BaseModel] | None, list[str]]:
    """The model holding the table at `loc`, and `loc` without the union tags pydantic inserts."""
    candidates = _models_in(root)
    owner: type[BaseModel] | None = None
    shown: list[str] = []
    parts = list(loc)
    while parts:
        raw = parts.pop(0)
        part = str(raw)
        if "[" in part:  # a union member's label (list[int], literal['a','b']): not a key
            continue
        if isinstance(raw, int):  # an item of a list of tables: the same model holds it
            shown.append(part)
            continue
        if owner is None or len(candidates) > 1:
            tagged = [m for m in candidates if m.model_fields.get("kind") and m.model_fields["kind"].default == part]
            if tagged:
                owner, candidates = tagged[0], [tagged[0]]
                continue
            if len(candidates) == 1:
                owner = candidates[0]
        if owner is None:
            return None, shown + [part] + [str(p) for p in parts]
        field = owner.model_fields.get(part)
        shown.append(part)
        if field is None:
            return None, shown + [str(p) for p in parts]
        candidates = _models_in(field.annotation)
        owner = candidates[0] if len(candidates) == 1 else None
    if owner is None and len(candidates) == 1:
        owner = candidates[0]
    return owner, shown


def _other_member(error: Any, errors: list[Any]) -> bool:
    """A union member of another type than the table given (`turns = {kind = ...}` is no int), beside a
    member that took the table and found what is wrong with it: its error is the one to give."""
    loc = tuple(error["loc"])
    return (error["type"].endswith("_type") and isinstance(error.get("input"), dict) and len(loc) > 0
            and any(tuple(e["loc"])[:len(loc) - 1] == loc[:-1] and tuple(e["loc"]) != loc
                    and not e["type"].endswith("_type") for e in errors))


def explain(error: ValidationError, source: str, root: Any) -> str:
    """The first error of validating a table against `root` (a model class or a type), as one line; an
    unknown key first of all, which a misspelt required key also leaves missing."""
    errors = [e for e in error.errors() if not _other_member(e, error.errors())] or error.errors()
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = tuple(first["loc"])
    if first["type"] == "extra_forbidden":
        owner, shown = _walk(root, loc[:-1])
        where = ".".join(shown + [str(loc[-1])])
        known = list(owner.model_fields) if owner is not None else []
        close = difflib.get_close_matches(str(loc[-1])[:200], known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"{source}: unknown key {quoted(where)}; {hint}allowed here: {', '.join(known)}"
    _, shown = _walk(root, loc)
    where = ".".join(shown)
    where = where if len(where) <= QUOTE_CHARS else f"{where[:QUOTE_CHARS]}..."
    message = first["msg"].removeprefix("Value error, ")
    given = first.get("input")
    if first["type"] == "union_tag_invalid":
        context = first.get("ctx", {})
        message = f"kind {quoted(context.get('tag'))} is not one of {context.get('expected_tags')}"
    if isinstance(given, bool):  # as TOML writes it
        message += f" (got {str(given).lower()})"
    elif isinstance(given, (str, int, float)) and quoted(given) not in message:
        message += f" (got {quoted(given)})"
    return f"{source}: {where}: {message}" if where else f"{source}: {message}"
