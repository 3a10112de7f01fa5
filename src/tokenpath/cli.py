"""The `tokenpath` command line."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tokenpath.errors import UserError

app = typer.Typer(
    help="Where the time goes between an LLM request and readable text on the user's screen.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
scenario_app = typer.Typer(help="Inspect scenarios.", no_args_is_help=True)
app.add_typer(scenario_app, name="scenario")
calibrate_app = typer.Typer(help="Measure this machine and write calibration files.", no_args_is_help=True)
app.add_typer(calibrate_app, name="calibrate")

console = Console()
err_console = Console(stderr=True)


def _rate(value: str) -> float | str:
    if value.strip().lower() in ("inf", "infinity"):
        return "inf"
    try:
        rate = float(value)
    except ValueError:
        raise UserError(f"--request-rate: {value!r} is not a number; give requests/s (e.g. 12.5) or 'inf'") from None
    if not math.isfinite(rate) or rate <= 0:
        raise UserError(f"--request-rate: {value!r} must be > 0 requests/s, or 'inf' to send everything at t=0")
    return rate


def _length(table: dict[str, Any], which: str, mean: Optional[float], sd: Optional[float]) -> dict[str, Any]:
    """--input-len/--input-sd replace the length table: normal(mean, sd), or fixed when sd is 0."""
    current = table.get("workload", {}).get(which, {})
    defaults = {"input": (550.0, 150.0), "output": (150.0, 80.0)}[which]
    mean = mean if mean is not None else current.get("mean", current.get("value", defaults[0]))
    sd = sd if sd is not None else current.get("sd", 0.0 if current.get("kind") == "fixed" else defaults[1])
    if sd == 0:
        if mean < 1 or mean != int(mean):
            raise UserError(f"--{which}-len: a fixed length must be a whole number of tokens >= 1, got {mean}")
        return {"kind": "fixed", "value": int(mean)}
    return {"kind": "normal", "mean": float(mean), "sd": float(sd)}


def _overrides(table: dict[str, Any], **flags: Any) -> dict[str, Any]:
    direct = {
        "model": "model.name", "chip": "deployment.chip", "chips": "deployment.chips", "tp": "deployment.tp",
        "pp": "deployment.pp", "placement": "deployment.placement", "cuda_graphs": "engine.cuda_graphs",
        "precision": "model.precision", "burstiness": "workload.arrival.burstiness",
        "max_concurrency": "workload.max_concurrency", "num_requests": "workload.num_requests", "seed": "seed",
    }
    out = {path: flags[flag] for flag, path in direct.items() if flags.get(flag) is not None}
    if flags.get("fabric") is not None:  # a preset name, or a topology file read from here
        fabric = flags["fabric"]
        out["deployment.fabric"] = str(Path(fabric).resolve()) if fabric.endswith(".toml") else fabric
    if flags.get("request_rate") is not None:
        out["workload.arrival.rate"] = _rate(flags["request_rate"])
    for which in ("input", "output"):
        mean, sd = flags.get(f"{which}_len"), flags.get(f"{which}_sd")
        if mean is not None or sd is not None:
            out[f"workload.{which}"] = _length(table, which, mean, sd)
    return out


# The workload flags, shared by simulate and bench: vLLM bench's names.
InputLen = Annotated[Optional[float], typer.Option("--input-len", help="mean input tokens")]
InputSd = Annotated[Optional[float], typer.Option("--input-sd", help="sd of input tokens (0 = fixed)")]
OutputLen = Annotated[Optional[float], typer.Option("--output-len", help="mean output tokens")]
OutputSd = Annotated[Optional[float], typer.Option("--output-sd", help="sd of output tokens (0 = fixed)")]
RequestRate = Annotated[Optional[str], typer.Option("--request-rate", help="requests/s, or 'inf' (all at t=0)")]
Burstiness = Annotated[Optional[float], typer.Option("--burstiness", help="gamma shape of arrival gaps; 1 = Poisson")]
MaxConcurrency = Annotated[Optional[int], typer.Option("--max-concurrency", help="cap on outstanding requests")]
NumRequests = Annotated[Optional[int], typer.Option("--num-requests", help="requests to send")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="random seed")]
JsonOut = Annotated[Optional[str], typer.Option("--json", help="write the result schema to PATH, or '-' for stdout")]


def _write_json(document: dict[str, Any], target: str) -> None:
    text = json.dumps(document, indent=2) + "\n"
    if target == "-":
        sys.stdout.write(text)
    else:
        Path(target).write_text(text, encoding="utf-8")


def _simulate_and_report(scenario_ref: Optional[str], json_out: Optional[str], flags: dict[str, Any],
                         show_explain: bool = False, workers: Optional[int] = None) -> None:
    from tokenpath.report.simulation import describe, result_document
    from tokenpath.pipeline import prepare, simulate
    from tokenpath.scenario import build_scenario, read_scenario_table, set_path

    if workers is not None and workers < 1:
        raise UserError(f"--workers: {workers} must be at least 1 (1 simulates every replica in this process)")
    table, source, base_dir = read_scenario_table(scenario_ref)
    for dotted, value in _overrides(table, **flags).items():
        set_path(table, dotted, value)
    prepared = prepare(build_scenario(table, source, base_dir))

    quiet = json_out == "-"
    progress = Progress(
        TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err_console, transient=True, disable=quiet,
    )
    with progress:
        task = progress.add_task("simulate", total=len(prepared.requests))
        simulation = simulate(prepared, progress=lambda k: progress.advance(task, k), workers=workers)
    document, reason = result_document(simulation)
    if show_explain:
        from tokenpath.report.explain import explain, explain_table

        document["explain"] = explain(simulation)
    if json_out is not None:
        _write_json(document, json_out)
    if not quiet:
        from tokenpath.report.table import print_summary

        print_summary(console, document, describe(simulation), reason)
        if show_explain:
            console.print(explain_table(document["explain"], simulation.deployment.chip.name))


SIMULATE_EXAMPLE = """
Examples:

  tokenpath simulate                                   # the embedded default scenario

  tokenpath simulate --model llama-3.1-8b --chip h100 --chips 1 --tp 1 --request-rate 8

  tokenpath simulate my.toml --request-rate inf --input-len 128 --input-sd 0 --json result.json

  tokenpath simulate --chips 32 --fabric h100-4x8-rail --placement spread
