"""The flags that change a scenario, the same on every command that takes one (vLLM bench's names where
they exist), and their translation into dotted scenario keys; checks of file flags several commands take."""

from __future__ import annotations

import functools
import inspect
import math
import operator
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any, get_args

import typer

from tokenpath.config import files
from tokenpath.config.errors import UserError, quoted
from tokenpath.engine.profiles import choices
from tokenpath.sim.scenario import Scenario

# The scenario key each flag sets as it is; --fabric, --request-rate and the length flags are translated
# (scenario_overrides).
SCENARIO_KEYS = {
    "model": "model.name", "chip": "deployment.chip", "chips": "deployment.chips", "tp": "deployment.tp",
    "pp": "deployment.pp", "placement": "deployment.placement", "cuda_graphs": "engine.cuda_graphs",
    "precision": "model.precision", "burstiness": "workload.arrival.burstiness",
    "max_concurrency": "workload.max_concurrency", "num_requests": "workload.num_requests", "seed": "seed",
    "warmup_requests": "workload.warmup_requests",
    "max_num_seqs": "engine.max_num_seqs", "max_num_batched_tokens": "engine.max_num_batched_tokens",
    "chunked_prefill": "engine.chunked_prefill", "gpu_memory_utilization": "engine.gpu_memory_utilization",
    "scheduler": "engine.scheduler", "num_scheduler_steps": "engine.num_scheduler_steps",
    "kv_cache_dtype": "model.kv_cache_precision", "network_rtt": "delivery.network_rtt",
    "detokenize": "delivery.detokenize", "api_servers": "deployment.api_servers",
    "prefix_caching": "engine.prefix_caching",
    "routing": "deployment.routing",
}
# The key whose default each flag's help shows: the flags above, and those translated into one key.
DEFAULT_KEYS = {
    **SCENARIO_KEYS, "request_rate": "workload.arrival.rate",
    **{f"{which}_{part}": f"workload.{which}.{field}" for which in ("input", "output")
       for part, field in (("len", "mean"), ("sd", "sd"), ("dist", "kind"))},
}
# Engine limits whose default the scheduler profile sets.
PROFILE_DEFAULTS = ("max_num_seqs", "cuda_graphs")


@functools.cache
def _scenario_defaults() -> dict[str, Any]:
    return Scenario().model_dump(mode="json")


def default_of(key: str) -> Any:
    """The value at dotted scenario `key` when a scenario leaves it unset (its field's default), as a
    scenario file writes it: durations as strings with a unit ("20 ms")."""
    return functools.reduce(operator.getitem, key.split("."), _scenario_defaults())


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def default_help(flag: str) -> str:
    """What a flag's help says of its default: its key's field default, or for a limit the scheduler
    profile sets, the profile's (with the default profile's value)."""
    shown = _shown(default_of(DEFAULT_KEYS[flag]))
    if flag in PROFILE_DEFAULTS:
        return f"scenario default: the scheduler profile's; {shown} under {default_of('engine.scheduler')}"
    return f"scenario default: {shown}"


def _rate(value: str) -> float | str:
    if value.strip().lower() in ("inf", "infinity"):
        return "inf"
    try:
        rate = float(value)
    except ValueError:
        raise UserError(f"--request-rate: {quoted(value)} is not a number; give requests/s (e.g. 12.5) "
                        "or 'inf'") from None
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


