"""`tokenpath application import`: a trace file's spans as an `[application]` table."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from tokenpath.cli.app import application_app, console
from tokenpath.config.errors import UserError

IMPORT_EXAMPLE = """
Examples:

  tokenpath application import trace.jsonl --out app.toml      # OTLP JSON (the collector's file exporter)

  tokenpath application import runs.json --format langsmith    # a LangSmith export, the table on stdout

  tokenpath simulate app.toml --num-requests 200                # the deployment behind the imported stages
"""


@application_app.command("import", help="Write the [application] table of a request's trace: OTLP JSON spans "
                                        "(GenAI semantic conventions) or LangSmith runs. Each stage's latency is "
                                        "its measured time (a lognormal over several traces of one shape); the "
                                        "gaps on the critical path become cpu stages; several model calls, an "
                                        "agent loop." + IMPORT_EXAMPLE)
def import_trace(
    trace: str = typer.Argument(..., help="the trace file: OTLP JSON or JSON lines, or a LangSmith export"),
    trace_format: str = typer.Option("auto", "--format", help="otlp, langsmith or auto (from the file's keys)"),
    out: str | None = typer.Option(None, "--out", help="write the TOML here (a scenario with the default "
                                                       "deployment; append a scenario's tables to change it); "
                                                       "default: stdout"),
    trace_id: str | None = typer.Option(None, "--trace", help="import this trace id (a LangSmith root run's id) "
                                                               "alone"),
) -> None:
    from tokenpath.application.traces import import_file, to_toml
    from tokenpath.config import files

    if out is not None:
        files.check_writable(out, "--out")
    imported, read_as = import_file(trace, trace_format, trace_id)
    text = to_toml(imported, f"{Path(trace).name} ({read_as})")
    if out is None:
        sys.stdout.write(text)
        return
    try:
        Path(out).write_text(text, encoding="utf-8")
    except OSError as error:
        raise UserError(f"--out {files.shown(out)}: cannot write it ({error.strerror}); choose another path") from None
    requests = imported.requests
    console.print(f"{out}: {len(imported.stages)} stages ({imported.gaps} of them gaps) from {len(requests)} "
                  f"trace{'s' if len(requests) > 1 else ''}", highlight=False, soft_wrap=True)
