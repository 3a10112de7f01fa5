"""`tokenpath sweep`: one scenario at many points, each a full simulation, into a Parquet or CSV table."""

from __future__ import annotations

import csv
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from tokenpath.cli.app import app, console, err_console, progress_bar
from tokenpath.config import files
from tokenpath.config.errors import UserError
from tokenpath.diagnose.overload import load_marks, load_notes, still_filling, too_short
from tokenpath.sim.envelope import OUTSIDE_MARK

SWEEP_EXAMPLE = """
Example spec (sweep.toml):

  scenario = "typical"
  [overrides]
  "workload.num_requests" = 10000
  [axes]
  "deployment.tp" = [2, 4, 8]
  "workload.arrival.rate" = [10, 20, 30]

Examples:

  tokenpath sweep sweep.toml --out results.parquet

  tokenpath sweep sweep.toml --out results.csv --pareto throughput.output_tokens_per_s,latency_s.ttft.p99

  tokenpath sweep sweep.toml --out results.parquet --ray            # a local Ray instance

  tokenpath sweep sweep.toml --out results.parquet --ray-address auto   # the Ray cluster this machine is in

Rerunning the same command resumes: only the points missing from --out run.
"""


@app.command(help="Simulate a scenario at every point of a sweep spec; one row per point in a Parquet "
                  "(or .csv) table, kept as each point finishes." + SWEEP_EXAMPLE)
def sweep(
    spec: str = typer.Argument(..., help="the sweep spec (.toml): scenario, [overrides], [axes], samples, seed"),
    out: str = typer.Option(..., "--out", help="the results table: .parquet (or .pq) or .csv"),
    ray: bool = typer.Option(
        False, "--ray", help="run the points on Ray: a local instance, or the cluster at --ray-address "
                             "(needs pip install 'tokenpath[ray]')"),
    ray_address: str | None = typer.Option(
        None, "--ray-address", help="a Ray cluster to join ('auto', or HOST:PORT); implies --ray"),
    pareto: str | None = typer.Option(
        None, "--pareto", help="X,Y: print and write the frontier of two metrics, each X:max or X:min "
                               "(inferred for latencies, stalls, throughput and QoE)"),
    workers: int | None = typer.Option(None, help="local processes running points side by side "
                                                     "(default: one per CPU)"),
) -> None:
    from tokenpath.sweep.pareto import frontier, parse_objectives
    from tokenpath.sweep.run import check_ray_address, run_sweep
    from tokenpath.sweep.spec import load_spec
    from tokenpath.sweep.store import table_format

    out_path = Path(out)
    table_format(out_path)
    files.check_writable(out, "--out")
    objectives = parse_objectives(pareto) if pareto is not None else None
    if ray_address is not None:
        check_ray_address(ray_address)
    ray = ray or ray_address is not None
    if ray and workers is not None:
        raise UserError("--workers: Ray places points on the cluster's CPUs itself; leave out --workers with --ray")
    sweep_spec = load_spec(spec)

    progress = progress_bar(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("ETA"), TimeRemainingColumn())
    task = progress.add_task("sweep", total=len(sweep_spec.points))

    def started(done: int, total: int) -> None:
        if done:
            err_console.print(f"resuming: {done} of {total} points already in {files.shown(out)}")
        progress.update(task, completed=done)

    try:
        with progress:
            result = run_sweep(sweep_spec, out_path, workers=workers, ray=ray, ray_address=ray_address, started=started,
                               finished=lambda row: progress.advance(task))
    except KeyboardInterrupt:
        err_console.print(f"interrupted: the finished points are kept in {files.shown(out)}; rerun the same "
                          "command to run the rest")
        raise typer.Exit(130) from None
    console.print(f"{result.ran} point(s) simulated, {result.already} already there: {result.total} rows in "
                  f"{files.shown(out)}")
    rows = _rows(out_path)
    outside = sum(_outside(row) for row in rows)
    if outside:
        console.print(f"{outside} of {len(rows)} point(s) outside the validated envelope (columns envelope.validated "
                      "and envelope.outside; docs/validation.md)", highlight=False)
    overloaded = sum(_load(row)[1] for row in rows)
    filling = sum(still_filling(*_load(row)[:2]) for row in rows)
    short = sum(too_short(*_load(row)[1:]) for row in rows)
    if overloaded or filling or short:
        console.print(f"{overloaded} of {len(rows)} point(s) overloaded, {filling} still filling when their sends "
                      f"stopped, {short} too short to watch (columns load.overloaded, load.settled and "
                      "load.confidence: their latencies are a queue's or a transient's, or may be)", highlight=False)
    if objectives is not None:
        _write_pareto(out_path, sweep_spec.axes, objectives, frontier(rows, objectives))


def _outside(row: dict) -> bool:
    """Whether a point's scenario lies outside the validated envelope (sim/envelope.py)."""
    return row.get("envelope.validated") is False


def _load(row: dict) -> tuple[bool | None, bool, str | None]:
    """A point's run's `load.settled`, `load.overloaded` and `load.confidence` (diagnose/overload.py)."""
    return row.get("load.settled"), bool(row.get("load.overloaded")), row.get("load.confidence")


def _rows(out: Path) -> list[dict]:
    from tokenpath.sweep.store import table_format

    if table_format(out) == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(out).to_pylist()
    import pyarrow.csv as pacsv

    return pacsv.read_csv(out).to_pylist()


def _write_pareto(out: Path, axes: list[str], objectives: list[tuple[str, str]], rows: list[dict]) -> None:
    from tokenpath.sweep.store import pareto_path

    columns = ["point", *axes, *(metric for metric, _ in objectives)]
    table = Table(title=f"Pareto frontier: {', '.join(f'{m} ({d})' for m, d in objectives)}")
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        cells = [f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c]) for c in columns]
        cells[0] += (f" {OUTSIDE_MARK}" if _outside(row) else "") + load_marks(*_load(row))
        table.add_row(*cells)
    console.print(table)
    if any(_outside(row) for row in rows):
        console.print(f"{OUTSIDE_MARK} outside the validated envelope (docs/validation.md)", highlight=False)
    for note in load_notes([_load(row) for row in rows]):
        console.print(note, highlight=False)
    target = pareto_path(out)
    try:
        with open(target, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    except OSError as error:
        raise UserError(f"{files.shown(str(target))}: cannot write the frontier ({error.strerror})") from None
    console.print(f"frontier: {len(rows)} point(s) in {files.shown(str(target))}")
