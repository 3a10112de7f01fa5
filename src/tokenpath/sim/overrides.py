"""Scenario overrides by dotted key: `--set KEY=VALUE` on the command line, and the one function that
applies `{dotted key: value}` to a raw scenario table (levers, capacity and sweeps change scenarios
this one way).

A value is read as a TOML value (`4`, `true`, `"20 ms"`, `[0, 1]`, `{kind = "switch"}`); a bare word
that is not valid TOML (`async`, `20 ms`, `dgx-h100`) is taken as a string, as a user means it. Keys
are checked against the scenario's schema here, so a typo is an error naming the key before anything
runs; the values are validated with the whole table, exactly as the TOML file's are.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from typing import Any

import tomllib
from pydantic import BaseModel

from tokenpath.config.config_errors import _models_in
from tokenpath.config.errors import UserError, quoted

# A dotted key's parts are TOML bare keys: letters, digits, '_' and '-'.
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_VALUE_KEY = "value"


def parse_value(text: str) -> Any:
    """`text` as a TOML value, or the text itself when it is not one (a bare word)."""
    try:
        parsed = tomllib.loads(f"{_VALUE_KEY} = {text}")
    except (ValueError, RecursionError):  # not TOML (TOMLDecodeError), an integer of more digits than Python
        # converts (sys.get_int_max_str_digits), or arrays nested deeper than the parser recurses
        return text
    if set(parsed) != {_VALUE_KEY}:  # e.g. '1\nother = 2': not one value
        return text
    return parsed[_VALUE_KEY]


def parse_assignment(text: str, flag: str = "--set") -> tuple[str, Any]:
    """'a.b.c=VALUE' -> ('a.b.c', parsed VALUE)."""
    key, equals, value = text.partition("=")
    key = key.strip()
    if not equals or not key:
        raise UserError(f"{flag} {quoted(text)}: give KEY=VALUE with a dotted scenario key, e.g. "
                        f"{flag} deployment.tp=4 or {flag} delivery.detokenize=detokenizer")
    check_key_syntax(key, flag)
    return key, parse_value(value.strip())


def parse_assignments(texts: list[str] | None, flag: str = "--set") -> dict[str, Any]:
    """Repeated `--set` flags as {dotted key: value}; a later one for the same key wins."""
    overrides: dict[str, Any] = {}
    for text in texts or []:
        key, value = parse_assignment(text, flag)
        overrides.pop(key, None)  # keep the order in which they were last given
        overrides[key] = value
    return overrides


def check_key_syntax(dotted: str, flag: str = "--set") -> None:
    if not all(_BARE_KEY.match(part) for part in dotted.split(".")):
        raise UserError(f"{flag} {quoted(dotted)}: a key is names joined by dots, each of letters, digits, '_' "
                        "or '-', e.g. deployment.tp")


def _check_assumption(dotted: str, names: list[str], flag: str) -> None:
    """`assumptions.NAME`: a registered assumption (`tokenpath assumptions`) or `calibration`."""
    from tokenpath.config.assumptions import lookup

    if len(names) > 1:
        raise UserError(f"{flag} {dotted}: assumptions.{names[0]} is a value, not a table; set it itself")
    if names[0] != "calibration":
        try:
            lookup(names[0])
        except UserError as error:
            raise UserError(f"{flag} {error}") from None


def check_key(dotted: str, root: type[BaseModel] | None = None, flag: str = "--set") -> None:
    """An unknown key of the scenario schema is an error naming it and the keys allowed there.

    The walk stops where the schema does not fix the keys (a fabric table, whose keys depend on its
    `kind`): validating the whole table reports those.
    """
    if root is None:
        from tokenpath.sim.scenario import Scenario

        root = Scenario
    check_key_syntax(dotted, flag)
    owner: type[BaseModel] | None = root
    parts = dotted.split(".")
    if parts[0] == "assumptions" and len(parts) > 1 and "assumptions" in root.model_fields:
        _check_assumption(dotted, parts[1:], flag)
        return
    for depth, part in enumerate(parts):
        field = owner.model_fields.get(part)
        if field is None:
            known = list(owner.model_fields)
            close = difflib.get_close_matches(part, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            where = ".".join(parts[:depth]) or "the top level"
            raise UserError(f"{flag} {dotted}: unknown key {part!r} in {where}; "
                            f"{hint}allowed there: {', '.join(known)}")
        models = _models_in(field.annotation)
        if not models and depth < len(parts) - 1:
            shown = ".".join(parts[:depth + 1])
            raise UserError(f"{flag} {dotted}: {shown} is a value, not a table; set {shown} itself")
        if len(models) != 1:  # a value, or a table whose keys depend on its kind
            return
        owner = models[0]


def flatten(table: dict[str, Any], is_leaf: Callable[[dict[str, Any]], bool] = lambda value: False,
            prefix: str = "") -> dict[str, Any]:
    """Nested tables as dotted keys: `{"delivery": {"stream_interval": 2}}` (TOML's unquoted dotted keys)
    -> {"delivery.stream_interval": 2}; a table for which `is_leaf` holds stays a value."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict) and not is_leaf(value):
            flat.update(flatten(value, is_leaf, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def apply_overrides(table: dict[str, Any], overrides: dict[str, Any], check: bool = True,
                    flag: str = "--set") -> dict[str, Any]:
    """Set each dotted key of `overrides` in the raw scenario `table` (in place; also returned).

    With `check`, every key is first checked against the scenario schema (`check_key`); the values are
    validated when the table is built (`scenario.build_scenario`), like the file's own.
    """
    from tokenpath.sim.scenario import set_path

    for dotted, value in overrides.items():
        if check:
            check_key(dotted, flag=flag)
        try:
            set_path(table, dotted, value)
        except UserError as error:
            raise UserError(f"{flag} {error}") from None
    return table
