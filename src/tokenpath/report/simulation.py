"""A simulation's scenario lines for people (its result document is sim/document.py's)."""

from __future__ import annotations

import math
from typing import Any

from tokenpath.config.units import format_bytes, format_duration, format_number
from tokenpath.engine.memory_share import SHARE_COVERS
from tokenpath.sim.document import assumptions_block, placement_name
from tokenpath.sim.front_end import api_servers
from tokenpath.sim.simulate import Simulation


def _experts(dep: Any) -> str:
    """Under expert parallel: the experts over each replica's chips, and whether all-to-alls carry their tokens."""
    if not dep.expert_parallel:
        return ""
    return ", EP" + (" (all-to-all)" if dep.moe_all_to_all else "")


def _replicas(dep: Any) -> str:
    if dep.prefill_replicas:
        return f"{dep.prefill_replicas} prefill + {dep.replicas - dep.prefill_replicas} decode replicas"
    if dep.replicas > 1:
        return f"{dep.replicas} replicas, {dep.routing.replace('_', '-')} routing"
    return f"{dep.replicas} replica(s)"


def _engine_line(engine: Any, compute: Any, acceptance: float | None = None) -> str:
    """The scheduler profile, its limits, how the host's time per step counts, and its speculative
    decoding with the workload's `acceptance`."""
    version = f" (version {engine.version})" if engine.version else ""
    # Under attention data-parallel each rank schedules with the limits of its own, but SGLang's ranks, which
    # divide the server's (EngineSpec.rank_limits)
    # (where the budget holds fewer decodes, vLLM V1 and TensorRT-LLM run that many a step: EngineSpec.decodes_a_step)
    capped = "" if engine.decodes_a_step() == engine.max_num_seqs else f" ({engine.decodes_a_step()} decoding a step)"
    seqs, tokens = f"max {engine.max_num_seqs} seqs{capped}, ", f"{engine.max_num_batched_tokens} tokens/step"
    if compute.attention_dp and not engine.profile.attention_dp_splits_budget:
        seqs, tokens = f"max {engine.max_num_seqs} seqs{capped} and ", f"{tokens} a rank"
    elif compute.attention_dp:
        rank_seqs, rank_tokens = engine.rank_limits(compute.tp)
        seqs = f"max {engine.max_num_seqs} seqs ({rank_seqs} a rank), "
        if rank_tokens is not None:
            tokens += f" ({rank_tokens} a rank)"
    line = (f"{engine.scheduler} scheduler{version}, {seqs}{tokens}, "
            f"chunked prefill {'on' if engine.chunked_prefill else 'off'}")
    if engine.num_scheduler_steps > 1:
        line += f", {engine.num_scheduler_steps}-step windows"
        host = f"{format_duration(compute.host_window_s)}/window + {format_duration(compute.host_step_s)}/step"
    else:
        host = f"{format_duration(compute.host_window_s + compute.host_step_s)}/step"
    line += (f"; {compute.graph_policy()}; host {host}, "
             f"{'overlapped' if compute.host_overlapped else 'in the step'}")
    if engine.speculative is not None:
        line += f"; {engine.speculative.describe(acceptance)}"
    return line


