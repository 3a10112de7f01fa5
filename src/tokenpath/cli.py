"""The `tokenpath` command line."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tokenpath import files
from tokenpath.errors import UserError, quoted

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
        raise UserError(f"--request-rate: {quoted(value)} is not a number; give requests/s (e.g. 12.5) or 'inf'") from None
    if not math.isfinite(rate) or rate <= 0:
        raise UserError(f"--request-rate: {quoted(value)} must be > 0 requests/s, or 'inf' to send everything at t=0")
    return rate


def _table(table: Any, key: str) -> dict[str, Any]:
    """`table[key]` when both are tables, else an empty one (validation reports what is wrong)."""
    value = table.get(key) if isinstance(table, dict) else None
    return value if isinstance(value, dict) else {}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


LENGTH_DISTRIBUTIONS = ("fixed", "normal", "lognormal", "uniform", "sharegpt")


def _length(table: dict[str, Any], which: str, mean: Optional[float], sd: Optional[float],
            dist: Optional[str] = None) -> dict[str, Any]:
    """--input-len/--input-sd/--input-dist replace the length table. Without --input-dist: normal(mean,
    sd), or fixed when sd is 0. A uniform draw has the given mean and sd (its range is mean +- sqrt(3) sd);
    sharegpt takes neither."""
    flag = f"--{which}-dist"
    if dist is not None and dist not in LENGTH_DISTRIBUTIONS:
        raise UserError(f"{flag}: unknown {quoted(dist)}; use one of {', '.join(LENGTH_DISTRIBUTIONS)}")
    if dist == "sharegpt":
        if mean is not None or sd is not None:
            raise UserError(f"{flag} sharegpt: its lengths are ShareGPT's; drop --{which}-len and --{which}-sd")
        return {"kind": "sharegpt"}
    current = _table(_table(table, "workload"), which)
    defaults = {"input": (550.0, 150.0), "output": (150.0, 80.0)}[which]
    mean = mean if mean is not None else current.get("mean", current.get("value", defaults[0]))
    sd = sd if sd is not None else current.get("sd", 0.0 if current.get("kind") == "fixed" else defaults[1])
    if dist is None:
        dist = "fixed" if sd == 0 else "normal"
    if dist == "fixed":
        if not _number(mean) or not math.isfinite(mean) or mean < 1 or mean != int(mean):
            raise UserError(f"--{which}-len: a fixed length must be a whole number of tokens >= 1, got {quoted(mean)}")
        return {"kind": "fixed", "value": int(mean)}
    if not _number(mean) or not math.isfinite(mean) or mean < 1:
        raise UserError(f"--{which}-len: a mean of at least 1 token, got {quoted(mean)}")
    if not _number(sd) or not math.isfinite(sd) or sd < 0:
        raise UserError(f"--{which}-sd: a standard deviation of 0 tokens or more, got {quoted(sd)}")
    if dist == "uniform":
        ratio = math.sqrt(3.0) * sd / mean
        if ratio >= 1:
            raise UserError(f"--{which}-sd: a uniform draw of mean {mean:g} has an sd below {mean / math.sqrt(3.0):.4g} "
                            f"(its range must stay above 0); lower --{which}-sd")
        return {"kind": "uniform", "mean": float(mean), "range_ratio": ratio}
    return {"kind": dist, "mean": float(mean), "sd": float(sd)}


# Flags a trace replay overrides: its rows give every arrival time and token count.
_TRACE_OVERRIDES = {
    "request_rate": ("--request-rate", "arrival times"), "burstiness": ("--burstiness", "arrival times"),
    "input_len": ("--input-len", "input token counts"), "input_sd": ("--input-sd", "input token counts"),
    "output_len": ("--output-len", "output token counts"), "output_sd": ("--output-sd", "output token counts"),
    "input_dist": ("--input-dist", "input token counts"), "output_dist": ("--output-dist", "output token counts"),
}


def _refuse_trace_overrides(table: dict[str, Any], flags: dict[str, Any]) -> None:
    """A flag that a scenario's trace would silently override is an error, not a setting shown as used."""
    trace = _table(table, "workload").get("trace")
    if trace is None:
        return
    path = trace.get("path") if isinstance(trace, dict) else None
    which = f"the trace {quoted(path)}" if isinstance(path, str) else "a trace"
    for flag, (name, what) in _TRACE_OVERRIDES.items():
        if flags.get(flag) is not None:
            raise UserError(f"{name}: the scenario replays {which} (workload.trace), whose {what} replace it; "
                            f"drop {name}, or use a scenario without a trace (workload.trace.time_scale speeds "
                            "a trace up or slows it down)")