def _length(table: dict[str, Any], which: str, mean: float | None, sd: float | None,
            dist: str | None = None) -> dict[str, Any]:
    """--input-len/--input-sd/--input-dist replace the length table, keeping its min and max. Without
    --input-dist: the table's own kind (lognormal, uniform; else normal) with the given mean and sd, the
    table's where a flag leaves one out, or fixed when sd is 0. A uniform draw has the given mean and sd
    (its range is mean +- sqrt(3) sd);
    sharegpt takes neither."""
    flag = f"--{which}-dist"
    if dist is not None and dist not in LENGTH_DISTRIBUTIONS:
        raise UserError(f"{flag}: unknown {quoted(dist)}; use one of {', '.join(LENGTH_DISTRIBUTIONS)}")
    if dist == "sharegpt":
        if mean is not None or sd is not None:
            raise UserError(f"{flag} sharegpt: its lengths are ShareGPT's; drop --{which}-len and --{which}-sd")
        return {"kind": "sharegpt"}
    current = _table(_table(table, "workload"), which)
    kind = current.get("kind")
    mean = mean if mean is not None else current.get("mean", current.get("value", default_of(f"workload.{which}.mean")))
    if sd is None and kind == "uniform" and _number(current.get("mean")) and _number(current.get("range_ratio")):
        sd = current["mean"] * current["range_ratio"] / math.sqrt(3.0)  # the uniform's own spread, not the default's
    sd = sd if sd is not None else current.get("sd", 0.0 if kind == "fixed" else default_of(f"workload.{which}.sd"))
    if dist is None:  # the scenario's own kind where it has a mean and sd; --{which}-dist changes it
        dist = "fixed" if sd == 0 else kind if kind in ("lognormal", "uniform") else "normal"
    bounds = {key: current[key] for key in ("min", "max") if key in current}
    return {**_length_table(which, mean, sd, dist), **bounds}


def _length_table(which: str, mean: Any, sd: Any, dist: str) -> dict[str, Any]:
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
            raise UserError(f"--{which}-sd: a uniform draw of mean {mean:g} has an sd below "
                            f"{mean / math.sqrt(3.0):.4g} (its range must stay above 0); lower --{which}-sd")
        return {"kind": "uniform", "mean": float(mean), "range_ratio": ratio}
    return {"kind": dist, "mean": float(mean), "sd": float(sd)}


# Flags a trace replay overrides: its rows give every arrival time and token count.
_TRACE_OVERRIDES = {
    "request_rate": ("--request-rate", "arrival times"), "burstiness": ("--burstiness", "arrival times"),
    "input_len": ("--input-len", "input token counts"), "input_sd": ("--input-sd", "input token counts"),
    "output_len": ("--output-len", "output token counts"), "output_sd": ("--output-sd", "output token counts"),
    "input_dist": ("--input-dist", "input token counts"), "output_dist": ("--output-dist", "output token counts"),
}


# ... and the tables of the workload whose `--set` it would override alike.
_TRACE_TABLES = {"workload.arrival": "arrival times", "workload.input": "input token counts",
                 "workload.output": "output token counts"}


def _refuse_trace_overrides(table: dict[str, Any], flags: dict[str, Any], sets: Iterable[str] = ()) -> None:
    """A flag or `--set` key that a scenario's trace would silently override is an error, not a setting
    shown as used. (A scenario's own generated workload, which a trace set on top of it replaces, is not.)"""
    trace = _table(table, "workload").get("trace")
    if trace is None:
        return
    path = trace.get("path") if isinstance(trace, dict) else None
    which = f"the trace {quoted(path)}" if isinstance(path, str) else "a trace"
    overridden = [(name, what) for flag, (name, what) in _TRACE_OVERRIDES.items() if flags.get(flag) is not None]
    overridden += [(f"--set {key}", what) for key in sets for prefix, what in _TRACE_TABLES.items()
                   if key == prefix or key.startswith(prefix + ".")]
    if overridden:
        name, what = overridden[0]
        raise UserError(f"{name}: the scenario replays {which} (workload.trace), whose {what} replace it; "
                        f"drop {name}, or use a scenario without a trace (workload.trace.time_scale speeds "
                        "a trace up or slows it down)")


def scenario_overrides(table: dict[str, Any], sets: Iterable[str] = (), **flags: Any) -> dict[str, Any]:
    _refuse_trace_overrides(table, flags, sets)
    out = {path: flags[flag] for flag, path in SCENARIO_KEYS.items() if flags.get(flag) is not None}
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


