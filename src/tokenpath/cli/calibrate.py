"""`tokenpath calibrate delivery`: this machine's last-mile host cost."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from tokenpath.cli.app import calibrate_app, console, err_console, progress_bar
from tokenpath.cli.options import WORKLOAD_FLAGS, check_tokenizer, scenario_flags, scenario_table
from tokenpath.config import files
from tokenpath.config.errors import UserError, quoted
from tokenpath.delivery.detokenizer import DEFAULT_TOKENIZER
from tokenpath.engine.spec import MAX_NUM_SEQS

if TYPE_CHECKING:
    from tokenpath.delivery.calibration import Calibration


def _batch_sizes(given: str, extra: list[str]) -> list[int]:
    """--batch-sizes takes "1,8,32" or "1 8 32" (the values after the flag)."""
    words = given.replace(",", " ").split() + extra
    try:
        sizes = sorted({int(word) for word in words})
    except ValueError:
        raise UserError(f"--batch-sizes: {quoted(' '.join(words))} must be whole numbers, "
                        "e.g. --batch-sizes 1 8 32 128 256") from None
    if not sizes or sizes[0] < 1 or sizes[-1] > MAX_NUM_SEQS:
        raise UserError(f"--batch-sizes: {quoted(' '.join(words))} must be batch sizes from 1 to {MAX_NUM_SEQS:,} "
                        "(the most sequences a step holds, engine.max_num_seqs), e.g. --batch-sizes 1 8 32 128 256")
    return sizes


CALIBRATE_DELIVERY_EXAMPLE = """
Measures detokenize + stop-string check + SSE framing per engine step at several batch sizes, what the
front end spends per request before the engine sees it (parse and validate, chat template, tokenize,
hand-off), one streamed chunk built as an engine's own pydantic code builds it, and the HTTP servers'
own work per request and per streamed event (tokenpath serve's aiohttp stack, and an engine's FastAPI
under uvicorn where fastapi and uvicorn are installed: pip install 'tokenpath[engines]'), and writes a
file that a scenario names as `delivery.calibration = "delivery-calibration.toml"`.

Examples:

  tokenpath calibrate delivery

  tokenpath calibrate delivery --tokenizer tokenizer.model.v1 --batch-sizes 1 8 32 128 256

  tokenpath calibrate delivery --tokenizer path/to/tokenizer.json --out my-host.toml
