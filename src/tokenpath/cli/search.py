"""`tokenpath search`: which deployment of the scenario's model on N chips serves the most at an SLO."""

from __future__ import annotations

import time
from typing import Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from tokenpath.cli.app import app, console, progress_bar, write_json
from tokenpath.cli.capacity import STABILITY_HELP, TOLERANCE_HELP, check_precision
from tokenpath.cli.options import JsonOut, scenario_flags, scenario_table
from tokenpath.config import files
from tokenpath.config.errors import UserError
from tokenpath.whatif.capacity import DEFAULT_STABILITY, DEFAULT_TOLERANCE

SEARCH_EXAMPLE = """
Enumerates every split of the chips (TP x PP x DP, each group inside one scale-up domain; with
--disagg, prefill:decode splits of the replicas; experts over every chip for MoE models), for each
engine of --engines, at the scenario's engine limits; then max_num_seqs and max_num_batched_tokens
halved and doubled around the two best. A candidate the project cannot build (heads, layers) is
invalid; one whose chips cannot hold the weights and the KV cache of the longest request is pruned
by memory; the rest are bounded from the step-cost model and judged highest bound first: skipped
when the bound is below the best capacity found, screened against the best at its bracket, and
otherwise given the full capacity search of `tokenpath capacity`. Without --slo, the scenario's
[slo] taken as p99 targets.

Objectives: rate-per-chip (requests/s per chip at capacity, the default), cost (US dollars per
million output tokens at capacity, from catalog/prices.toml or --prices), goodput (requests/s within
the scenario's [slo] at capacity).

Examples:

  tokenpath search --chips 8 --slo ttft_p99=1s,tpot_p99=50ms

  tokenpath search --chips 8 --slo ttft_p99=1s,tpot_p99=50ms --engines vllm-v1,sglang --disagg --json search.json

  tokenpath search my.toml --chips 16 --objective cost --top 5

  tokenpath report search.json --html search.html
"""


def _duration(value: float | None) -> str:
    from tokenpath.config.units import format_duration

    return "-" if value is None else format_duration(value)


def _print(document: dict[str, Any], top: int, wall_s: float, scenario_ref: str | None, flags_note: str) -> None:
    counts, question = document["counts"], document["question"]
    objective = question["objective"]["name"]
    console.print(f"{counts['enumerated']} candidates: {counts['invalid']} invalid, {counts['memory']} short of "
                  f"memory, {counts['bound']} skipped by their bound; screened against the best: "
                  f"{counts['screen']} refused, {counts['tie']} tied, {counts['close']} close; "
                  f"{counts['failed']} meeting the SLO at no rate, {counts['searched']} searched in full; "
                  f"{counts['simulations']} simulations in {wall_s:.1f} s", highlight=False)
    slo = ", ".join(f"{name} {'>=' if row['bound'] == 'min' else '<='} "
                    f"{_duration(row['target']) if row['unit'] == 's' else format(row['target'], 'g')}"
                    for name, row in question["slo"].items())
    table = Table(title=f"{question['model']} {question['precision']} on {question['chips']}x {question['chip']} at "
                        f"{slo}, ranked by {question['objective']['what']}", title_justify="left")
    columns = ["#", "layout", "engine", "seqs/tokens", "req/s", "per chip"]
    if objective != "rate-per-chip":
        columns.append(objective)
    columns += ["TTFT p99", "TPOT p99", "binds", "stable"]
    best = document["best"]
    if best is None:
        console.print(f"No deployment of {question['chips']} {question['chip']} was searched in full: none fits, "
                      "can be built, or meets the SLO at any rate (the JSON gives each candidate's reason)",
                      highlight=False)
        return
    for column in columns:
        table.add_column(column, justify="left" if column in ("layout", "engine", "binds") else "right")
    for row in document["candidates"][:top]:
        cells = [str(row["rank"]), row["layout"], row["engine"],
                 f"{row['max_num_seqs'] or 'own'}/{row['max_num_batched_tokens']}", f"{row['request_rate']:.4g}",
                 f"{row['request_rate_per_chip']:.3g}"]
        if objective != "rate-per-chip":
            cells.append("-" if row["objective"] is None else f"{row['objective']:.4g}")
        cells += [_duration(row["ttft_p99_s"]), _duration(row["tpot_p99_s"]), row["binding"],
                  "yes" if row["converged"] else "no"]
        table.add_row(*cells)
    console.print(table)
    close = [row for row in document["pruned"] if row["stage"] == "close"]
    if close:
        screen = close[0]["screen"]
        shown = "; ".join(f"{row['layout']} ({row['engine']}, {row['limits']})" for row in close)
        console.print(f"Close to the best, not searched (accepted at {screen['rates'][0]:.4g} req/s and refused at "
                      f"{screen['rates'][1]:.4g} with {screen['num_requests']:,} requests, as the best is; "
                      f"--exhaustive searches them): {shown}", highlight=False)
    console.print(f"[bold]Best: {best['layout']}[/bold] ({best['engine']}, {best['limits']}): "
                  f"{best['request_rate']:.4g} req/s, {best['request_rate_per_chip']:.3g} per chip", highlight=False)
    if document["not_told_apart"]:
        console.print(f"Within {question['stability']:.0%} of it, not told apart (a capacity moves that much with "
                      f"the run's length, and a few percent with the workload's draw): "
                      f"{'; '.join(document['not_told_apart'])}", highlight=False)
    sets = " ".join(f"--set {item}" for item in best["set"])
    at = best["at_capacity"]
    asked = " ".join([*([scenario_ref] if scenario_ref else []), *(f"--{name} {question[name]!r}" for name, default in
                                                                   (("tolerance", DEFAULT_TOLERANCE),
                                                                    ("stability", DEFAULT_STABILITY))
                                                                   if question[name] != default)])
    slo = ",".join(f"{name}={target_text(row)}" for name, row in question["slo"].items())
    capacity = " ".join(["tokenpath capacity", *([asked] if asked else []), f"--slo {slo}"])
    console.print(escape(f"Its capacity again{flags_note}: {capacity} --workers {question['workers']} {sets}"),
                  highlight=False, soft_wrap=True)
    simulate = " ".join(["tokenpath simulate", *([scenario_ref] if scenario_ref else []), sets])
    console.print(escape(f"Its run at capacity{flags_note}: {simulate} --request-rate "
                         f"{at['workload.arrival.rate']!r} --num-requests {at['workload.num_requests']}"),
                  highlight=False, soft_wrap=True)


