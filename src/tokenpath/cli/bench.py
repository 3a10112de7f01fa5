"""`tokenpath bench` (measure a real server) and `compare` (two summaries side by side)."""

from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import typer

from tokenpath.cli.app import app, console, err_console, progress_bar, write_json
from tokenpath.cli.options import JsonOut, scenario_flags
from tokenpath.config import files
from tokenpath.config.errors import UserError, quoted

# A backslash at the end of a line below joins it to the next: the help shows the example on one line.
BENCH_EXAMPLE = """
Examples:

  tokenpath bench --base-url http://127.0.0.1:8000 --model meta-llama/Llama-3.1-8B-Instruct

  tokenpath bench my.toml --base-url http://127.0.0.1:8000 --model m --request-rate 4 --num-requests 200 \
--json bench.json

  tokenpath bench --base-url https://api.example.com --model m --endpoint chat --api-key-env MY_KEY --strict-openai

Exit status: 0 when every planned request was recorded and at most --max-failure-ratio of them failed
(default 0: none may fail); 1 when more failed, or when a worker process ended before its requests did;
2 for bad input; 130 after Ctrl-C (SIGINT) and 143 after SIGTERM (128 + the signal's number, as a shell
reports a process the signal ended). A stopped run keeps every request measured so far in the results
file, the requests in flight recorded as interrupted.
"""

COMPARE_EXAMPLE = ("\n\nExample:\n\n  tokenpath simulate my.toml --json sim.json\n\n"
                   "  tokenpath compare sim.json bench.json")


def _positive(value: float | None, flag: str) -> None:
    if value is not None and not (value > 0 and math.isfinite(value)):
        raise UserError(f"{flag}: must be a number of seconds > 0, got {value}")


def _event_bytes(value: str) -> int:
    from tokenpath.config.units import parse_bytes

    size = parse_bytes(value, "--max-event-bytes")
    if not 1 <= size <= 2**40:
        raise UserError(f"--max-event-bytes: {value!r} must be from 1 B to 1 TiB, e.g. '16 MiB'")
    return int(size)


@app.command(help="Measure a real OpenAI-compatible server under a scenario's workload, in the same schema as "
                  "simulate." + BENCH_EXAMPLE)
