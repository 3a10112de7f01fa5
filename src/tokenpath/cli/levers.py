"""`tokenpath levers`: which change moves it most, the catalog of what-ifs ranked."""

from __future__ import annotations

from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from tokenpath.cli.app import app, console, progress_bar, write_json
from tokenpath.cli.options import JsonOut, scenario_flags, scenario_table
from tokenpath.config import files
from tokenpath.config.errors import UserError
from tokenpath.diagnose.overload import load_marks, load_notes
from tokenpath.sim.envelope import OUTSIDE_MARK
from tokenpath.sim.summary import metric_value
from tokenpath.whatif.levers import DEFAULT_DRAWS, MAX_DRAWS, NOISE_CONFIDENCE
from tokenpath.whatif.objective import DEFAULT_OBJECTIVE

# A lever whose mean change over the workload's draws another draw could reverse (whatif/levers.py, draw_changes).
NOISE_MARK = "≈"

LEVERS_EXAMPLE = """
Simulates the scenario and every what-if of the catalog in full (wider: links, NVLS, replicas, TP x DP,
scale-out; closer: async detokenization, measured last mile, client RTT, disaggregated prefill, prefix
caching; more continuous: stream interval, token budget, max_num_seqs, scheduler; compute: next chip,
next precision), and ranks them by the change in the objective. Levers that do not apply are listed
with the reason.

Objectives: latency_s.ttfv.p99 (the default; levers whose change rounds to the same 1% of the baseline
are ordered by latency_s.e2e.mean), any summary metric by its dotted path (latency_s.ttft.p99,
throughput.output_tokens_per_s, attribution_s.queue, continuity.qoe.mean, ...; throughput and QoE are
better higher, the rest lower),
goodput (requests/s within the scenario's [slo]) or cost (US dollars per million output tokens, from
the chip price table: catalog/prices.toml, or --prices FILE).

Examples:

  tokenpath levers

  tokenpath levers my.toml --objective latency_s.ttft.p99 --json levers.json

  tokenpath levers --objective cost --set workload.arrival.rate=20

  tokenpath levers --levers my-levers.toml --no-catalog

A levers file holds [[levers]] tables: name, group and overrides, e.g.

  [[levers]]
  name = "TP4 with async detokenization"
  group = "mine"
  overrides = { "deployment.tp" = 4, "delivery.detokenize" = "detokenizer" }
"""


def _signed(value: float, unit: str = "") -> str:
    from tokenpath.config.units import format_duration

    text = format_duration(abs(value)) if unit == "s" else f"{abs(value):.4g}"
    return ("-" if value < 0 else "+") + text


def _value(value: float | None, metric: str) -> str:
    from tokenpath.config.units import format_duration
    from tokenpath.sim.metrics import is_duration

    if value is None:
        return "-"
    if is_duration(metric):
        return format_duration(value)
    return f"{value:,.4g}"


def _outside_mark(summary: dict[str, Any]) -> str:
    envelope = summary.get("envelope")
    return f" {OUTSIDE_MARK}" if envelope and not envelope["validated"] else ""


def _load(summary: dict[str, Any]) -> tuple[bool | None, bool, str | None]:
    load = summary.get("load", {})
    return load.get("settled"), bool(load.get("overloaded")), load.get("confidence")


def _marks(summary: dict[str, Any]) -> str:
    return _outside_mark(summary) + load_marks(*_load(summary))


def _layer(change: dict[str, Any]) -> str:
    parts, layer = change.get("attribution_s"), change.get("layer")
    if not parts or layer is None:
        return "-"
    if abs(parts[layer]) < 1e-6:  # no layer moved by a microsecond
        return "-"
    return f"{layer} {_signed(parts[layer], 's')}"


