"""The flags that change a scenario (shared by simulate and bench, vLLM bench's names where they exist)
and their translation into dotted scenario keys; checks of file flags several commands take."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from tokenpath import files
from tokenpath.errors import UserError, quoted


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


def scenario_overrides(table: dict[str, Any], **flags: Any) -> dict[str, Any]:
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
        "detokenize": "delivery.detokenize", "prefix_caching": "engine.prefix_caching",
        "routing": "deployment.routing",
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
Set = Annotated[Optional[list[str]], typer.Option(
    "--set", metavar="KEY=VALUE",
    help="set any scenario key by its dotted path, the value as TOML (a bare word is a string), e.g. "
         "--set deployment.tp=4 --set delivery.detokenize=async; repeatable; the named flags apply after it")]
JsonOut = Annotated[Optional[str], typer.Option("--json", help="write the result schema to PATH, or '-' for stdout")]


def scenario_table(scenario_ref: Optional[str], sets: Optional[list[str]], flags: dict[str, Any]):
    """The raw table of a scenario with its changes applied in order: the file, then `--set`, then the
    named flags (so `--tp 2 --set deployment.tp=4` runs TP=2). Returns (table, source, base_dir)."""
    from tokenpath.overrides import apply_overrides, parse_assignments
    from tokenpath.scenario import read_scenario_table, set_path

    overrides = parse_assignments(sets)
    table, source, base_dir = read_scenario_table(scenario_ref)
    apply_overrides(table, overrides)
    for dotted, value in scenario_overrides(table, **flags).items():
        set_path(table, dotted, value)
    return table, source, base_dir


def check_tokenizer(path: Optional[str], flag: str) -> None:
    """A --tokenizer that names a file must be a regular file (a name shipped with a library passes)."""
    if path is None:
        return
    files.check_path(path, flag)
    if files.exists(path) and not files.is_file(path) and not Path(path).is_dir():
        raise UserError(f"{flag} {files.shown(path)}: not a regular file (a device, pipe or socket); give a "
                        "tokenizer file")