"""


@calibrate_app.command("delivery",
                       help="Measure this machine's last-mile host cost per batch size." + CALIBRATE_DELIVERY_EXAMPLE,
                       context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def calibrate_delivery(
    ctx: typer.Context,
    tokenizer: str | None = typer.Option(
        None, help="tokenizer.json, tekken*.json, SentencePiece .model, or a name shipped with mistral-common "
                   f"(default: {DEFAULT_TOKENIZER})"),
    out: str = typer.Option("delivery-calibration.toml", help="calibration file to write"),
    batch_sizes: str = typer.Option("1 8 32 128 256", "--batch-sizes",
                                    help="batch sizes to measure, e.g. 1 8 32 128 256"),
    steps: int = typer.Option(200, min=10, help="engine steps per measurement"),
    repeats: int = typer.Option(5, min=1, help="repeats per measurement; the median is kept"),
) -> None:
    from rich.table import Table

    from tokenpath.calibrate.engine_http import measure_engine_http, missing
    from tokenpath.delivery import Detokenizer
    from tokenpath.delivery.measure import calibrate
    from tokenpath.serve.measure import measure_http

    sizes = _batch_sizes(batch_sizes, list(ctx.args))
    files.check_writable(out, "--out")
    check_tokenizer(tokenizer, "--tokenizer")
    det = Detokenizer.load(tokenizer)
    absent = missing()
    progress = progress_bar(TextColumn("measuring batch sizes, the request path, the HTTP servers"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn())
    with progress:
        task = progress.add_task("calibrate", total=len(sizes) + (2 if absent else 3))
        calibration = calibrate(det, sizes, steps=steps, repeats=repeats, progress=lambda _: progress.advance(task),
                                http=measure_http, engine_http=None if absent else measure_engine_http)
    if absent:
        calibration.path["engine_http"] = {"skipped": absent}
        err_console.print(f"note: an engine's HTTP layer (FastAPI, uvicorn) was not measured: {absent}; the file "
                          "prices an engine's front end without it", highlight=False, soft_wrap=True)
    calibration.write(out)
    table = Table(title=f"last-mile host cost on {calibration.machine['cpu']} ({det.name})")
    for column in ("batch", "step (fixed)", "per token", "of which framing", "whole step", "tokens/s"):
        table.add_column(column, justify="right")
    for row in calibration.batches:
        table.add_row(str(row.batch_size), f"{row.step_s * 1e6:.1f} us", f"{row.per_token_s * 1e6:.2f} us",
                      f"{row.frame_per_event_s * 1e6:.2f} us", f"{row.total_s * 1e6:.1f} us",
                      f"{row.batch_size / row.total_s:,.0f}")
    console.print(table)
    if calibration.request is not None and calibration.framing is not None:
        console.print(_request_table(calibration))
    console.print(f"wrote {out}; use it with delivery.calibration = {out!r} in a scenario")


# Prompt lengths the request table shows a whole request's front-end cost at.
SHOWN_PROMPT_TOKENS = (128, 2048, 8192)


def _request_table(calibration: Calibration):
    """The request path's figures and the engine's framing (the file's [path] says how each was measured)."""
    from rich.table import Table

    request, framing, how = calibration.request, calibration.framing, calibration.path.get("request", {})
    table = Table(title="front end per request, and per streamed chunk")
    for column, justify in (("piece", "left"), ("cost", "right"), ("measured with", "left")):
        table.add_column(column, justify=justify)
    table.add_row("parse + validate", f"{request.parse_s * 1e6:.1f} us", "orjson + vLLM-style pydantic request")
    table.add_row("chat template", f"{request.template_s * 1e6:.1f} us", how.get("template", ""))
    table.add_row("tokenize", f"{request.tokenize_per_token_s * 1e9:.0f} ns/token",
                  "slope over " + ", ".join(map(str, how.get("tokenize_prompt_tokens", []))) + " tokens")
    table.add_row("hand-off to engine", f"{request.handoff_s * 1e6:.1f} us",
                  f"pickle + socket pair, {how.get('handoff_prompt_tokens', '?')} ids")
    parse, parsed = calibration.template_parse, calibration.path.get("template_parse", {})
    if parse is not None:  # engine/template_work.py: the releases that read the source per request
        on = f"{parsed.get('template', '?')}, {parsed.get('chars', '?')} characters"
        detection_ns, kwargs_ns = (parse.template_format_detection_per_char_s * 1e9,
                                   parse.template_kwargs_resolution_per_char_s * 1e9)
        table.add_row("template source, vLLM 0.6.5-0.9.1", f"{detection_ns:.0f} ns/char",
                      f"parse + walk (content-format detection), {on}")
        table.add_row("template source, vLLM 0.11.0", f"{kwargs_ns:.0f} ns/char",
                      f"parse + undeclared variables (argument resolution), {on}")
    http, engine = calibration.http, calibration.engine_http
    if http is not None:
        table.add_row("HTTP server, per request", f"{http.request_s * 1e6:.1f} us",
                      "serve's aiohttp stack: accept, parse, dispatch, close")
    if engine is not None:
        table.add_row("engine's HTTP server, per request", f"{engine.request_s * 1e6:.1f} us",
                      "FastAPI + uvicorn, the body validated into the pydantic request")
    for tokens in SHOWN_PROMPT_TOKENS:  # as an engine's front end: its HTTP server where measured
        whole_s = request.per_request_s(tokens) + (engine.request_s - request.parse_s if engine is not None else 0.0)
        table.add_row(f"whole request, {tokens} tokens", f"{whole_s * 1e6:,.0f} us",
                      "an engine's front end" if engine is not None else "without an HTTP server")
    ratio = framing.engine_frame_per_event_s / framing.own_frame_per_event_s if framing.own_frame_per_event_s else 0
    table.add_row("chunk, engine's own code", f"{framing.engine_frame_per_event_s * 1e6:.2f} us",
                  f"pydantic + model_dump_json: {ratio:.1f}x sse.py")
    table.add_row("chunk, this package", f"{framing.own_frame_per_event_s * 1e6:.2f} us", "sse.py, one stream")
    if http is not None:
        table.add_row("chunk written to its socket", f"{http.event_s * 1e6:.2f} us",
                      "serve's queue, task and StreamResponse.write")
    if engine is not None:
        table.add_row("chunk written, engine's server", f"{engine.event_s * 1e6:.2f} us",
                      "collector, async generators, StreamingResponse, uvicorn")
    return table


CALIBRATE_ENGINE_EXAMPLE = """
Probes a running server with the bench client (single requests across prompt lengths, closed loops at a
few concurrencies, a short ramp of open-loop arrivals), fits the assumptions the scenario's deployment
is sensitive to, and writes a file a scenario applies with `[assumptions] calibration = "FILE"`.

Examples:

  tokenpath calibrate engine --base-url http://127.0.0.1:8000 --model m my.toml --out engine-calibration.toml

  tokenpath calibrate engine my.toml --from bench-results.jsonl --from other-run.jsonl --out engine-calibration.toml

  tokenpath calibrate engine my.toml --from vllm-bench-result.json --network-rtt 0   # vllm bench serve --save-detailed
"""


# The probe's share of --budget; the fit that follows has the rest (it stops refining at the budget's end).
PROBE_SHARE = 0.8


def _budget_s(text: str) -> float:
    from tokenpath.config.units import parse_duration_s

    words = text.strip()
    if words.endswith("m") and not words.endswith(("ms", "nm")):
        words = words[:-1] + "min"  # "5m": minutes
    budget = parse_duration_s(words, "--budget")
    if not 1 <= budget <= 24 * 3600:
        raise UserError(f"--budget: {quoted(text)} must be from 1 s to 24 h, e.g. '5m' or '90 s'")
    return budget


def _whole_numbers(text: str, flag: str, example: str) -> tuple[int, ...]:
    try:
        numbers = tuple(sorted({int(word) for word in text.replace(",", " ").split()}))
    except ValueError:
        numbers = ()
    if not numbers or numbers[0] < 1:
        raise UserError(f"{flag}: {quoted(text)} must be whole numbers >= 1, e.g. {flag} '{example}'")
    return numbers


@calibrate_app.command("engine",
                       help="Fit the model's assumptions to a running server, from outside." + CALIBRATE_ENGINE_EXAMPLE)
@scenario_flags(omit=("model", *WORKLOAD_FLAGS))  # --model is the name the server serves; the probe sets the workload
def calibrate_engine(
    scenario: str | None = typer.Argument(None, help="the scenario whose deployment the server runs (.toml or "
                                                        "catalog name); default 'typical'"),
    base_url: str | None = typer.Option(None, "--base-url", help="the server, e.g. http://127.0.0.1:8000"),
    model: str | None = typer.Option(None, "--model", help="the model name the server serves"),
    out: str = typer.Option("engine-calibration.toml", "--out", help="calibration file to write"),
    budget: str = typer.Option("5m", "--budget", help="the whole command's time: the probe (its server check and "
                                                      "every phase) has 80%, the fit the rest"),
    from_results: list[str] | None = typer.Option(
        None, "--from", help="fit from measurements already made instead of probing (repeatable): tokenpath bench "
                             "results, `vllm bench serve --save-result --save-detailed` results, SGLang "
                             "`bench_serving --output-details` lines, guidellm reports (.json)"),
    prompt_lens: str = typer.Option("128 512 2048", "--prompt-lens", help="prompt lengths of the single requests"),
    concurrencies: str = typer.Option("1 4 16 64", "--concurrencies", help="concurrencies of the closed loops"),
    output_len: int = typer.Option(64, "--output-len", min=2, max=4096, help="output tokens per request of the loops"),
    endpoint: str = typer.Option("completions", "--endpoint", help="completions or chat"),
    api_key_env: str | None = typer.Option(None, "--api-key-env", help="environment variable holding the API key"),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="tokenizer.json for the prompts (default: Tekken)"),
    *, flags: dict[str, Any],
) -> None:
    import os
    import time
    from pathlib import Path

    from rich.table import Table

    from tokenpath.calibrate.engine_file import calibration_document, write_calibration
    from tokenpath.calibrate.fit import fit_engine
    from tokenpath.calibrate.formats import read_measured
    from tokenpath.calibrate.probe import run_probe
    from tokenpath.compute.model import load_model
    from tokenpath.config.assumptions import format_value
    from tokenpath.sim.scenario import build_scenario

    files.check_writable(out, "--out")
    budget_s = _budget_s(budget)  # with --from too: a typo is an error there as well, not ignored
    table, source, base_dir = scenario_table(scenario, flags)
    loaded = build_scenario(table, source, base_dir)
    if from_results:
        for path in from_results:
            files.check_path(path, "--from")
        template = loaded.chat_template_tokens()
        measured = [m for path in from_results for m in read_measured(path, chat_template_tokens=template)]
        skipped: list[str] = []
        server = {"results": list(from_results)}
    else:
        from tokenpath.bench import Target, preflight

        if not base_url or not model:
            raise UserError("calibrate engine: give --base-url and --model of the server to probe, or --from "
                            "bench results files")
        if endpoint not in ("completions", "chat"):
            raise UserError(f"--endpoint: {quoted(endpoint)} must be completions or chat")
        check_tokenizer(tokenizer, "--tokenizer")
        api_key = None
        if api_key_env is not None:
            api_key = os.environ.get(api_key_env)
            if not api_key:
                raise UserError(f"--api-key-env: the environment variable {quoted(api_key_env)} is not set or empty")
        target = Target(base_url, model, endpoint, api_key)  # type: ignore[arg-type]
        start = time.monotonic()  # the budget holds from here: the preflight and every phase share it
        preflight(target, min(10.0, budget_s))
        folder = Path(out).with_suffix("").with_name(Path(out).stem + "-probe")
        progress = progress_bar(TextColumn("probing {task.description}"), BarColumn(), TimeElapsedColumn(),
                                TextColumn("of {task.fields[budget]:.0f} s"))
        with progress:
            task = progress.add_task("", total=budget_s, budget=budget_s)

            def advance(phase: str, done: int, failed: int) -> None:
                progress.update(task, description=phase, completed=min(budget_s, time.monotonic() - start))

            measured, skipped = run_probe(
                table, source, base_dir, target, folder, PROBE_SHARE * budget_s - (time.monotonic() - start),
                load_model(loaded.model_source()).max_context,
                _whole_numbers(prompt_lens, "--prompt-lens", "128 512 2048"),
                _whole_numbers(concurrencies, "--concurrencies", "1 4 16 64"), output_len, tokenizer, advance)
        server = {"base_url": base_url, "model": model, "endpoint": endpoint, "probe_results": str(folder)}
        probe_s = time.monotonic() - start
    fit_start = time.monotonic()
    fit = fit_engine(loaded, measured, deadline_s=None if from_results else start + budget_s)
    fit_s = time.monotonic() - fit_start
    write_calibration(out, calibration_document(fit, measured, skipped, loaded, server))

    result = Table(title=f"fitted to {len(measured)} phases: error {fit.rms_before:.1%} -> {fit.rms_after:.1%} "
                         "(rms of log)")
    for column in ("assumption", "before", "fitted", "+/-"):
        result.add_column(column, justify="right" if column != "assumption" else "left")
    for name in fit.names:
        result.add_row(name, format_value(name, fit.start[name]), format_value(name, fit.values[name]),
                       format_value(name, fit.uncertainty[name]))
    console.print(result)
    for line in fit.warnings:
        err_console.print(f"[yellow]warning:[/yellow] {line}", highlight=False, soft_wrap=True)
    if skipped:
        console.print(f"budget spent: skipped {', '.join(skipped)}")
    if not from_results:
        console.print(f"probed for {probe_s:.0f} s of the {budget_s:.0f} s budget, fitted in {fit_s:.0f} s",
                      highlight=False)
    console.print(f"wrote {out}; use it with \\[assumptions] calibration = {out!r} in a scenario")