"""


@app.command(help="Simulate a scenario (default: the embedded 'typical') and print where the time goes." + SIMULATE_EXAMPLE)
def simulate(
    scenario: Optional[str] = typer.Argument(None, help="a scenario file (.toml) or catalog name; default 'typical'"),
    model: Optional[str] = typer.Option(None, help="catalog model name or path to a HF config.json"),
    chip: Optional[str] = typer.Option(None, help="catalog chip name (see `tokenpath chips`)"),
    chips: Optional[int] = typer.Option(None, help="total chips; chips / (tp * pp) data-parallel replicas"),
    tp: Optional[int] = typer.Option(None, help="tensor-parallel size"),
    pp: Optional[int] = typer.Option(None, help="pipeline-parallel stages"),
    fabric: Optional[str] = typer.Option(None, help="fabric preset name (see `tokenpath fabric --list`) or topology .toml"),
    placement: Optional[str] = typer.Option(None, help="packed or spread: where each group sits on the fabric"),
    precision: Optional[str] = typer.Option(None, help="weight precision: bf16, fp8 or fp4"),
    cuda_graphs: Optional[str] = typer.Option(
        None, "--cuda-graphs", help="steps that replay a CUDA graph: all, decode or none (eager, as --enforce-eager)"),
    input_len: InputLen = None,
    input_sd: InputSd = None,
    output_len: OutputLen = None,
    output_sd: OutputSd = None,
    request_rate: RequestRate = None,
    burstiness: Burstiness = None,
    max_concurrency: MaxConcurrency = None,
    num_requests: NumRequests = None,
    seed: Seed = None,
    json_out: JsonOut = None,
    show_explain: bool = typer.Option(False, "--explain", help="also show the per-op roofline of one steady-state step"),
    workers: Optional[int] = typer.Option(
        None, help="processes simulating data-parallel replicas side by side (default: one per CPU for "
                          "runs of 20,000 requests or more); the result does not depend on it"),
) -> None:
    flags = dict(locals())
    for not_a_scenario_flag in ("scenario", "json_out", "show_explain", "workers"):
        flags.pop(not_a_scenario_flag)
    _simulate_and_report(scenario, json_out, flags, show_explain, workers)


@app.command(help="Simulate the embedded default scenario ('typical').\n\nExample:\n\n  tokenpath run --json result.json")
def run(json_out: JsonOut = None) -> None:
    _simulate_and_report(None, json_out, {})


@scenario_app.command("show", help="Print a scenario, every default filled in, as TOML.\n\nExample:\n\n  tokenpath scenario show typical")
def scenario_show(name: Optional[str] = typer.Argument(None, help="catalog name or .toml path; default 'typical'")) -> None:
    from tokenpath.scenario import load_scenario

    sys.stdout.write(load_scenario(name).to_toml())


@scenario_app.command("list", help="List the embedded scenarios.\n\nExample:\n\n  tokenpath scenario list")
def scenario_list() -> None:
    from tokenpath.scenario import load_scenario, scenario_names

    for name in scenario_names():
        console.print(f"[bold]{name}[/bold]  {load_scenario(name).description}")


@app.command(help="List the models in the catalog.\n\nExample:\n\n  tokenpath models")
def models() -> None:
    from tokenpath.report.catalog import models_table

    console.print(models_table())


@app.command(help="List the chips in the catalog.\n\nExample:\n\n  tokenpath chips")
def chips() -> None:
    from tokenpath.report.catalog import chips_table

    console.print(chips_table())


@app.command(help="Compare predictions with published measurements.\n\nExample:\n\n"
             "  tokenpath validate --group nccl_allreduce --json -")
def validate(
    json_out: Optional[str] = typer.Option(None, "--json", help="write the rows to PATH, or '-' for stdout"),
    groups: Optional[list[str]] = typer.Option(None, "--group", help="only this group of rows (repeatable)"),
) -> None:
    from tokenpath.validate import print_validation, run_validation

    rows = run_validation(set(groups) if groups else None)
    if json_out is not None:
        _write_json(rows, json_out)
    if json_out != "-":
        print_validation(console, rows)


@app.command(help="Serve an OpenAI-compatible API that streams real text on the scenario's simulated timing."
             "\n\nExample:\n\n  tokenpath serve --port 8000\n\n"
             "  curl -N localhost:8000/v1/completions -d '{\"model\": \"m\", \"prompt\": \"Hi\", \"max_tokens\": 20, \"stream\": true}'")
def serve(
    scenario: Optional[str] = typer.Argument(None, help="a scenario file (.toml) or catalog name; default 'typical'"),
    host: str = typer.Option("127.0.0.1", help="address to bind; other hosts reach it only if you say so"),
    port: int = typer.Option(8000, help="TCP port"),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="require 'Authorization: Bearer KEY'"),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="the only model name accepted"),
    tokenizer: Optional[str] = typer.Option(None, help="tokenizer file (HF tokenizer.json, Tekken, SentencePiece)"),
    send_log: Optional[str] = typer.Option(None, "--send-log", help="append each SSE event's send time (JSONL)"),
) -> None:
    from aiohttp import web

    from tokenpath.scenario import load_scenario
    from tokenpath.serve import ServeOptions, make_app
    from tokenpath.serve.app import RUN_OPTIONS, SERVER

    application = make_app(load_scenario(scenario), ServeOptions(api_key, served_model_name, tokenizer, send_log))
    err_console.print(f"serving {application[SERVER].model_name} on http://{host}:{port}/v1 (Ctrl-C stops)")
    web.run_app(application, host=host, port=port, print=None, **RUN_OPTIONS)


def _batch_sizes(given: str, extra: list[str]) -> list[int]:
    """--batch-sizes takes "1,8,32" or "1 8 32" (the values after the flag)."""
    words = given.replace(",", " ").split() + extra
    try:
        sizes = sorted({int(word) for word in words})
    except ValueError:
        raise UserError(f"--batch-sizes: {' '.join(words)!r} must be whole numbers, e.g. --batch-sizes 1 8 32 128 256") from None
    if not sizes or sizes[0] < 1:
        raise UserError(f"--batch-sizes: {' '.join(words)!r} must be batch sizes >= 1, e.g. --batch-sizes 1 8 32 128 256")
    return sizes


CALIBRATE_DELIVERY_EXAMPLE = """
Measures detokenize + stop-string check + SSE framing per engine step at several batch sizes and
writes a file that a scenario names as `delivery.calibration = "delivery-calibration.toml"`.