def describe(sim: Simulation) -> list[tuple[str, str]]:
    """Scenario lines for the report header."""
    s, d = sim.scenario, sim.deployment
    w = s.workload
    rate = w.arrival.rate
    arrivals = ("all at t=0" if math.isinf(rate)
                else f"{format_number(rate, 6)} req/s, burstiness {format_number(w.arrival.burstiness, 6)}")
    if w.trace:  # the trace's times replace the arrival table
        span_s = float(sim.requests.arrival_s[-1] - sim.requests.arrival_s[0])
        offered = f"{format_number((len(sim.requests) - 1) / span_s)} req/s on average" if span_s > 0 else "all at t=0"
        arrivals = f"as recorded in the trace (time_scale {format_number(w.trace.time_scale, 6)}), {offered}"
    if w.max_concurrency:
        arrivals += f", at most {w.max_concurrency} outstanding"
    if w.sessions:
        arrivals = f"sessions start at {arrivals}; {_sessions(w.sessions)}"
    lengths = (
        f"{w.trace.format} trace {w.trace.path}" if w.trace else
        f"input {_length(w.input)}, output {_length(w.output)}"
    )
    template = s.chat_template_tokens()
    if template:
        lengths += f", each message + {template} chat-template tokens"
    mean_in, mean_out = sim.requests.client_input_tokens.mean(), sim.requests.output_tokens.mean()
    return [
        ("model", _model_line(d, s.model.precision, s.kv_precision(d.model))),
        ("deployment", f"{s.deployment.chips}x {d.chip.name}, TP={s.deployment.tp}, PP={s.deployment.pp}"
                       f"{', attention data-parallel' if s.deployment.attention_dp else ''}"
                       f"{_experts(s.deployment)}, "
                       f"{_replicas(s.deployment)}"),
        ("fabric", f"{d.fabric_name}: {d.topology.kind}, {d.topology.hosts} hosts, {d.topology.diameter()} links "
                   f"across, {placement_name(s.deployment.placement)} placement, "
                   f"{d.collectives.algorithm} collectives"),
        ("KV cache", f"{d.kv_capacity_tokens:,} tokens per engine "
                     f"({format_bytes(d.compute.weight_bytes_per_chip)} of weights per chip; "
                     f"{'all' if d.memory_share == 1 else f'{d.memory_share:.3g}'} "
                     f"{SHARE_COVERS[s.engine.profile.memory_share_covers]}"
                     f"{', less a margin, as measured free' if s.engine.kv_margin(d.chip.generation) else ''})"),
        ("engine", _engine_line(d.engine, d.compute, w.draft_acceptance)
                   + f", prefix caching {'on' if s.engine.prefix_caching else 'off'}"),
        ("workload", f"{_request_count(w, len(sim.requests))}{_session_count(sim.requests)}, {lengths} "
                     f"({'means' if w.trace else 'drawn means'} {mean_in:.0f}/{mean_out:.0f})"),
        ("arrivals", arrivals),
        ("last mile", f"{_front_end_line(s, d)}, {s.delivery.stream_interval} token(s)/event, "
                      f"{format_duration(s.delivery.network_rtt)} RTT"),
        *([("application", _application_line(s.application))] if s.application is not None else []),
        ("assumptions", assumptions_line(assumptions_block(s))),
        ("seed", str(s.seed)),
    ]


def _request_count(workload: Any, replayed: int) -> str:
    """The requests run: a trace's rows, up to workload.num_requests of them; else num_requests."""
    if workload.trace is None or replayed == workload.num_requests:
        return f"{workload.num_requests:,} requests"
    return (f"{replayed:,} requests (every row of the trace; workload.num_requests takes at most "
            f"{workload.num_requests:,})")


def _application_line(app: Any) -> str:
    """The stages in order, each with what it waits for, a head start and a cache (docs/application.md)."""
    shown = []
    for stage in app.order():
        extra = [f"after {', '.join(stage.after)}"] if stage.after else []
        if stage.start == "ahead":
            extra.append(f"{format_duration(stage.ahead)} ahead")
        if stage.cache is not None:
            extra.append(f"{stage.cache.hit_rate:.0%} cached")
        if stage.prompt is not None:
            extra.append(f"+{stage.prompt.added_tokens:,} prompt tokens")
        if stage.loop is not None:
            turns = stage.loop.turns
            calls = f"{turns}" if isinstance(turns, int) else f"{turns.kind} {turns.value or turns.mean:g}"
            between = f", {' and '.join(stage.loop.between)} between" if stage.loop.between else ""
            extra.append(f"{calls} calls{between}")
        if stage.served is not None:
            extra.append(_served_words(stage.served))
        if stage.stream_into_next:
            extra.append("streamed into the next")
        shown.append(f"{stage.name} ({'; '.join(extra)})" if extra else stage.name)
    return ", ".join(shown)