def _overrides(table: dict[str, Any], **flags: Any) -> dict[str, Any]:
    direct = {
        "model": "model.name", "chip": "deployment.chip", "chips": "deployment.chips", "tp": "deployment.tp",
        "pp": "deployment.pp", "placement": "deployment.placement", "cuda_graphs": "engine.cuda_graphs",
        "precision": "model.precision", "burstiness": "workload.arrival.burstiness",
        "max_concurrency": "workload.max_concurrency", "num_requests": "workload.num_requests", "seed": "seed",
        "warmup_requests": "workload.warmup_requests",
        "max_num_seqs": "engine.max_num_seqs", "max_num_batched_tokens": "engine.max_num_batched_tokens",
        "chunked_prefill": "engine.chunked_prefill", "gpu_memory_utilization": "engine.gpu_memory_utilization",
        "scheduler": "engine.scheduler", "num_scheduler_steps": "engine.num_scheduler_steps",
        "kv_cache_dtype": "model.kv_cache_precision", "network_rtt": "delivery.network_rtt",
        "detokenize": "delivery.detokenize",
    }
    _refuse_trace_overrides(table, flags)
    out = {path: flags[flag] for flag, path in direct.items() if flags.get(flag) is not None}
    if flags.get("fabric") is not None:  # a preset name, or a topology file read from here
        fabric = flags["fabric"]
        if fabric.endswith(".toml"):
            files.check_path(fabric, "--fabric")
            fabric = str(Path(fabric).resolve())
        out["deployment.fabric"] = fabric
    if flags.get("request_rate") is not None:
        out["workload.arrival.rate"] = _rate(flags["request_rate"])
    for which in ("input", "output"):
        mean, sd, dist = flags.get(f"{which}_len"), flags.get(f"{which}_sd"), flags.get(f"{which}_dist")
        if mean is not None or sd is not None or dist is not None:
            out[f"workload.{which}"] = _length(table, which, mean, sd, dist)
    return out


# The workload flags, shared by simulate and bench: vLLM bench's names.
InputLen = Annotated[Optional[float], typer.Option("--input-len", help="mean input tokens")]
InputSd = Annotated[Optional[float], typer.Option("--input-sd", help="sd of input tokens (0 = fixed)")]
OutputLen = Annotated[Optional[float], typer.Option("--output-len", help="mean output tokens")]
OutputSd = Annotated[Optional[float], typer.Option("--output-sd", help="sd of output tokens (0 = fixed)")]
InputDist = Annotated[Optional[str], typer.Option(
    "--input-dist", help="input length distribution: fixed, normal, lognormal, uniform (mean and sd from --input-len "
                         "and --input-sd) or sharegpt (ShareGPT V3 as benchmark clients sample it)")]
OutputDist = Annotated[Optional[str], typer.Option(
    "--output-dist", help="output length distribution, as --input-dist")]
RequestRate = Annotated[Optional[str], typer.Option("--request-rate", help="requests/s, or 'inf' (all at t=0)")]
Burstiness = Annotated[Optional[float], typer.Option("--burstiness", help="gamma shape of arrival gaps; 1 = Poisson")]
MaxConcurrency = Annotated[Optional[int], typer.Option("--max-concurrency", help="cap on outstanding requests")]
NumRequests = Annotated[Optional[int], typer.Option("--num-requests", help="requests to send")]
WarmupRequests = Annotated[Optional[int], typer.Option(
    "--warmup-requests", help="the first requests sent, left out of every metric (scenario default: 0)")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="random seed")]
JsonOut = Annotated[Optional[str], typer.Option("--json", help="write the result schema to PATH, or '-' for stdout")]


def _write_json(document: dict[str, Any], target: str) -> None:
    text = json.dumps(document, indent=2) + "\n"
    if target == "-":
        sys.stdout.write(text)
        return
    try:
        Path(target).write_text(text, encoding="utf-8")
    except OSError as error:  # checked before the run (files.check_writable), so a change since
        raise UserError(f"--json {files.shown(target)}: cannot write it ({error.strerror}); the result was not "
                        "saved: choose another path") from None


