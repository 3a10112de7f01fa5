"""A command line as the emitters build it: each flag with the scenario setting it carries, and each
setting no flag carries with the reason, so none is dropped silently."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Note:
    """A scenario setting the launch does not carry as the scenario has it, and why."""

    setting: str  # its dotted scenario key
    text: str


@dataclass
class Settings:
    """What an emitter did with each scenario setting: the flags that carry it, or a note."""

    mapped: dict[str, list[str]] = field(default_factory=dict)
    notes: list[Note] = field(default_factory=list)

    def map(self, setting: str, flag: str) -> None:
        flags = self.mapped.setdefault(setting, [])
        if flag not in flags:
            flags.append(flag)

    def note(self, setting: str, text: str) -> None:
        if Note(setting, text) not in self.notes:
            self.notes.append(Note(setting, text))


class ShellVariable(str):
    """A value the shell fills in when the script runs, from the environment: "$NAME", or "${NAME}suffix"."""

    def __new__(cls, name: str, suffix: str = "") -> ShellVariable:
        return super().__new__(cls, f"${{{name}}}{suffix}" if suffix else f"${name}")


@dataclass
class Command:
    """One program's command line: environment, program and positionals, then options in order."""

    program: list[str]
    positionals: list[str] = field(default_factory=list)
    options: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def add(self, settings: Settings | None, setting: str | None, flag: str, *values: object) -> None:
        """Append `flag` with its `values` (none for a switch), recording it as carrying `setting`."""
        self.options.append((flag, tuple(_number(v) if isinstance(v, (int, float)) else v if isinstance(v, str)
                                         else str(v) for v in values)))
        if settings is not None and setting is not None:
            settings.map(setting, flag)

    @property
    def argv(self) -> list[str]:
        """The arguments, as a container's `command` takes them."""
        out = [*self.program, *self.positionals]
        for flag, values in self.options:
            out += [flag, *values]
        return out

    def shell(self) -> str:
        """The command for a POSIX shell, one option per line."""
        head = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env.items()),
                         *map(shlex.quote, [*self.program, *self.positionals])])
        lines = [head] + ["  " + " ".join([flag, *map(_quote, values)]) for flag, values in self.options]
        return " \\\n".join(lines)


def _quote(value: str) -> str:
    """A value for a POSIX shell: as it is, or a variable expanded there."""
    return f'"{value}"' if isinstance(value, ShellVariable) else shlex.quote(value)


def _number(value: int | float) -> str:
    """A number as a command line writes it: 0.9, not 0.90000001; 8192, not 8192.0."""
    if isinstance(value, bool):
        raise TypeError("a flag's value is never a bool: use the flag's on and off forms")
    return str(value) if isinstance(value, int) else f"{value:g}"


# The lines of a script that are the shell's, not a program's.
_SHELL_OWN = (":", "if", "else", "fi", "wait")


def shell_words(script: str) -> list[list[str]]:
    """Each command of a shell script the emitters wrote, split into words, without its leading
    VAR=value assignments and trailing `&`; comment lines and the shell's own (`:`, `if`, `else`, `fi`,
    `wait`) skipped."""
    commands = []
    for chunk in script.replace("\\\n", " ").splitlines():
        line = chunk.strip()
        if not line or line.startswith("#") or line.split()[0] in _SHELL_OWN:
            continue
        words = shlex.split(line.removesuffix(" &"))  # run in the background: not an argument
        while words and "=" in words[0]:
            words.pop(0)
        commands.append(words)
    return commands
