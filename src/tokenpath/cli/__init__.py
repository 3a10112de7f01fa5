"""The `tokenpath` command line: one module per command, registered on the typer app in `app.py`."""

from __future__ import annotations

import sys

import typer

from tokenpath.cli.app import app, application_app, calibrate_app, fail, help_as_written, scenario_app
from tokenpath.config.errors import UserError

# Importing a command's module registers it; the order here is the order `--help` lists them.
from tokenpath.cli import (  # noqa: F401  isort: skip
    simulate, levers, capacity, search, launch, sweep, catalog, assumptions, validate, serve, calibrate, bench, report,
    fabric, application,
)

for _typer in (app, scenario_app, calibrate_app, application_app):
    for _command in _typer.registered_commands:
        _command.help = help_as_written(_command.help or "")
        _command.short_help = _command.short_help or _command.help.partition("\n")[0]  # listed whole, not cut

_USAGE_ERROR_CHARS = 300  # a command-line usage error quotes the user's words; this much of it is shown


def main() -> None:
    """Entry point: a user's mistake is one line on stderr and exit status 2, never a traceback.

    Usage errors (an unknown flag, a value of the wrong type) are that one line too, instead of
    typer's boxed usage text.
    """
    try:
        status = app(prog_name="tokenpath", standalone_mode=False)
    except UserError as error:
        fail(str(error))
    except typer.TyperException as error:  # click's usage errors
        if type(error).__name__ == "NoArgsIsHelpError":  # the help is already printed
            sys.exit(2)
        message = error.format_message()
        if len(message) > _USAGE_ERROR_CHARS:
            message = message[:_USAGE_ERROR_CHARS] + "..."
        context = getattr(error, "ctx", None)
        hint = f"; see `{context.command_path} --help`" if context is not None else ""
        fail((message.rstrip(".") if hint else message) + hint)  # (click ends some with a full stop)
    except typer.Abort:  # end of input at a prompt
        sys.exit(1)
    except MemoryError:
        fail("out of memory: the run is too large for this machine; lower workload.num_requests or the "
              "deployment's size")
    sys.exit(status if isinstance(status, int) else 0)