@scenario_flags(omit=("model",))  # --model is the name the server serves
def bench(
    scenario: str | None = typer.Argument(None, help="a scenario file (.toml) or catalog name; default 'typical'"),
    base_url: str | None = typer.Option(None, "--base-url", help="the server, e.g. http://127.0.0.1:8000 (required)"),
    model: str | None = typer.Option(None, "--model", help="the model name the server serves (required)"),
    endpoint: str = typer.Option("completions", "--endpoint", help="completions or chat"),
    api_key_env: str | None = typer.Option(None, "--api-key-env", help="environment variable holding the API key"),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="tokenizer.json for the prompts (default: Tekken)"),
    workers: int | None = typer.Option(None, "--workers", help="client processes (default: as the target rate needs)"),
    timeout: float = typer.Option(600.0, "--timeout", help="seconds a request may take in all"),
    stall_timeout: float = typer.Option(60.0, "--stall-timeout", help="seconds a stream may go without a byte"),
    connect_timeout: float = typer.Option(10.0, "--connect-timeout", help="seconds to open a connection"),
    strict_openai: bool = typer.Option(False, "--strict-openai",
                                       help="send only standard OpenAI fields (no ignore_eos, no per-event usage)"),
    extra_body: str | None = typer.Option(None, "--extra-body", help="JSON object merged into every request body"),
    kernel_timestamps: bool = typer.Option(True, "--kernel-timestamps/--loop-timestamps",
                                           help="stamp arrivals with the kernel's receive time (Linux, http) or "
                                                "when the event loop reads them"),
    max_failure_ratio: float = typer.Option(0.0, "--max-failure-ratio",
                                            help="exit 1 when more than this share of the requests failed (0 to 1)"),
    max_event_bytes: str = typer.Option("16 MiB", "--max-event-bytes",
                                        help="a larger SSE event fails its request as malformed"),
    unique_prompts: bool = typer.Option(True, "--unique-prompts/--no-unique-prompts",
                                        help="tag each prompt's own text (after any shared prefix) so a prefix "
                                             "cache finds only what the workload shares"),
    json_out: JsonOut = None,
    results: str | None = typer.Option(None, "--results", help="results JSONL, one line per finished request "
                                                                "(default: bench-TIME.jsonl)"),
    *, flags: dict[str, Any],
) -> None:
    from tokenpath.bench import (
        Target,
        build_plan,
        default_workers,
        execute,
        load_tokenizer,
        preflight,
        read_results,
        workload_requests,
    )
    from tokenpath.bench.http import Endpoint
    from tokenpath.bench.plan import parse_extra_body
    from tokenpath.bench.results import bench_summary
    from tokenpath.bench.tokenizer import tokenizer_name
    from tokenpath.cli.options import check_tokenizer, load_with_flags

    if not base_url:
        raise UserError("--base-url is required: the server to measure, e.g. --base-url http://127.0.0.1:8000")
    if not model:
        raise UserError("--model is required: the model name the server serves (see its /v1/models)")
    if endpoint not in ("completions", "chat"):
        raise UserError(f"--endpoint: {quoted(endpoint)} is not one of completions, chat")
    if workers is not None and workers < 1:
        raise UserError(f"--workers: must be 1 or more, got {workers}")
    for value, flag in ((timeout, "--timeout"), (stall_timeout, "--stall-timeout"),
                        (connect_timeout, "--connect-timeout")):
        _positive(value, flag)
    if not 0 <= max_failure_ratio <= 1:
        raise UserError(f"--max-failure-ratio: must be from 0 to 1 (the share of requests allowed to fail), "
                        f"got {max_failure_ratio}")
    event_bytes = _event_bytes(max_event_bytes)
    api_key = None
    if api_key_env is not None:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise UserError(f"--api-key-env: the environment variable {quoted(api_key_env)} is not set or empty")
    Endpoint.parse(base_url)
    target = Target(base_url, model, endpoint, api_key, strict_openai, parse_extra_body(extra_body, strict_openai))  # type: ignore[arg-type]
    results_path = results or time.strftime("bench-%Y%m%d-%H%M%S.jsonl")
    if results_path == "-":
        raise UserError("--results -: per-request results are written to a file, line by line as requests finish "
                        "so that a stopped run keeps them, not to stdout; give a path")
    files.check_writable(results_path, "--results")
    if Path(results_path).exists() and Path(results_path).stat().st_size > 0:
        raise UserError(f"--results: {results_path} already exists; give a new path "
                        "(a run never overwrites measurements)")
    if json_out is not None:
        files.check_writable(json_out, "--json")
        files.check_apart(results_path, "--results", json_out, "--json")
    check_tokenizer(tokenizer, "--tokenizer")

    built = load_with_flags(scenario, flags)
    requests = workload_requests(built)
    preflight(target, connect_timeout)

    quiet = json_out == "-"
    with err_console.status("building prompts", spinner="dots") if not quiet else _Null():
        loaded = load_tokenizer(tokenizer)
        plan, header = build_plan(built, target, loaded, tokenizer_name(loaded, tokenizer), requests,
                                  {"connect_timeout_s": connect_timeout, "stall_timeout_s": stall_timeout,
                                   "request_timeout_s": timeout}, kernel_timestamps=kernel_timestamps,
                                  max_event_bytes=event_bytes, unique_prompts=unique_prompts)
    count = workers or default_workers(built, requests)

    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    progress = progress_bar(TextColumn("measuring"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn(), quiet=quiet)
    with progress:
        task = progress.add_task("bench", total=len(requests), failed=0)
        outcome = execute(plan, results_path, header, count,
                          lambda done, failed: progress.update(task, completed=done, failed=failed))
    if outcome.signal and not (Path(results_path).exists() and Path(results_path).stat().st_size):
        err_console.print(f"stopped by {signal.Signals(outcome.signal).name} before the first request was sent: "
                          "nothing was measured", highlight=False)
        raise typer.Exit(128 + int(outcome.signal))
    header, rows = read_results(results_path, _warn)
    summary = bench_summary(header, rows)
    _emit(summary, header, rows, results_path, json_out)
    raise typer.Exit(_exit_status(outcome, len(rows), len(requests), summary["requests"]["failed"], max_failure_ratio,
                                  results_path))


def _exit_status(outcome: Any, recorded: int, planned: int, failed: int, max_failure_ratio: float,
                 results_path: str) -> int:
    """0, or why not: 128 + the signal that stopped the run; 1 for a worker that died or too many failures."""
    if outcome.interrupted:
        why = f"stopped by {signal.Signals(outcome.signal).name}" if outcome.signal else "a worker process ended early"
        err_console.print(f"{why}: {recorded} of {planned} requests recorded in {results_path}; "
                          f"`tokenpath report {results_path}` rebuilds this summary", highlight=False)
        return 128 + int(outcome.signal) if outcome.signal else 1
    if recorded and failed / recorded > max_failure_ratio:
        err_console.print(f"{failed} of {recorded} requests failed ({failed / recorded:.1%}), more than "
                          f"--max-failure-ratio {max_failure_ratio:g} allows: exit status 1", highlight=False)
        return 1
    return 0


def _warn(message: str) -> None:
    err_console.print(f"[yellow]warning:[/yellow] {message}", highlight=False, soft_wrap=True)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _emit(summary: dict[str, Any], header: dict[str, Any], rows: list[dict[str, Any]], results_path: str,
          json_out: str | None) -> None:
    from tokenpath.bench.client import saturation_warning
    from tokenpath.bench.results import failures
    from tokenpath.config.units import format_duration
    from tokenpath.report.bench import describe_bench
    from tokenpath.report.table import print_summary

    if json_out is not None:
        write_json(summary, json_out)
    # A saturated client's latencies are partly its own: said last, on stderr, however the summary goes out.
    saturated = saturation_warning(summary["bench"]["client"], summary["load"]["overloaded"])
    if json_out == "-":
        if saturated:
            _warn(saturated)
        return
    print_summary(console, summary, describe_bench(header, rows, results_path), None)
    block = summary["bench"]
    wait = block["client_wait_s"]
    console.print(f"client wait (scheduled -> sent): mean {format_duration(wait['mean'])}, "
                  f"p99 {format_duration(wait['p99'])}", highlight=False)
    arrivals = block["arrivals"]
    if arrivals["sharing_a_read"]:
        console.print(f"{arrivals['sharing_a_read']:,} of {arrivals['events']:,} token events arrived in one read "
                      "with the event before (the client was behind): they share its timestamp, so ITL's tail "
                      "reads long", highlight=False)
    counted = block["output_tokens_from"].get("events", 0)
    if counted:
        console.print(f"{counted:,} requests' output tokens were counted one an event: the server sent no usage "
                      "and stopped them before max_tokens, so an event carrying several tokens counts as one "
                      "(ask the server for usage, e.g. stream_options.include_usage)", highlight=False)
    early = {reason: count for reason, count in block["finish_reasons"].items() if reason != "length"}
    if early and not header.get("strict_openai"):
        reasons = ", ".join(f"{reason} {count:,}" for reason, count in early.items())
        ended = sum(early.values())
        console.print(f"{ended:,} request{'s' if ended != 1 else ''} ended before the max_tokens asked, ignore_eos "
                      f"sent (finish_reason {reasons}): counted completed, as vLLM's bench serve counts them, "
                      "with shorter outputs and E2E than the workload drew", highlight=False)
    if block["reasoning"]["requests"]:
        r = block["reasoning"]
        console.print(f"reasoning: {r['requests']} requests, {r['tokens_mean']:.0f} reasoning tokens on average, "
                      f"{format_duration(r['time_s']['mean'])} before the answer", highlight=False)
    if block["failure_reasons"]:
        reasons = ", ".join(f"{name} {count}" for name, count in block["failure_reasons"].items())
        console.print(f"[red]failed:[/red] {reasons}", highlight=False)
        for line in failures(rows):
            console.print(f"  {line}", highlight=False, soft_wrap=True)
    if saturated:
        _warn(saturated)


@app.command(help="Two summaries side by side with the relative difference per metric." + COMPARE_EXAMPLE)
def compare(
    a: str = typer.Argument(..., help="first summary (--json of simulate, bench or report)"),
    b: str = typer.Argument(..., help="second summary"),
    json_out: str | None = typer.Option(None, "--json", help="write the comparison to PATH, or '-' for stdout"),
) -> None:
    from tokenpath import load_summary
    from tokenpath.report.compare import compare_document, compare_table, difference_line

    first, second = load_summary(a), load_summary(b)
    if json_out is not None:
        write_json(compare_document(first, second, a, b), json_out)
    if json_out == "-":
        return
    console.print(compare_table(first, second, Path(a).name, Path(b).name))
    differs = difference_line(first, second)
    if differs is not None:
        console.print(f"note: the two runs are of different scenarios: {differs}", highlight=False)
