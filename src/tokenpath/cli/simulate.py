"""`tokenpath simulate` and `tokenpath run`."""

from __future__ import annotations

from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from tokenpath.cli.app import app, console, progress_bar, write_json
from tokenpath.cli.options import JsonOut, load_with_flags, scenario_flags
from tokenpath.cli.report import HtmlOut, PngOut, check_report_outputs, write_report
from tokenpath.config import files
from tokenpath.config.errors import UserError


def _simulate_and_report(scenario_ref: str | None, json_out: str | None, flags: dict[str, Any],
                         show_explain: bool = False, workers: int | None = None, results: str | None = None,
                         html_out: str | None = None, png_dir: str | None = None) -> None:
    from tokenpath.report.simulation import describe
    from tokenpath.sim.document import result_document
    from tokenpath.sim.simulate import prepare, simulate

    if workers is not None and workers < 1:
        raise UserError(f"--workers: {workers} must be at least 1 (1 simulates every replica in this process)")
    if json_out is not None:
        files.check_writable(json_out, "--json")
    if results is not None:
        from tokenpath.report.requests import check_results_path

        check_results_path(results)
        files.check_apart(results, "--results", json_out, "--json")
    check_report_outputs(html_out, png_dir)
    prepared = prepare(load_with_flags(scenario_ref, flags))

    quiet = json_out == "-"
    progress = progress_bar(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            quiet=quiet)
    with progress:
        task = progress.add_task("simulate", total=len(prepared.requests))
        try:
            simulation = simulate(prepared, progress=lambda k: progress.advance(task, k), workers=workers)
        except OverflowError:  # a time past int64 nanoseconds, which every simulated time is held in
            simulation = None
    run = simulation.run if simulation is not None else None
    if run is None or min(int(times.min()) for times in (run.ttft_ns, run.ttfv_ns, run.e2e_ns)) < 0:
        raise UserError("the simulated run lasts more than 292 years (the range of int64 nanoseconds); lower the "
                        "delivery costs, raise the fabric's bandwidth, or lower the output lengths or "
                        "workload.num_requests")
    document, reason = result_document(simulation)
    if show_explain:
        from tokenpath.report.explain import explain, explain_table

        document["explain"] = explain(simulation)
    if not quiet:
        from tokenpath.report.table import print_summary

        print_summary(console, document, describe(simulation), reason)
        if show_explain:
            console.print(explain_table(document["explain"], simulation.deployment.chip.name))
    if json_out is not None:  # after the summary: a file that cannot be written loses nothing shown
        write_json(document, json_out)
    _write_outputs(simulation, document, results, html_out, png_dir)


def _write_outputs(simulation: Any, document: dict[str, Any], results: str | None, html_out: str | None,
                   png_dir: str | None) -> None:
    """The per-request results file and the HTML report (and PNG figures) of a simulation."""
    from tokenpath.report.simulation import describe

    lines = describe(simulation) if results is not None or html_out is not None or png_dir is not None else []
    if results is not None:
        from tokenpath.report.requests import request_columns, to_arrow, write_results

        columns = request_columns(simulation.run, simulation.scenario.workload.warmup_requests)
        write_results(to_arrow(columns, document, lines), results)
    if html_out is not None or png_dir is not None:
        from tokenpath.report.views import Inputs, from_simulation

        view = from_simulation(simulation, document, lines, simulation.scenario.name)
        write_report(Inputs([view]), html_out, png_dir, f"tokenpath simulate: {simulation.scenario.name}")


SIMULATE_EXAMPLE = """
Examples:

  tokenpath simulate                                   # the embedded default scenario

  tokenpath simulate --model llama-3.1-8b --chip h100 --chips 1 --tp 1 --request-rate 8

  tokenpath simulate my.toml --request-rate inf --input-len 128 --input-sd 0 --json result.json

  tokenpath simulate --chips 32 --fabric h100-4x8-rail --placement spread

  tokenpath simulate --set deployment.tp=4 --set delivery.detokenize=detokenizer
"""


@app.command(help="Simulate a scenario (default: the embedded 'typical') and print where the time goes."
                  + SIMULATE_EXAMPLE)
@scenario_flags()
def simulate(
    scenario: str | None = typer.Argument(None, help="a scenario file (.toml) or catalog name; default 'typical'"),
    json_out: JsonOut = None,
    show_explain: bool = typer.Option(False, "--explain",
                                      help="also show the per-op roofline of one steady-state step"),
    results: str | None = typer.Option(
        None, "--results", help="write one row per request: .parquet (default), .csv or .jsonl"),
    html_out: str | None = HtmlOut,
    png_dir: str | None = PngOut,
    workers: int | None = typer.Option(
        None, help="processes simulating data-parallel replicas side by side (default: one per CPU for "
                   "runs of 20,000 requests or more; load- and cache-aware routing simulates every replica "
                   "in one); the result does not depend on it"),
    *, flags: dict[str, Any],
) -> None:
    _simulate_and_report(scenario, json_out, flags, show_explain, workers, results, html_out, png_dir)


@app.command(help="Simulate the embedded default scenario ('typical')."
                  "\n\nExample:\n\n  tokenpath run --json result.json")
def run(json_out: JsonOut = None) -> None:
    _simulate_and_report(None, json_out, {})