Examples:

  tokenpath calibrate delivery

  tokenpath calibrate delivery --tokenizer tokenizer.model.v1 --batch-sizes 1 8 32 128 256

  tokenpath calibrate delivery --tokenizer path/to/tokenizer.json --out my-host.toml
"""


@calibrate_app.command("delivery", help="Measure this machine's last-mile host cost per batch size." + CALIBRATE_DELIVERY_EXAMPLE,
                       context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def calibrate_delivery(
    ctx: typer.Context,
    tokenizer: Optional[str] = typer.Option(
        None, help="tokenizer.json, tekken*.json, SentencePiece .model, or a name shipped with mistral-common "
                   "(default: tekken_240911.json)"),
    out: str = typer.Option("delivery-calibration.toml", help="calibration file to write"),
    batch_sizes: str = typer.Option("1 8 32 128 256", "--batch-sizes", help="batch sizes to measure, e.g. 1 8 32 128 256"),
    steps: int = typer.Option(200, min=10, help="engine steps per measurement"),
    repeats: int = typer.Option(5, min=1, help="repeats per measurement; the median is kept"),
) -> None:
    from rich.table import Table

    from tokenpath.delivery import Detokenizer
    from tokenpath.delivery.measure import calibrate

    sizes = _batch_sizes(batch_sizes, list(ctx.args))
    det = Detokenizer.load(tokenizer)
    progress = Progress(TextColumn("measuring batch sizes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err_console, transient=True)
    with progress:
        task = progress.add_task("calibrate", total=len(sizes))
        calibration = calibrate(det, sizes, steps=steps, repeats=repeats, progress=lambda _: progress.advance(task))
    calibration.write(out)
    table = Table(title=f"last-mile host cost on {calibration.machine['cpu']} ({det.name})")
    for column in ("batch", "step (fixed)", "per token", "of which framing", "whole step", "tokens/s"):
        table.add_column(column, justify="right")
    for row in calibration.batches:
        table.add_row(str(row.batch_size), f"{row.step_s * 1e6:.1f} us", f"{row.per_token_s * 1e6:.2f} us",
                      f"{row.frame_per_event_s * 1e6:.2f} us", f"{row.total_s * 1e6:.1f} us",
                      f"{row.batch_size / row.total_s:,.0f}")
    console.print(table)
    console.print(f"wrote {out}; use it with delivery.calibration = {out!r} in a scenario")


def main() -> None:
    """Entry point: a user's mistake is one line on stderr and exit status 2, never a traceback."""
    try:
        app()
    except UserError as error:
        err_console.print(f"[red]error:[/red] {error}", highlight=False, soft_wrap=True)
        sys.exit(2)


from tokenpath.cli_bench import register as _register_bench  # noqa: E402  (bench, report, compare)

_register_bench(app)

from tokenpath.cli_fabric import register as _register_fabric  # noqa: E402  (fabric)

_register_fabric(app)