def _simulate_and_report(scenario_ref: Optional[str], json_out: Optional[str], flags: dict[str, Any],
                         show_explain: bool = False, workers: Optional[int] = None) -> None:
    from tokenpath.report.simulation import describe, result_document
    from tokenpath.pipeline import prepare, simulate
    from tokenpath.scenario import build_scenario, read_scenario_table, set_path

    if workers is not None and workers < 1:
        raise UserError(f"--workers: {workers} must be at least 1 (1 simulates every replica in this process)")
    if json_out is not None:
        files.check_writable(json_out, "--json")
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
        _write_json(document, json_out)


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
    max_num_seqs: Optional[int] = typer.Option(
        None, "--max-num-seqs", help="most sequences in one engine step (scenario default: 1024)"),
    max_num_batched_tokens: Optional[int] = typer.Option(
        None, "--max-num-batched-tokens", help="most tokens in one engine step (scenario default: 8192)"),
    chunked_prefill: Optional[bool] = typer.Option(
        None, "--enable-chunked-prefill/--no-enable-chunked-prefill",
        help="split long prompts over steps within the token budget (scenario default: on)", show_default=False),
    gpu_memory_utilization: Optional[float] = typer.Option(
        None, "--gpu-memory-utilization", help="share of HBM the engine may use (scenario default: 0.9)"),
    scheduler: Optional[str] = typer.Option(
        None, "--scheduler", help="engine scheduler profile: vllm-v1 (default), prefill-first (vLLM V0, SGLang) "
                                  "or trtllm"),
    num_scheduler_steps: Optional[int] = typer.Option(
        None, "--num-scheduler-steps", help="prefill-first: decode steps per scheduler call (vLLM V0 multi-step; "
                                            "default 1)"),
    kv_cache_dtype: Optional[str] = typer.Option(
        None, "--kv-cache-dtype", help="KV-cache precision: auto (the engine's default), bf16, fp8"),
    network_rtt: Optional[str] = typer.Option(
        None, "--network-rtt", help="client round trip, with a unit: '20 ms' (scenario default: 20 ms)"),
    detokenize: Optional[str] = typer.Option(
        None, "--detokenize", help="inline (blocks the next step) or async (scenario default: inline)"),
    input_len: InputLen = None,
    input_sd: InputSd = None,
    input_dist: InputDist = None,
    output_len: OutputLen = None,
    output_sd: OutputSd = None,
    output_dist: OutputDist = None,
    request_rate: RequestRate = None,
    burstiness: Burstiness = None,
    max_concurrency: MaxConcurrency = None,
    num_requests: NumRequests = None,
    warmup_requests: WarmupRequests = None,
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

    if json_out is not None:
        files.check_writable(json_out, "--json")
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
    network_delay: bool = typer.Option(
        True, "--network-delay/--no-network-delay",
        help="delay what is received and sent by the scenario's network (half its RTT plus the bytes at its "
             "bandwidth), as simulate does; off to measure the server alone over loopback"),
    header_timeout: Optional[float] = typer.Option(
        None, "--header-timeout", min=0.001,
        help="seconds a connection has to send a complete request head (default 20)"),
    body_timeout: Optional[float] = typer.Option(
        None, "--body-timeout", min=0.001, help="seconds a request has to send its whole body (default 60)"),
    idle_timeout: Optional[float] = typer.Option(
        None, "--idle-timeout", min=0.001, help="seconds an idle keep-alive connection stays open (default 5)"),
    max_connections: Optional[int] = typer.Option(
        None, "--max-connections", min=1,
        help="open connections at most (default: the open-file limit less 64); when full, the longest idle "
             "or slowest-to-send one is closed to make room, else the new one gets a 503"),
) -> None:
    from tokenpath.scenario import load_scenario
    from tokenpath.serve import ServeOptions, make_app
    from tokenpath.serve.app import SERVER, run
    from tokenpath.serve.connections import ConnectionLimits

    check_listen(host, port)
    if send_log is not None:
        files.check_writable(send_log, "--send-log")
    check_tokenizer(tokenizer, "--tokenizer")
    given = {"header_timeout_s": header_timeout, "body_timeout_s": body_timeout, "idle_timeout_s": idle_timeout,
             "max_connections": max_connections}
    limits = ConnectionLimits(**{key: value for key, value in given.items() if value is not None})
    options = ServeOptions(api_key, served_model_name, tokenizer, send_log, limits=limits, network_delay=network_delay)
    application = make_app(load_scenario(scenario), options)
    name = application[SERVER].model_name
    try:
        run(application, host, port,
            on_ready=lambda bound: err_console.print(f"serving {name} on http://{host}:{bound}/v1 (Ctrl-C stops)"))
    except OSError as error:  # the address was taken between check_listen and now
        raise UserError(f"--host/--port: cannot listen on {host}:{port} ({error.strerror or error}); "
                        "choose another --port") from None


