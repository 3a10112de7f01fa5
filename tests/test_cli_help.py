"""Every command's --help shows its text as written: square brackets kept, examples line by line, and
each example a command line that runs (its command and options exist) or a TOML file that parses."""

from __future__ import annotations

import functools
import re
import shlex

import pytest
import tomllib
import typer.main

from cli_helpers import run_cli
from tokenpath.cli import app
from tokenpath.cli.options import DEFAULT_KEYS, PROFILE_DEFAULTS
from tokenpath.config.units import format_duration
from tokenpath.sim.scenario import Scenario

ROOT = typer.main.get_command(app)
SECTIONS = re.compile(r"^(Arguments|Options|Commands):$")
BRACKETED = re.compile(r"\[\[?[\w.-]+\]\]?")  # [axes], [[levers]], tokenpath[ray]; not click's [default: ...]


def _is_group(command) -> bool:
    return hasattr(command, "commands")


def _commands(group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for name, command in group.commands.items():
        found += _commands(command, (*path, name)) if _is_group(command) else [(*path, name)]
    return found


COMMANDS = _commands(ROOT)


def _resolve(path: list[str]):
    command = ROOT
    for name in path:
        command = command.commands[name]
    return command


def _help(path: tuple[str, ...], monkeypatch, capsys) -> str:
    code, out, err = run_cli([*path, "--help"], monkeypatch, capsys)
    assert code == 0, err
    return out


def _literal_blocks(text: str) -> list[list[str]]:
    """The runs of lines a help's description shows as written (indented under its paragraphs)."""
    description = []
    for line in text.splitlines()[1:]:
        if SECTIONS.match(line):
            break
        description.append(line)
    blocks: list[list[str]] = []
    for line, before in zip(description, ["", *description]):
        if line.startswith("    "):
            if not before.startswith("    "):
                blocks.append([])
            blocks[-1].append(line[4:])
    return blocks


def _check_example_command(line: str) -> None:
    words = shlex.split(line.split("  #")[0])
    assert words[0] == "tokenpath", line
    path, command = [], ROOT
    for word in words[1:]:
        if not _is_group(command):
            break
        assert word in command.commands, f"{line}: no command {word!r}"
        path.append(word)
        command = command.commands[word]
    options = {name for param in command.params for name in (*param.opts, *param.secondary_opts)} | {"--help"}
    for word in words:
        if word.startswith("--"):
            assert word.split("=")[0] in options, f"{line}: {' '.join(path)} has no option {word}"


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(path) or "tokenpath" for path in COMMANDS])
def test_help_keeps_its_text_and_its_examples_run(path, monkeypatch, capsys):
    text = _help(path, monkeypatch, capsys)
    command = _resolve(list(path))
    written = " ".join([command.help or "", *(getattr(param, "help", None) or "" for param in command.params)])
    shown = " ".join(text.split())
    for bracketed in BRACKETED.findall(written):
        assert bracketed in shown, f"{bracketed} is missing from `{' '.join(path)} --help`"
    examples = []
    for block in _literal_blocks(text):
        if block[0].startswith(("tokenpath ", "curl ")):
            examples += [line for line in block if line.startswith("tokenpath ")]
        else:
            tomllib.loads("\n".join(block))  # a TOML file's text, every table header kept
    for line in examples:
        _check_example_command(line)
    if re.search(r"^  Examples?:$", text, re.MULTILINE):
        assert examples, f"`{' '.join(path)} --help` has an Examples section without one"
    if _is_group(command):  # each command listed by its summary alone, never a heading after it
        assert "Example" not in text


def test_the_example_spec_and_levers_file_are_read_as_they_are_shown(tmp_path, monkeypatch, capsys):
    from tokenpath.sim.scenario import read_scenario_table
    from tokenpath.sweep.spec import load_spec
    from tokenpath.whatif.levers import read_levers_file
    from tokenpath.whatif.run import Base

    [spec] = [block for block in _literal_blocks(_help(("sweep",), monkeypatch, capsys))
              if not block[0].startswith("tokenpath ")]
    (tmp_path / "sweep.toml").write_text("\n".join(spec), encoding="utf-8")
    assert load_spec(tmp_path / "sweep.toml").axes == ["deployment.tp", "workload.arrival.rate"]
    [levers] = [block for block in _literal_blocks(_help(("levers",), monkeypatch, capsys))
                if not block[0].startswith("tokenpath ")]
    (tmp_path / "levers.toml").write_text("\n".join(levers), encoding="utf-8")
    [lever] = read_levers_file(str(tmp_path / "levers.toml"), Base(*read_scenario_table(None)))
    assert lever.overrides == {"deployment.tp": 4, "delivery.detokenize": "detokenizer"}


def _scenario_flag_help(flag: str) -> str:
    [param] = [param for param in _resolve(["simulate"]).params if param.name == flag]
    return param.help


@pytest.mark.parametrize("flag", sorted(DEFAULT_KEYS))
def test_a_scenario_flag_s_help_ends_with_the_current_default_of_its_key(flag):
    value = functools.reduce(getattr, DEFAULT_KEYS[flag].split("."), Scenario())
    if isinstance(value, bool):
        shown = "on" if value else "off"
    elif value is None:
        shown = "none"
    elif flag == "network_rtt":
        shown = format_duration(value)
    elif isinstance(value, (int, float)):
        shown = f"{value:g}"
    else:
        shown = value
    if flag in PROFILE_DEFAULTS:
        shown = f"the scheduler profile's; {shown} under {Scenario().engine.scheduler}"
    text = _scenario_flag_help(flag)
    assert text.endswith(f"scenario default: {shown})"), text
    assert text.count("default") == 1, f"--help of {flag} states a default of its own: {text}"


def test_defaults_the_scheduler_profile_sets_are_said_to_be_its():
    assert _scenario_flag_help("max_num_seqs").endswith("(scenario default: the scheduler profile's; 1024 under "
                                                        "vllm-v1)")
    assert _scenario_flag_help("network_rtt").endswith("(a bare number is seconds; scenario default: 20 ms)")
