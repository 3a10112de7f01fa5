"""`tokenpath report`: a bench results file's summary, per-request results in one table format, and
the HTML report (with its figures as PNG) of one run or two side by side, with levers and sweeps."""

from __future__ import annotations

from pathlib import Path

import typer

from tokenpath.cli.app import app, console
from tokenpath.cli.options import JsonOut
from tokenpath.config.errors import UserError

REPORT_EXAMPLE = """
Examples:

  tokenpath report bench-results.jsonl --json bench.json     # rebuild a bench run's summary

  tokenpath report bench-results.jsonl --results bench.parquet

  tokenpath report result.json --html report.html --png figures/

  tokenpath report sim.json bench.json --html side-by-side.html

  tokenpath report result.json levers.json sweep.parquet --html report.html

  tokenpath report search.json --html search.html
"""

HtmlOut = typer.Option(None, "--html", help="write one self-contained HTML report (opens offline)")
PngOut = typer.Option(None, "--png", help="write each figure of the report as PNG into this folder")


def check_report_outputs(html_out: str | None, png_dir: str | None) -> None:
    """Refuse unwritable outputs before any work."""
    from tokenpath.config import files

    if html_out is not None:
        if Path(html_out).suffix.lower() not in (".html", ".htm"):
            raise UserError(f"--html {files.shown(html_out)}: give a file name ending in .html")
        files.check_writable(html_out, "--html")
    if png_dir is not None and Path(png_dir).exists() and not Path(png_dir).is_dir():
        raise UserError(f"--png {files.shown(png_dir)}: is a file; give a folder for the figures")
    if html_out is not None and png_dir is not None and Path(html_out).resolve() == Path(png_dir).resolve():
        raise UserError(f"--png {files.shown(png_dir)}: the same path as --html; give a folder of its own for the "
                        "figures")


def write_report(inputs: object, html_out: str | None, png_dir: str | None, title: str) -> None:
    from tokenpath.report.html import write_html, write_pngs

    if html_out is not None:
        write_html(inputs, html_out, title)  # type: ignore[arg-type]
        console.print(f"report: {html_out}", highlight=False)
    if png_dir is not None:
        written = write_pngs(inputs, png_dir)  # type: ignore[arg-type]
        console.print(f"figures: {len(written)} PNG files in {png_dir}", highlight=False)


@app.command(help="Summaries, per-request results and the HTML report of simulate and bench runs." + REPORT_EXAMPLE)
def report(
    inputs: list[str] = typer.Argument(..., help="a bench results .jsonl, a summary .json (simulate/bench --json), a "
                                                 "results .parquet/.csv/.jsonl, a levers .json, a sweep .parquet or "
                                                 "a search .json; "
                                                 "two runs are shown side by side"),
    json_out: JsonOut = None,
    results: str | None = typer.Option(None, "--results", help="a bench results file's requests as one row each: "
                                                                  ".parquet (default), .csv or .jsonl"),
    html_out: str | None = HtmlOut,
    png_dir: str | None = PngOut,
) -> None:
    from tokenpath.report.views import _is_bench_file, load_inputs

    check_report_outputs(html_out, png_dir)
    single_bench = len(inputs) == 1 and inputs[0].lower().endswith(".jsonl") and Path(inputs[0]).is_file() \
        and _is_bench_file(inputs[0])
    if results is not None or json_out is not None:
        if not single_bench:
            raise UserError("--results and --json take one bench results .jsonl (written by `tokenpath bench`)")
    if single_bench:
        _bench_file(inputs[0], json_out, results, quiet=html_out is not None or png_dir is not None)
        if html_out is None and png_dir is None:
            return
    loaded = load_inputs(inputs)
    if html_out is None and png_dir is None:
        from tokenpath.report.table import print_summary

        for run in loaded.runs:
            print_summary(console, run.summary, run.scenario_lines, run.summary.get("bottleneck_reason"))
        return
    title = " vs ".join(run.label for run in loaded.runs) or "tokenpath report"
    write_report(loaded, html_out, png_dir, f"tokenpath report: {title}")


def _bench_file(path: str, json_out: str | None, results: str | None, quiet: bool) -> None:
    from tokenpath.bench import read_results
    from tokenpath.bench.results import bench_summary, build_run, warmup_rows
    from tokenpath.cli.bench import _emit, _warn
    from tokenpath.report.bench import describe_bench
    from tokenpath.report.requests import check_results_path, request_columns, to_arrow, write_results

    if results is not None:
        check_results_path(results)
    header, rows = read_results(path, _warn)
    run = build_run(rows, header)
    summary = bench_summary(header, rows, run)
    if results is not None:
        import numpy as np

        ids = np.array([row["i"] for row in rows], dtype=np.int64)
        columns = request_columns(run, warmup_rows(header, rows), ids)
        write_results(to_arrow(columns, summary, describe_bench(header, rows, path)), results)
    if not quiet or json_out is not None:
        _emit(summary, header, rows, path, json_out)