# Every flag that changes a scenario, vLLM bench's names where it has them: each command that takes a
# scenario takes them all (less the ones `scenario_flags` is told to omit), applied by `scenario_table`.
def _flag(kind: Any, name: str, help: str, **option: Any) -> Any:
    return Annotated[kind | None, typer.Option(name, help=help, **option)]


def _with_defaults(flags: dict[str, Any]) -> dict[str, Any]:
    """`flags` with each help ending in its default (`default_help`), read from the scenario's fields so
    that it never goes stale."""
    for name in DEFAULT_KEYS:
        option, default = get_args(flags[name])[1], default_help(name)
        said = option.help  # a closing remark in parentheses takes the default in it
        option.help = f"{said[:-1]}; {default})" if said.endswith(")") else f"{said} ({default})"
    return flags


SCENARIO_FLAGS: dict[str, Any] = _with_defaults({
    "model": _flag(str, "--model", "catalog model name or path to a HF config.json"),
    "chip": _flag(str, "--chip", "catalog chip name, as `tokenpath chips` lists them"),
    "chips": _flag(int, "--chips", "total chips; chips / (tp * pp) data-parallel replicas"),
    "tp": _flag(int, "--tp", "tensor-parallel size"),
    "pp": _flag(int, "--pp", "pipeline-parallel stages"),
    "fabric": _flag(str, "--fabric", "fabric preset name (see `tokenpath fabric --list`) or topology .toml"),
    "placement": _flag(str, "--placement", "packed or spread: where each group sits on the fabric"),
    "precision": _flag(str, "--precision", "weight precision: bf16, fp8 or fp4"),
    "cuda_graphs": _flag(str, "--cuda-graphs", "steps that replay a CUDA graph: all, decode or none, eager as "
                                               "--enforce-eager"),
    "max_num_seqs": _flag(int, "--max-num-seqs", "most sequences in one engine step"),
    "max_num_batched_tokens": _flag(int, "--max-num-batched-tokens", "most tokens in one engine step"),
    "chunked_prefill": _flag(bool, "--enable-chunked-prefill/--no-enable-chunked-prefill",
                             "split long prompts over steps within the token budget", show_default=False),
    "prefix_caching": _flag(bool, "--enable-prefix-caching/--no-enable-prefix-caching",
                            "reuse the KV cache of shared prompt prefixes, as vLLM V1 does", show_default=False),
    "routing": _flag(str, "--routing", "requests over replicas: round_robin, least_outstanding, least_kv_load, "
                                       "prefix_aware or session_affinity"),
    "gpu_memory_utilization": _flag(float, "--gpu-memory-utilization",
                                    "share of memory the engine may use, as its own flag means it (SGLang: weights "
                                    "and KV pool; TensorRT-LLM: of what weights and a step leave); unset: its own"),
    "scheduler": _flag(str, "--scheduler", f"engine scheduler profile: {choices()}"),
    "num_scheduler_steps": _flag(int, "--num-scheduler-steps", "decode steps per scheduler call where prompts run in "
                                                               "steps of their own (vLLM V0 multi-step)"),
    "kv_cache_dtype": _flag(str, "--kv-cache-dtype", "KV-cache precision: auto (the engine's own choice), bf16 or "
                                                     "fp8"),
    "network_rtt": _flag(str, "--network-rtt", "client round trip, e.g. '20 ms' (a bare number is seconds)"),
    "detokenize": _flag(str, "--detokenize", "the process that detokenizes: engine (its steps wait), api-server or "
                                            "detokenizer (its own); unset: the engine profile's"),
    "api_servers": _flag(int, "--api-servers", "API-server processes of the deployment; unset: the engine profile's"),
    "input_len": _flag(float, "--input-len", "mean input tokens"),
    "input_sd": _flag(float, "--input-sd", "sd of input tokens, 0 for a fixed length"),
    "input_dist": _flag(str, "--input-dist", "input length distribution: fixed, normal, lognormal, uniform (mean "
                                             "and sd from --input-len and --input-sd) or sharegpt: ShareGPT V3 as "
                                             "benchmark clients sample it"),
    "output_len": _flag(float, "--output-len", "mean output tokens"),
    "output_sd": _flag(float, "--output-sd", "sd of output tokens, 0 for a fixed length"),
    "output_dist": _flag(str, "--output-dist", "output length distribution, as --input-dist"),
    "request_rate": _flag(str, "--request-rate", "requests/s, or 'inf' to send all at t=0"),
    "burstiness": _flag(float, "--burstiness", "gamma shape of arrival gaps; 1 = Poisson"),
    "max_concurrency": _flag(int, "--max-concurrency", "cap on outstanding requests"),
    "num_requests": _flag(int, "--num-requests", "requests to send"),
    "warmup_requests": _flag(int, "--warmup-requests", "the first requests sent, left out of every metric"),
    "seed": _flag(int, "--seed", "random seed"),
    "sets": _flag(list[str], "--set", "set any scenario key by its dotted path, the value as TOML (a bare word is "
                                      "a string; a duration without a unit is seconds: write '20 ms'), e.g. "
                                      "--set deployment.tp=4 --set delivery.detokenize=detokenizer; repeatable; the "
                                      "named flags apply after it", metavar="KEY=VALUE"),
})
# The flags of the requests a workload generates: arrivals and prompts, then output lengths.
ARRIVAL_AND_PROMPT_FLAGS = ("input_len", "input_sd", "input_dist", "request_rate", "burstiness", "max_concurrency",
                            "num_requests", "warmup_requests")