@app.command(help="Which deployment of the scenario's model on N chips serves the most requests at an SLO: every "
                  "TP x PP x DP split and engine, pruned, then a capacity search each." + SEARCH_EXAMPLE)
@scenario_flags(omit=("tp", "pp", "scheduler"))
def search(
    scenario: str | None = typer.Argument(None, help="a scenario file (.toml) or catalog name; default 'typical'"),
    slo_given: list[str] | None = typer.Option(None, "--slo", help="targets, e.g. ttft_p99=1s,tpot_p99=50ms, "
                                                                     "repeatable (default: the scenario's [slo] as "
                                                                     "p99 targets)"),
    objective: str = typer.Option("rate-per-chip", "--objective", help="rate-per-chip, cost or goodput"),
    engines_given: list[str] | None = typer.Option(None, "--engines", help="engine profiles to compare, e.g. "
                                                                             "vllm-v1,sglang, repeatable (default: "
                                                                             "the scenario's)"),
    disagg: bool = typer.Option(False, "--disagg", help="also every prefill:decode split of the replicas"),
    limits: bool = typer.Option(True, "--limits/--no-limits",
                                help="also max_num_seqs and max_num_batched_tokens halved and doubled around "
                                     "the two best layouts"),
    exhaustive: bool = typer.Option(False, "--exhaustive", help="search every valid candidate in full: no bound, "
                                                                 "no screen (slow; checks the pruning)"),
    top: int = typer.Option(10, "--top", help="rows of the table (the JSON has every candidate)"),
    tolerance: float = typer.Option(DEFAULT_TOLERANCE, "--tolerance", help=TOLERANCE_HELP),
    stability: float = typer.Option(DEFAULT_STABILITY, "--stability", help=STABILITY_HELP),
    prices: str | None = typer.Option(None, "--prices", help="chip prices for --objective cost (default: the "
                                                                  "catalog's)"),
    workers: int | None = typer.Option(None, "--workers", help="simulations side by side (default: one per CPU)"),
    ray: bool = typer.Option(False, "--ray", help="judge candidates as Ray tasks, as many at once as the cluster "
                                                  "has CPUs (needs pip install 'tokenpath[ray]')"),
    ray_address: str | None = typer.Option(None, "--ray-address", help="a Ray cluster to join ('auto', or "
                                                                           "HOST:PORT); implies --ray"),
    emit: str | None = typer.Option(None, "--emit", help="write how to launch the best deployment: vllm, sglang, "
                                                         "trtllm or k8s (as `tokenpath launch`)"),
    out: str | None = typer.Option(None, "--out", help="with --emit: write the launch files into this folder "
                                                       "(default: print them)"),
    json_out: JsonOut = None,
    *, flags: dict[str, Any],
) -> None:
    from tokenpath.cli.launch import check_launch_request, write_launch_files
    from tokenpath.sim.forked import available_cpus
    from tokenpath.whatif.capacity import parse_slo, resolve_targets, scenario_slo
    from tokenpath.whatif.layouts import parse_engines
    from tokenpath.whatif.objective import COST, Objective, Prices, application_chips, chips_in_use
    from tokenpath.whatif.run import Base
    from tokenpath.whatif.search import OBJECTIVES, Question, run_search

    if workers is not None and workers < 1:
        raise UserError(f"--workers: {workers} must be at least 1")
    if ray_address is not None:
        from tokenpath.sweep.run import check_ray_address

        check_ray_address(ray_address)
    ray = ray or ray_address is not None
    if ray and workers is not None:
        raise UserError("--workers: Ray places candidates on the cluster's CPUs itself; leave out --workers with --ray")
    check_precision(tolerance, stability)
    if top < 1:
        raise UserError(f"--top: {top} must be at least 1")
    if objective not in OBJECTIVES:
        raise UserError(f"--objective: unknown {objective!r}; use {', '.join(OBJECTIVES)}")
    if emit is not None:
        check_launch_request(emit, out, "--emit")
        if json_out == "-" and out is None:
            raise UserError("--emit: the JSON goes to stdout (--json -); give --out DIR for the launch files")
    elif out is not None:
        raise UserError("--out: the folder for launch files; add --emit ENGINE, or drop --out")
    slo = ",".join(slo_given) if slo_given else None
    if slo is not None:
        parse_slo(slo)  # a bad --slo is refused before anything is built
    if json_out is not None:
        files.check_writable(json_out, "--json")
    base = Base(*scenario_table(scenario, flags))
    built = base.scenario()
    targets = resolve_targets(slo, built.slo, "ttft_p99=1s")
    if objective == "goodput" and not scenario_slo(built.slo):
        raise UserError("--objective goodput: the scenario sets no [slo] target; set one, e.g. --set slo.ttft=1s")
    chosen_prices = Prices.load(prices) if objective == "cost" or prices else None
    unpriced = Objective(COST, prices=chosen_prices).unpriced(chips_in_use(built)) if objective == "cost" else []
    if unpriced:
        raise UserError(f"--objective cost: no price for {', '.join(unpriced)}; give --prices FILE with a "
                        + " and a ".join(f"[{chip}]" for chip in unpriced) + " table")
    compared = tuple(parse_engines(",".join(engines_given) if engines_given else None, built.engine.scheduler))
    question = Question(built.deployment.chips, targets, objective, compared, disagg, limits, exhaustive, tolerance,
                        stability, chosen_prices, application_chips(built))
    quiet = json_out == "-"
    progress = progress_bar(TextColumn("searching deployments"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[simulations]} simulations"), TimeElapsedColumn(), quiet=quiet)
    started = time.perf_counter()
    with progress:
        task = progress.add_task("search", total=0, simulations=0)

        def planned(k: int) -> None:
            progress.update(task, total=progress.tasks[0].total + k)

        def simulated(k: int) -> None:
            progress.update(task, simulations=progress.tasks[0].fields["simulations"] + k)

        document = run_search(base, question, workers or available_cpus(), ray, ray_address,
                              lambda k: progress.advance(task, k), simulated, planned)
    if not quiet:
        same = any(value is not None for name, value in flags.items() if name != "chips")
        _print(document, top, time.perf_counter() - started, scenario,
               " (with the scenario flags given here)" if same else "")
    if json_out is not None:
        write_json(document, json_out)
    if emit is not None:
        from tokenpath.launch import launch_files
        from tokenpath.whatif.search import best_scenario

        write_launch_files(launch_files(best_scenario(base, document), emit), out)


def target_text(row: dict[str, Any]) -> str:
    """A target of the JSON as --slo reads it back exactly: 1.0s, 0.05s, 0.9."""
    return f"{row['target']!r}s" if row["unit"] == "s" else repr(row["target"])