def check_listen(host: str, port: int) -> None:
    """Refuse, before loading anything, an address serve cannot listen on: a port out of range, a host
    that is not an address of this machine, a port in use or reserved."""
    import socket

    if not 0 <= port <= 65535:
        raise UserError(f"--port: {port} is not a TCP port; use 1 to 65535 (0: any free port)")
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError, ValueError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise UserError(f"--host: cannot listen on {quoted(host)} ({reason}); give an address of this machine, "
                        "e.g. 127.0.0.1") from None
    for family, kind, protocol, _, address in addresses:
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds
            try:
                probe.bind(address)
            except OSError as error:
                raise UserError(f"--host/--port: cannot listen on {host}:{port} ({error.strerror}); choose another "
                                "--port, or stop what holds it") from None


def check_tokenizer(path: Optional[str], flag: str) -> None:
    """A --tokenizer that names a file must be a regular file (a name shipped with a library passes)."""
    if path is None:
        return
    files.check_path(path, flag)
    if files.exists(path) and not files.is_file(path) and not Path(path).is_dir():
        raise UserError(f"{flag} {files.shown(path)}: not a regular file (a device, pipe or socket); give a "
                        "tokenizer file")


def _batch_sizes(given: str, extra: list[str]) -> list[int]:
    """--batch-sizes takes "1,8,32" or "1 8 32" (the values after the flag)."""
    words = given.replace(",", " ").split() + extra
    try:
        sizes = sorted({int(word) for word in words})
    except ValueError:
        raise UserError(f"--batch-sizes: {quoted(' '.join(words))} must be whole numbers, e.g. --batch-sizes 1 8 32 128 256") from None
    if not sizes or sizes[0] < 1:
        raise UserError(f"--batch-sizes: {quoted(' '.join(words))} must be batch sizes >= 1, e.g. --batch-sizes 1 8 32 128 256")
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
    files.check_writable(out, "--out")
    check_tokenizer(tokenizer, "--tokenizer")
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


# A command-line usage error quotes the user's words; this much of it is shown.
_USAGE_ERROR_CHARS = 300


def _fail(message: str) -> None:
    """Print `message` as one `error:` line (control characters escaped, no markup) and exit 2."""
    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)
    err_console.print(f"[red]error:[/red] {escape(line)}", highlight=False, soft_wrap=True)
    sys.exit(2)


def main() -> None:
    """Entry point: a user's mistake is one line on stderr and exit status 2, never a traceback.

    Usage errors (an unknown flag, a value of the wrong type) are that one line too, instead of
    typer's boxed usage text.
    """
    try:
        status = app(prog_name="tokenpath", standalone_mode=False)
    except UserError as error:
        _fail(str(error))
    except typer.TyperException as error:  # click's usage errors
        if type(error).__name__ == "NoArgsIsHelpError":  # the help is already printed
            sys.exit(2)
        message = error.format_message()
        if len(message) > _USAGE_ERROR_CHARS:
            message = message[:_USAGE_ERROR_CHARS] + "..."
        context = getattr(error, "ctx", None)
        hint = f"; see `{context.command_path} --help`" if context is not None else ""
        _fail(message + hint)
    except typer.Abort:  # end of input at a prompt
        sys.exit(1)
    except MemoryError:
        _fail("out of memory: the run is too large for this machine; lower workload.num_requests or the "
              "deployment's size")
    sys.exit(status if isinstance(status, int) else 0)


from tokenpath.cli_bench import register as _register_bench  # noqa: E402  (bench, report, compare)

_register_bench(app)

from tokenpath.cli_fabric import register as _register_fabric  # noqa: E402  (fabric)

_register_fabric(app)
