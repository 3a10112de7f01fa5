"""The engines' flags as flags.toml records them, and the check of a command line against them."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


@functools.cache
def programs() -> dict[str, dict[str, Any]]:
    """Every program flags.toml records (vllm, sglang, ...): its version, source, command and flags."""
    text = resources.files(__package__).joinpath("flags.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def program_of(argv: list[str]) -> str:
    """The program whose recorded command `argv` starts with (the longest such command)."""
    matches = [(len(p["command"]), name) for name, p in programs().items() if argv[:len(p["command"])] == p["command"]]
    if not matches:
        raise ValueError(f"no recorded program starts {argv[:3]}")
    return max(matches)[1]


def parse(argv: list[str]) -> tuple[str, list[str], list[tuple[str, list[str]]]]:
    """(program, positionals, [(flag, values)]) of a command line, each flag read as its engine defines it.

    A flag the program does not have, a value outside the ones it accepts, or a value missing raises
    ValueError: what the tests call on every command the emitters write."""
    name = program_of(argv)
    program = programs()[name]
    flags = program["flags"]
    rest = argv[len(program["command"]):]
    positionals: list[str] = []
    options: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(rest):
        token = rest[i]
        if not token.startswith("-"):
            positionals.append(token)
            i += 1
            continue
        spec = flags.get(token)
        if spec is None and token.startswith("--no-") and flags.get("--" + token[5:], {}).get("kind") == "bool":
            spec = {"kind": "switch"}
        if spec is None:
            raise ValueError(f"{name} {program['version']} has no flag {token}")
        taken = {"switch": 0, "bool": 0, "value": 1}.get(spec["kind"])
        if taken is None:  # "values": up to the next flag
            taken = next((k for k, t in enumerate(rest[i + 1:]) if t.startswith("--")), len(rest) - i - 1)
        values = rest[i + 1:i + 1 + taken]
        if len(values) != taken or taken == 0 and spec["kind"] == "values":
            raise ValueError(f"{name}: {token} needs a value")
        if "values" in spec and any(v not in spec["values"] for v in values):
            raise ValueError(f"{name}: {token} {' '.join(values)} is not one of {', '.join(spec['values'])}")
        options.append((token, values))
        i += 1 + taken
    if len(positionals) != program["positionals"]:
        raise ValueError(f"{name} takes {program['positionals']} positional argument(s), got {positionals}")
    return name, positionals, options


def check_yaml_keys(program: str, document: dict[str, Any]) -> None:
    """Raise ValueError for a key of `document` (dotted into its tables) that `program` does not read,
    a null where the key takes none, or a value outside the ones it accepts."""
    keys = programs()[program]["yaml_keys"]
    for key, value in _dotted(document):
        spec = keys.get(key)
        if spec is None:
            raise ValueError(f"{program} reads no YAML key {key}")
        if value is None and not spec.get("nullable", False):
            raise ValueError(f"{program}: {key}: null is not a value it takes; leave the key out for its default")
        if "values" in spec and value not in spec["values"]:
            raise ValueError(f"{program}: {key}: {value!r} is not one of {', '.join(spec['values'])}")


def _dotted(table: dict[str, Any], prefix: str = ""):
    for key, value in table.items():
        if isinstance(value, dict) and value:
            yield from _dotted(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
