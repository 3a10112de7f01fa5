"""`tokenpath capacity`: the highest request rate that meets an SLO."""

from __future__ import annotations

from typing import Any

import typer
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

from tokenpath.cli.app import app, console, progress_bar, write_json
from tokenpath.cli.options import JsonOut, scenario_flags, scenario_table
from tokenpath.config import files
from tokenpath.config.errors import UserError
from tokenpath.whatif.capacity import DEFAULT_STABILITY, DEFAULT_TOLERANCE

CAPACITY_EXAMPLE = """
Bisects the request rate over full simulations: each point simulates the whole workload at that rate
(same seed, so the same arrival gaps scaled), and is accepted only when it meets the SLO and is not
overloaded. The search is repeated with twice the requests until the answer moves by at most
--stability (at most 16x the scenario's requests): a capacity is a steady-state answer. Targets are
METRIC_STAT=DURATION (at most) with METRIC one of ttft, ttfv, tpot, itl, e2e and STAT one of mean,
p50, p90, p99, p999; continuity targets are qoe_mean, qoe_p1, qoe_p10, qoe_p50 = a number from 0 to 1
(at least) and stalls_per_request, requests_with_stalls = a number (at most); without --slo, the
scenario's [slo] taken as p99 targets. A run with a failed request misses every target. It searches the
rate and the run's length only; a scenario's max_concurrency, if any, stays as it is (where it holds
the load at every rate, the search says so).

Examples:

  tokenpath capacity --slo ttft_p99=2s,tpot_p99=100ms

  tokenpath capacity my.toml --slo ttfv_p90=500ms,e2e_p99=20s --json capacity.json

  tokenpath capacity --slo ttft_p99=2s,qoe_p10=0.9

  tokenpath capacity --set delivery.detokenize=detokenizer --num-requests 4000
"""


def _shown(value: float | None, unit: str | None) -> str:
    from tokenpath.config.units import format_duration

    if unit == "s":
        return format_duration(value)
    return "-" if value is None else f"{value:.3g}"


def _print(document: dict[str, Any]) -> None:
    from tokenpath.config.units import format_duration

    binding = document["binding"]
    above = document["above"]
    targets = ", ".join(f"{name} {'>=' if row['bound'] == 'min' else '<='} {_shown(row['target'], row['unit'])} "
                        f"({_shown(row['observed'], row['unit'])})" for name, row in document["slo"].items())
    console.print(f"[bold]Capacity: {document['request_rate']:.4g} req/s[/bold] meets {targets}", highlight=False)
    if binding["metric"] == "overload":
        console.print(f"At {above['request_rate']:.4g} req/s the run meets the SLO but is overloaded "
                      f"({'; '.join(binding['signs'])}): overload binds", highlight=False)
    else:
        side = "under" if binding["bound"] == "min" else "over"
        console.print(f"At {above['request_rate']:.4g} req/s {binding['metric']} is "
                      f"{_shown(binding['observed_above'], binding['unit'])}, {side} its "
                      f"{_shown(binding['target'], binding['unit'])}: {binding['metric']} binds", highlight=False)
    if document["layer"]:
        grew = document["attribution_growth_s"][document["layer"]]
        layer = "queue (distribution)" if document["layer"] == "queue" else document["layer"]
        console.print(f"Between the two, {layer} grew most: {format_duration(abs(grew))} per request on average "
                      f"({'more' if grew >= 0 else 'less'})", highlight=False)
    summary = document["summary"]
    console.print(f"At capacity: {summary['throughput']['output_tokens_per_s']:,.0f} output tokens/s, "
                  f"{summary['throughput']['goodput_requests_per_s']:.3g} req/s goodput; bottleneck "
                  f"{summary['bottleneck']} - {summary.get('bottleneck_reason', '')}", highlight=False)
    answers = ", ".join(f"{step['request_rate']:.4g} at {step['num_requests']:,}{_load_words(step['settled'])}"
                        for step in document["convergence"])
    settled = document["convergence"][-1]["settled"]
    if document["converged"]:
        stable = f"stable within {document['stability']:.0%}"
    elif settled is None:
        stable = "its run too short to watch it settle: an upper bound"
    elif not settled and document["binding"]["metric"] != "overload":
        stable = "its run still filling: an upper bound"
    else:
        stable = f"still moving by more than {document['stability']:.0%}: an upper bound"
    console.print(f"({document['simulations']} simulations, bracket within {document['tolerance']:.0%}; "
                  f"req/s at requests run: {answers}; {stable})", style="dim")


def _load_words(settled: bool | None) -> str:
    """How a convergence step's answer run ended, in the answers' line."""
    return {True: "", False: " (still filling)", None: " (too short to watch)"}[settled]


def check_precision(tolerance: float, stability: float) -> None:
    """--tolerance and --stability, as capacity and search take them."""
    if not 0.0001 <= tolerance <= 0.5:
        raise UserError(f"--tolerance: {tolerance:g} must be from 0.0001 to 0.5 (a share of the rate)")
    if not tolerance <= stability <= 1.0:
        raise UserError(f"--stability: {stability:g} must be from the tolerance ({tolerance:g}) to 1 "
                        "(a share of the rate)")


TOLERANCE_HELP = "stop when the bracket is this share of the rate"
STABILITY_HELP = "search again with twice the requests until the answer moves by at most this share of the rate"


@app.command(help="The highest request rate that meets an SLO, by bisection over full simulations." + CAPACITY_EXAMPLE)
@scenario_flags()
def capacity(
    scenario: str | None = typer.Argument(None, help="a scenario file (.toml) or catalog name; default 'typical'"),
    slo_given: list[str] | None = typer.Option(None, "--slo", help="targets, e.g. ttft_p99=2s,tpot_p99=100ms,"
                                                                     "qoe_p10=0.9, repeatable (default: the "
                                                                     "scenario's [slo] as p99 targets)"),
    tolerance: float = typer.Option(DEFAULT_TOLERANCE, "--tolerance", help=TOLERANCE_HELP),
    stability: float = typer.Option(DEFAULT_STABILITY, "--stability", help=STABILITY_HELP),
    workers: int | None = typer.Option(None, "--workers", help="simulations side by side (default: one per CPU)"),
    json_out: JsonOut = None,
    *, flags: dict[str, Any],
) -> None:
    from tokenpath.sim.forked import available_cpus
    from tokenpath.whatif.capacity import parse_slo, resolve_targets, search
    from tokenpath.whatif.run import Base

    if workers is not None and workers < 1:
        raise UserError(f"--workers: {workers} must be at least 1")
    check_precision(tolerance, stability)
    slo = ",".join(slo_given) if slo_given else None
    if slo is not None:
        parse_slo(slo)  # a bad --slo is refused before anything is built
    if json_out is not None:
        files.check_writable(json_out, "--json")
    base = Base(*scenario_table(scenario, flags))
    targets = resolve_targets(slo, base.scenario().slo, "ttft_p99=2s")
    quiet = json_out == "-"
    progress = progress_bar(TextColumn("searching the rate"), BarColumn(), TextColumn("{task.completed} simulations"),
                            TimeElapsedColumn(), quiet=quiet)
    with progress:
        task = progress.add_task("capacity", total=None)
        document = search(base, targets, tolerance, workers or available_cpus(), lambda k: progress.advance(task, k),
                          stability)
    if not quiet:
        _print(document)
    if json_out is not None:
        write_json(document, json_out)