def _served_words(served: Any) -> str:
    """Where a served stage runs, in a few words: "560M on the model's GPU", "335M on 16 CPU cores"."""
    from tokenpath.application.served import SHARED, shown_params

    where = ("the model's GPU" if served.on == SHARED else f"{served.cores} CPU cores" if served.on == "cpu"
             else f"a {served.on} of its own")
    return f"{served.model or shown_params(served.size)} on {where}"


def _front_end_line(scenario: Any, deployment: Any) -> str:
    """The front end in a few words: its API-server processes and where detokenization runs."""
    servers = api_servers(scenario)
    return (f"{servers} API server{'s' if servers > 1 else ''}, detokenizing in the "
            f"{deployment.front_end.detokenizes_in}")


def assumptions_line(block: dict[str, Any] | None) -> str:
    """A `scenario.assumptions` block in one line for people: which assumptions differ from the
    registry's (`tokenpath assumptions`), and where from."""
    from tokenpath.config.assumptions import format_value

    if not block:
        return "not recorded"

    def shown(name: str, value: Any) -> str:
        return f"{name} = {format_value(name, value) if isinstance(value, (int, float)) else value}"

    parts = []
    overridden = {**block.get("overridden", {}), **block.get("delivery_fields", {})}
    if overridden:
        parts.append("overridden " + ", ".join(shown(name, value) for name, value in overridden.items()))
    by_file: dict[str, list[str]] = {}
    for name, entry in block.get("calibrated", {}).items():
        by_file.setdefault(entry["file"], []).append(shown(name, entry["value"]))
    parts += [f"calibrated by {path}: {', '.join(names)}" for path, names in by_file.items()]
    if block.get("delivery_calibration"):
        parts.append(f"last mile calibrated by {block['delivery_calibration']}")
    return "; ".join(parts) or "the registry's defaults (`tokenpath assumptions`)"


def _model_line(d: Any, precision: str, kv_precision: str) -> str:
    """The model, its precisions (saying when weights run weight-only) and its sliding window."""
    line = f"{d.model.name}, {precision} weights"
    if d.chip.is_weight_only(precision):
        line += f" (weight-only: {d.chip.name} has no {precision} tensor cores, so they multiply at bf16)"
    experts = d.compute.expert_precision
    if experts is not None and experts != precision:
        line += f", {experts} routed experts"
        if d.chip.is_weight_only(experts):
            line += f" (weight-only on {d.chip.name})"
    line += f", {kv_precision} KV cache"
    if d.model.sliding_layers:
        line += (f", sliding window {d.model.sliding_window:,} on {d.model.sliding_layers} of "
                 f"{d.model.num_layers} layers")
    return line


def _session_count(requests: Any) -> str:
    if requests.sessions is None:
        return ""
    return f" (the turns of {int(requests.sessions.session[-1]) + 1:,} sessions; input is each new message)"


def _sessions(spec: Any) -> str:
    """How a multi-turn session goes: its turns, and the wait between them."""
    turns = f"{spec.turns} turns" if isinstance(spec.turns, int) else f"turns {_length(spec.turns)}"
    think = format_duration(spec.think_time)
    wait = f"{think} think time" if spec.think_distribution == "fixed" else f"think time exponential, mean {think}"
    return f"{turns} each, {wait} after each answer's last byte"


def _length(spec: Any) -> str:
    if spec.kind == "fixed":
        return f"{spec.value} fixed"
    if spec.kind in ("normal", "lognormal"):
        return f"{spec.kind} {format_number(spec.mean, 6)} (sd {format_number(spec.sd, 6)})"
    if spec.kind == "uniform":
        return f"uniform {format_number(spec.mean, 6)} +/- {spec.range_ratio:.0%}"
    if spec.kind == "sharegpt":
        return "ShareGPT"
    return f"empirical from {spec.path}"