def _print(document: dict[str, Any], num_requests: int) -> None:
    objective = document["objective"]
    metric = objective["metric"]
    unit_metric = metric if metric != "cost" else ""
    tie = objective["tie_break"]
    title = (f"Levers ranked by {objective['name']} ({objective['better']} is better"
             f"{f'; changes within the same 1% of the baseline ordered by {tie}' if tie else ''}), "
             f"{num_requests:,} requests each")
    table = Table(title=title, title_justify="left")
    for column, justify in (("#", "right"), ("lever", "left"), ("group", "left"), (metric.split(".", 1)[-1], "right"),
                            ("change", "right"), (tie.split(".", 1)[-1] if tie else "", "right"),
                            ("layer moved most (mean)", "left")):
        if column or justify == "left":
            table.add_column(column, justify=justify)
    base = document["baseline"]
    row = ["", f"baseline{_marks(base)}", "", _value(objective["value"], unit_metric), ""]
    if tie:
        row.append(_value(metric_value(base, tie), tie))
    table.add_row(*row, "", style="dim")
    for rank, lever in enumerate(document["levers"], 1):
        change = lever["change"]
        relative = change["relative"]
        noisy = f" {NOISE_MARK}" if change["draws"]["within_noise"] else ""
        row = [str(rank), f"{lever['name']}{_marks(lever['summary'])}{noisy}", lever["group"],
               _value(change["value"], unit_metric),
               f"{relative:+.1%}" if relative is not None else "-"]
        if tie:
            row.append(_value(change["tie_break"]["value"], tie))
        style = "green" if (change["better"] or 0) > 0 else ("red" if (change["better"] or 0) < 0 else None)
        table.add_row(*row, _layer(change), style=style)
    console.print(table)
    seeds = objective["draws"]["seeds"]
    if any(lever["change"]["draws"]["within_noise"] for lever in document["levers"]):
        console.print(f"{NOISE_MARK} within the noise: on the workload drawn with seeds {seeds[0]} to {seeds[-1]} "
                      f"its mean change's {NOISE_CONFIDENCE:.0%} interval (Student's t over the {len(seeds)} draws) "
                      "holds none; another draw could reverse it", highlight=False)
    runs = [("baseline", base), *((lever["name"], lever["summary"]) for lever in document["levers"])]
    outside = [(name, summary["envelope"]["outside"]) for name, summary in runs if _outside_mark(summary)]
    if outside:
        console.print(f"{OUTSIDE_MARK} outside the validated envelope (docs/validation.md): "
                      + "; ".join(f"{name} ({', '.join(what)})" for name, what in outside), highlight=False)
    for note in load_notes([_load(summary) for _, summary in runs]):
        console.print(note, highlight=False)
    if document["skipped"]:
        skipped = Table(title="Not applicable here", title_justify="left")
        skipped.add_column("lever")
        skipped.add_column("group")
        skipped.add_column("why")
        for lever in document["skipped"]:
            skipped.add_row(lever["name"], lever["group"], lever["reason"])
        console.print(skipped)
    if "prices" in objective:
        for chip, price in objective["prices"].items():
            console.print(f"{chip}: ${price['usd_per_hour']:g} per chip-hour ({price['source']})", highlight=False)


@app.command(help="Rank what-ifs of a scenario (wider, closer, more continuous, compute) by the change in an "
                  "objective." + LEVERS_EXAMPLE)
@scenario_flags()
def levers(
    scenario: str | None = typer.Argument(None, help="a scenario file (.toml) or catalog name; default 'typical'"),
    objective: str | None = typer.Option(
        None, "--objective", help=f"{DEFAULT_OBJECTIVE} (default), any summary metric's dotted path, goodput or cost"),
    levers_file: str | None = typer.Option(None, "--levers", help="a TOML file of your own [[levers]]"),
    use_catalog: bool = typer.Option(True, "--catalog/--no-catalog", help="run the built-in catalog of levers"),
    prices: str | None = typer.Option(None, "--prices", help="chip prices for --objective cost (default: "
                                                                  "the catalog's, with their sources)"),
    workers: int | None = typer.Option(None, "--workers", help="processes simulating levers side by side "
                                                                  "(default: one per CPU)"),
    draws: int = typer.Option(DEFAULT_DRAWS, "--draws", help="draws of the workload (its seed and the next) each "
                              "lever runs on, to tell its change from noise (1: the scenario's own alone)"),
    json_out: JsonOut = None,
    *, flags: dict[str, Any],
) -> None:
    from tokenpath.whatif.levers import read_levers_file, run_levers
    from tokenpath.whatif.objective import COST, Objective, Prices
    from tokenpath.whatif.run import Base

    if workers is not None and workers < 1:
        raise UserError(f"--workers: {workers} must be at least 1")
    if not 1 <= draws <= MAX_DRAWS:
        raise UserError(f"--draws: {draws} must be from 1 to {MAX_DRAWS}")
    if json_out is not None:
        files.check_writable(json_out, "--json")
    base = Base(*scenario_table(scenario, flags))
    built = base.scenario()  # every mistake in the scenario or the flags shows before anything runs
    chosen = Objective.parse(objective, Prices.load(prices) if prices or objective == COST else None)
    if chosen.metric == "throughput.goodput_requests_per_s" and all(
            getattr(built.slo, key) is None for key in ("ttft", "ttfv", "tpot", "e2e")):
        raise UserError("--objective goodput: the scenario sets no [slo] target; set one, e.g. --set slo.ttft=2s")
    extra = read_levers_file(levers_file, base) if levers_file else []
    if not use_catalog and not extra:
        raise UserError("--no-catalog: then give your own levers with --levers FILE")

    quiet = json_out == "-"
    progress = progress_bar(TextColumn("simulating levers"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            quiet=quiet)
    with progress:
        task = progress.add_task("levers", total=None)
        document = run_levers(base, chosen, extra, use_catalog, workers, lambda k: progress.advance(task, k),
                              draws=draws)
    if not quiet:
        _print(document, built.workload.num_requests)
    if json_out is not None:
        write_json(document, json_out)
