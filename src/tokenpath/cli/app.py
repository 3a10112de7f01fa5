"""The typer application, its command groups and consoles, and what every command shares: writing a
JSON document and failing with one line."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import Progress, ProgressColumn
from rich.table import Table
from rich.text import Text

from tokenpath.config import files
from tokenpath.config.errors import UserError

# Help is plain text (click's formatting): rich markup would take the square brackets of TOML tables
# ([axes], [[levers]]) and extras (tokenpath[ray]) for style tags and drop them.
app = typer.Typer(
    help="Where the time goes between an LLM request and readable text on the user's screen.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
scenario_app = typer.Typer(help="Inspect scenarios.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(scenario_app, name="scenario")
calibrate_app = typer.Typer(help="Measure this machine and write calibration files.", no_args_is_help=True,
                            rich_markup_mode=None)
app.add_typer(calibrate_app, name="calibrate")
application_app = typer.Typer(help="The stages around the model call (docs/application.md).", no_args_is_help=True,
                              rich_markup_mode=None)
app.add_typer(application_app, name="application")

UNBOUNDED_WIDTH = 10_000  # columns a table is measured in, to learn how wide its values make it
PIPE_MAX_WIDTH = 160  # the widest a table is printed into a pipe or a file (a wide terminal's width)


class _Stdout(Console):
    """Standard output. A table never cuts a value short (rich ends a cell too wide for its column with an
    ellipsis): into a file or a pipe, which have no width of their own (rich assumes 80 columns), a table
    that would break a word or number at that width is printed as wide as its values, up to PIPE_MAX_WIDTH
    columns; in a terminal too narrow for it, or past that width, a cell folds onto the next line.
    A reader that stops reading (`tokenpath simulate --json r.json | head`) ends what is printed, not the
    command: the rest goes nowhere and the command still writes its files (rich's own Console exits at
    once, with status 1)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        tables = [table for table in objects if isinstance(table, Table)]
        for table in tables:
            for column in table.columns:
                if column.overflow == "ellipsis":
                    column.overflow, column.no_wrap = "fold", False
        width = self.width
        if tables and not self.is_terminal:  # (rich caps a print's own width at the console's)
            unbounded = self.options.update_width(UNBOUNDED_WIDTH)
            breaking = [Measurement.get(self, unbounded, t).maximum for t in tables if _breaks_a_word(t, width)]
            if breaking:
                self.width = max(width, min(max(breaking), PIPE_MAX_WIDTH))
        try:
            super().print(*objects, **kwargs)
        finally:
            self.width = width

    def on_broken_pipe(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        self.quiet = True


def _breaks_a_word(table: Table, width: int) -> bool:
    """Whether `table` printed `width` columns wide splits a word or number of a cell across lines. Rendered
    to learn it: rich, narrowing a table, shares the width out in proportion to the columns' widths, so
    it can split a word that the narrowest columns' widths would have held."""
    probe = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    probe.print(table)
    printed = probe.file.getvalue()
    cells = [cell for column in table.columns for cell in (column.header, *column.cells)]
    texts = [Text.from_markup(cell) if isinstance(cell, str) else cell for cell in cells]
    return any(word not in printed for text in texts if isinstance(text, Text) for word in text.plain.split())


console = _Stdout()
err_console = Console(stderr=True)


def progress_bar(*columns: str | ProgressColumn, quiet: bool = False) -> Progress:
    """A progress bar on stderr that leaves nothing behind. Shown on an interactive terminal only: elsewhere
    rich's Progress draws nothing but a blank line as it stops, which would stand before an error line."""
    return Progress(*columns, console=err_console, transient=True, disable=quiet or not err_console.is_interactive)


def help_as_written(text: str) -> str:
    """A command's help laid out for click, which lists a command by its first paragraph and rewraps every
    paragraph to the terminal's width: the first line (the summary) becomes a paragraph of its own, and
    each run of indented lines (example commands, TOML tables) is marked (\\b) to keep its lines as written."""
    summary, _, rest = text.partition("\n")
    lines: list[str] = [summary, ""]
    for line in rest.strip("\n").splitlines():
        if line.startswith("  ") and (not lines[-1] or not lines[-1].startswith("  ")):
            if lines[-1]:
                lines.append("")
            lines.append("\b")
        lines.append(line)
    return "\n".join(lines).rstrip("\n")


def write_json(document: dict[str, Any], target: str) -> None:
    text = json.dumps(document, indent=2) + "\n"
    if target == "-":
        sys.stdout.write(text)
        return
    try:
        Path(target).write_text(text, encoding="utf-8")
    except OSError as error:  # checked before the run (files.check_writable), so a change since
        raise UserError(f"--json {files.shown(target)}: cannot write it ({error.strerror}); the result was not "
                        "saved: choose another path") from None


def fail(message: str) -> None:
    """Print `message` as one `error:` line (control characters escaped, no markup) and exit 2."""
    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)
    err_console.print(f"[red]error:[/red] {escape(line)}", highlight=False, soft_wrap=True)
    sys.exit(2)