WORKLOAD_FLAGS = (*ARRIVAL_AND_PROMPT_FLAGS, "output_len", "output_sd", "output_dist")


def scenario_flags(omit: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a typer command the scenario flags (less `omit`: a name the command uses for something else,
    or a part of the scenario it replaces); it receives them as one dict, `flags`, for `scenario_table`."""
    shared = {name: kind for name, kind in SCENARIO_FLAGS.items() if name not in omit}

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(command, eval_str=True)
        assert not shared.keys() & own.parameters.keys(), f"{command.__name__} declares a scenario flag itself"

        @functools.wraps(command)
        def with_flags(**given: Any) -> Any:
            flags = {name: given.pop(name) for name in shared}
            return command(**given, flags=flags)

        parameters = [p for p in own.parameters.values() if p.name != "flags"]
        parameters += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind)
                       for name, kind in shared.items()]
        with_flags.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
        with_flags.__annotations__ = {p.name: p.annotation for p in parameters}
        return with_flags

    return decorate


JsonOut = Annotated[str | None, typer.Option("--json", help="write the result schema to PATH, or '-' for stdout")]


def scenario_table(scenario_ref: str | None, flags: dict[str, Any]):
    """The raw table of a scenario with its changes applied in order: the file, then `--set`, then the
    named flags (so `--tp 2 --set deployment.tp=4` runs TP=2). Returns (table, source, base_dir)."""
    from tokenpath.sim.overrides import apply_overrides, parse_assignments
    from tokenpath.sim.scenario import read_scenario_table, set_path

    named = dict(flags)
    overrides = parse_assignments(named.pop("sets", None))
    table, source, base_dir = read_scenario_table(scenario_ref)
    apply_overrides(table, overrides)
    for dotted, value in scenario_overrides(table, overrides, **named).items():
        set_path(table, dotted, value)
    return table, source, base_dir


def load_with_flags(scenario_ref: str | None, flags: dict[str, Any]):
    """The scenario `scenario_ref` names, with the flags applied, built and checked."""
    from tokenpath.sim.scenario import build_scenario

    return build_scenario(*scenario_table(scenario_ref, flags))


def check_tokenizer(path: str | None, flag: str) -> None:
    """A --tokenizer that names a file must be a regular file (a name shipped with a library passes)."""
    if path is None:
        return
    files.check_path(path, flag)
    if files.exists(path) and not files.is_file(path) and not Path(path).is_dir():
        raise UserError(f"{flag} {files.shown(path)}: not a regular file (a device, pipe or socket); give a "
                        "tokenizer file")
