"""Running the `tokenpath` entry point inside a test, and checking a user error's one line."""

import json
import sys

import tomli_w

from tokenpath.cli import main


def run_cli(argv: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """Run the entry point as `tokenpath ARGV`: (exit status, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["tokenpath", *argv])
    code = 0
    try:
        main()
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def simulate_json(argv: list[str], monkeypatch, capsys) -> dict:
    """`tokenpath simulate ARGV --json -`, which must succeed: its result document."""
    code, out, err = run_cli(["simulate", *argv, "--json", "-"], monkeypatch, capsys)
    assert code == 0, err
    return json.loads(out)


def assert_user_error(code: int, out: str, err: str, *fragments: str) -> str:
    """Exit status 2, no traceback, one `error:` line holding every fragment; returns the line."""
    assert code == 2, (out, err)
    assert "Traceback" not in out and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def toml_value(value) -> str:
    """`value` written on one line as a TOML value (what a user types after `--set KEY=`)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f'"{k}" = {toml_value(v)}' for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return tomli_w.dumps({"v": value}).removeprefix("v = ").strip()
