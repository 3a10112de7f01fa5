"""--explain: the roofline of one steady-state step, op by op, so a user sees why a number is what it is."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.table import Table

from tokenpath.config.units import format_bytes, format_duration
from tokenpath.engine.host_time import eager_host_paid
from tokenpath.engine.profiles import DEFAULT_PROFILE, PROFILES
from tokenpath.sim.simulate import Simulation


def steady_step(sim: Simulation) -> int:
    """Index (in the first replica's trace) of a typical step: among the steps in the middle half of
    the run, the one with the median number of tokens."""
    trace = sim.traces[0]
    start = trace.step_start_ns
    low, high = np.percentile(start, [25, 75])
    middle = np.flatnonzero((start >= low) & (start <= high))
    if len(middle) == 0:  # two steps (or so few that none lies inside the middle half): any of them
        middle = np.arange(len(start))
    order = middle[np.argsort(trace.step_tokens[middle], kind="stable")]
    return int(order[len(order) // 2])


def op_assumptions(name: str, gemm: bool, bound: str, weight_gemms: bool = False) -> list[str]:
    """The registry's assumptions (`tokenpath assumptions`) that set an op's time where it is bound;
    `weight_gemms`: among its kernels are GEMMs by weights (their fixed time is gemm_fixed_s)."""
    fixed = ["kernel_fixed_s", *(["gemm_fixed_s"] if weight_gemms else [])]
    if bound == "fixed":
        return fixed
    if name == "attention":
        rate = (["serving_gemm_fraction", "attention_query_overhead_pairs"] if bound == "compute"
                else ["hbm_bw_efficiency"])
        return rate + fixed
    if gemm:
        rate = ["serving_gemm_fraction"] if bound == "compute" else ["hbm_bw_efficiency"]
        if name == "moe_experts" and bound == "compute":
            rate += ["expert_gemm_half_width", "block_scaled_expert_gemm_ceiling"]
        return [*rate, "gemm_overlap_norm", *(["logit_bytes"] if name == "lm_head" else []), *fixed]
    return ["hbm_bw_efficiency", "activation_bytes", *fixed]


def traffic_assumptions(part: str, algorithm: str, decode_only: bool, rccl: bool = False) -> list[str]:
    """The assumptions behind a step's collectives: the runtime's latencies (NCCL's; `rccl`: RCCL's, on the
    chips it runs on), the links' achieved bandwidth."""
    if part == "tp_all_reduce" and algorithm in ("nvls", "nvls_tree"):
        names = ["nvls_latency_s", "nvls_link_efficiency"]
        return names + (["nvls_tree_net_step_latency_s", "scaleout_bw_efficiency"] if algorithm == "nvls_tree" else [])
    names = (["rccl_base_latency_s", "xgmi_hop_latency_s"] if rccl else ["base_latency_s", "nvlink_hop_latency_s"])
    names.append("scaleup_bw_efficiency")
    if part == "ep_all_to_all" and decode_only:
        names.append("low_latency_all_to_all_s")
    return names + ["activation_bytes"]


def host_assumptions(scheduler: str, scheduled: bool = True) -> list[str]:
    """The assumptions behind a step's engine host time under `scheduler`; `scheduled`: the step called
    the scheduler (not one inside a multi-step window after its first)."""
    profile = PROFILES[scheduler]
    parts = [profile.host_window_assumption] if scheduled else []
    if profile.host_step_assumption is not None:
        parts.append(profile.host_step_assumption)
    return [*parts, "host_per_sequence_s"]


DELIVERY_ASSUMPTIONS = ["host_link_latency_s", "host_link_bw_Bps", "detokenize_per_token_s", "frame_per_event_s"]


def explain(sim: Simulation) -> dict[str, Any]:
    """The typical step's shape, each op's FLOPs, bytes, roofline time and bound, and the step's parts."""
    trace, deployment = sim.traces[0], sim.deployment
    i = steady_step(sim)
    shape = {
        "tokens": int(trace.step_tokens[i]), "sequences": int(trace.step_seqs[i]),
        "sampled": int(trace.step_logits[i]), "attention_pairs": int(trace.step_attn_pairs[i]),
        "kv_read_tokens": int(trace.step_kv_read_tokens[i]),
        "chunk_context_tokens": int(trace.step_chunk_context_tokens[i]),
    }
    compute = deployment.compute
    scheduled = bool(trace.step_scheduled[i])
    ops, launch_s, host_s = compute.step_parts_s(shape["tokens"], shape["sampled"], shape["attention_pairs"],
                                                 shape["kv_read_tokens"], shape["chunk_context_tokens"],
                                                 trace.step_traffic_ns[i] / 1e9, trace.step_ahead_ns[i] / 1e9,
                                                 scheduled)
    return {
        "step": i,
        "shape": shape,
        "ops": [{"op": op.name, "flops": op.flops, "bytes": op.bytes, "time_s": op.time_s, "bound": op.bound,
                 "assumptions": op_assumptions(op.name, linear.gemm, op.bound, linear.gemm_kernels > 0)}
                for op, linear in zip(ops, deployment.compute.ops)],
        "engine_host_s": host_s,  # the step's time its host adds (overlapped: what the GPU's work does not hide)
        "engine_host_assumptions": host_assumptions(sim.scenario.engine.scheduler, scheduled),
        # Beyond the kernels when no graph is replayed: launch gaps, and the wait on the host's launches.
        "launch_s": launch_s,
        "launch_includes_host": compute.host_eager_per_kernel_s > 0,
        "launch_assumptions": ["eager_kernel_launch_s"] + ([paid] if (paid := eager_host_paid(
            sim.scenario.engine.scheduler, sim.scenario.engine.eager_host)) else []),
        "compute_s": trace.step_compute_ns[i] / 1e9,
        "traffic_s": trace.step_traffic_ns[i] / 1e9,
        "decode_only": shape["sampled"] == shape["tokens"],
        "traffic_parts_s": deployment.costs.traffic_parts_s(shape["tokens"], shape["sampled"] == shape["tokens"]),
        "tp_all_reduce_algorithm": deployment.collectives.choose(
            "all_reduce", compute.allreduce_bytes(shape["tokens"]), deployment.placement.tp_groups()),
        "tp_all_reduce_protocol": deployment.collectives.protocol(
            "all_reduce", compute.allreduce_bytes(shape["tokens"]), deployment.placement.tp_groups()),
        "hidden_state_bytes": compute.allreduce_bytes(shape["tokens"]),
        "collectives_runtime": "rccl" if deployment.collectives.tuner.rccl else "nccl",  # fabric/tuner.py
        "host_blocking_s": trace.step_blocking_ns[i] / 1e9,
        # The roofline's roofs: sustained GEMM FLOP/s at the weights' precision, and HBM bandwidth.
        "roof": {"flops_per_s": compute.chip.effective_flops(compute.weight_precision),
                 "hbm_bytes_per_s": compute.chip.effective_hbm_bw_Bps},
        "assumptions_changed": sorted(sim.scenario.resolved_assumptions().values),
    }


TRAFFIC_LABELS = {"tp_all_reduce": "tensor-parallel all-reduces", "ep_all_to_all": "expert all-to-alls",
                  "pp_send_recv": "pipeline hand-offs"}


def explain_table(step: dict[str, Any], chip: str) -> Table:
    """The step as a table; each row names the assumptions behind it, a * on those the scenario changed
    (overridden or calibrated)."""
    shape = step["shape"]
    changed = set(step.get("assumptions_changed", ()))

    def named(names: list[str]) -> str:
        return ", ".join(f"{n}*" if n in changed else n for n in names)

    title = (f"One steady-state step on one {chip} (step {step['step']}): {shape['tokens']} tokens from "
             f"{shape['sequences']} sequences, {shape['sampled']} sampled, "
             f"{shape['kv_read_tokens']:,} KV positions read")
    if shape.get("chunk_context_tokens"):
        title += f", {shape['chunk_context_tokens']:,} of them cached before its prompt chunks"
    table = Table(title=title, title_justify="left",
                  caption="assumptions: `tokenpath assumptions` lists them"
                          + (", * changed by this scenario" if changed else ""),
                  caption_justify="left")
    for column in ("op", "GFLOP", "bytes", "time", "bound", "share", "assumptions"):
        table.add_column(column, justify="left" if column in ("op", "bound", "assumptions") else "right",
                         overflow="fold")
    total = step["compute_s"] + step["traffic_s"] + step["host_blocking_s"]
    for op in step["ops"]:
        table.add_row(op["op"], f"{op['flops'] / 1e9:,.1f}", format_bytes(op["bytes"]), format_duration(op["time_s"]),
                      op["bound"], f"{op['time_s'] / total:.1%}", named(op["assumptions"]))
    table.add_row("engine host time", "", "", format_duration(step["engine_host_s"]),
                  "host", f"{step['engine_host_s'] / total:.1%}",
                  named(step.get("engine_host_assumptions", host_assumptions(DEFAULT_PROFILE))))
    if step["launch_s"]:
        table.add_row("kernel launches (no CUDA graph)", "", "", format_duration(step["launch_s"]),
                      "host" if step["launch_includes_host"] else "fixed", f"{step['launch_s'] / total:.1%}",
                      named(step["launch_assumptions"]))
    for part, seconds in step["traffic_parts_s"].items():
        if seconds:
            how = {"tp_all_reduce": f"{step['tp_all_reduce_algorithm']} {step['tp_all_reduce_protocol']}, ",
                   "ep_all_to_all": "low-latency kernels, " if step["decode_only"] else ""}.get(part, "")
            table.add_row(f"{TRAFFIC_LABELS[part]} ({how}{format_bytes(step['hidden_state_bytes'])} hidden state)",
                          "", "", format_duration(seconds), "traffic", f"{seconds / total:.1%}",
                          named(traffic_assumptions(part, step["tp_all_reduce_algorithm"], step["decode_only"],
                                                    step.get("collectives_runtime") == "rccl")))
    table.add_row("host (copy ids, detokenize)", "", "", format_duration(step["host_blocking_s"]), "delivery",
                  f"{step['host_blocking_s'] / total:.1%}", named(DELIVERY_ASSUMPTIONS))
    table.add_row("step", "", "", format_duration(total), "", "100.0%", style="bold")
    return table
