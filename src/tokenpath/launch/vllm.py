"""vLLM: `vllm serve`, one process per pool with its replicas as data-parallel engines (an MoE model's
replicas a process each, server_per_replica); a prefill and a decode pool joined by vLLM's NixlConnector
(--kv-transfer-config)."""

from __future__ import annotations

import json

from tokenpath.launch.command import Command, Settings
from tokenpath.launch.flags import programs
from tokenpath.launch.hosts import HEAD_ADDR, NODE_RANK, Hosts
from tokenpath.launch.plan import Plan, Role, nccl_nvls_default, weight_flags

# The engine's name: --engine's value, its table in flags.toml and Profile.launched_with.
NAME = __name__.rsplit(".", 1)[-1]
PROGRAM = programs()[NAME]["command"]
# The engine vLLM 0.34 runs: its V1 engine, the only one left (Profile.engine names it so).
RUNS = "vLLM V1"
# Disaggregated prefill: both pools run the NixlConnector, as vLLM's guide starts its prefiller and
# decoder, and a proxy sends each request to a prefill instance, then to a decode instance.
NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
NIXL_DOCS = "https://docs.vllm.ai/en/stable/features/nixl_connector_usage.html"
# A deployment over several hosts: each runs the same command with its own node rank; host 0 runs the API
# servers and the others `--headless`, their engine processes joining host 0's torch.distributed group
# at --master-addr (vllm/entrypoints/cli/serve.py, run_headless, in 0.34.0; --nnodes from 0.12.0).
# Its routing: the API servers send each request to the data-parallel engine with the fewest requests
# waiting and running (vllm/v1/engine/core_client.py, DPLBAsyncMPClient), no flag choosing another.
VLLM_ROUTING = "least_outstanding"


def server_per_replica(plan: Plan) -> bool:
    """Whether each replica needs a `vllm serve` of its own: an MoE model's replicas, which one server's
    data-parallel engines would run as one, their expert layers "a (DP x TP) sized tensor parallel group"
    stepping together (docs/serving/data_parallel_deployment.md), where the scenario's replicas are apart
    (its form of that server is attention data-parallel over all the chips: `deployment.attention_dp`). A
    disaggregated pool stays one server (a note says so)."""
    return plan.moe and not plan.disaggregated and plan.roles[0].replicas > 1


def command(plan: Plan, role: Role, replicas: int, settings: Settings, host: str | None = None,
            port: int | None = None, layout: Hosts | None = None, head: bool = True, rank: str = NODE_RANK,
            head_addr: str = HEAD_ADDR) -> Command:
    """`vllm serve` for `replicas` replicas of `role` in one process; over the hosts of `layout`, the
    command of host 0 (`head`) or of the others, their rank and host 0's address as `rank` and
    `head_addr` give them (a script's NODE_RANK and HEAD_ADDR, or a pod's LeaderWorkerSet variables)."""
    s = plan.scenario
    dep, eng = s.deployment, s.engine
    cmd = Command(list(PROGRAM), [plan.checkpoint.hf_id])
    settings.map("model.name", "<model>")
    # Attention data-parallel is vLLM's data-parallel engines of tp = 1, one per chip, sharing their expert
    # layers (Profile.attention_dp_models): a replica's tp chips are that many engines.
    ranks = dep.tp if dep.attention_dp else 1
    cmd.add(settings, "deployment.tp", "--tensor-parallel-size", dep.tp // ranks)
    cmd.add(settings, "deployment.pp", "--pipeline-parallel-size", dep.pp)
    cmd.add(settings, "deployment.chips", "--data-parallel-size", replicas * ranks)
    if layout is not None and not layout.one:
        cmd.add(settings, "deployment.chips", "--nnodes", layout.count)
        cmd.add(None, None, "--node-rank", 0 if head else rank)
        cmd.add(None, None, "--master-addr", head_addr)
        if not head:
            cmd.add(None, None, "--headless")
    if dep.expert_parallel:
        cmd.add(settings, "deployment.expert_parallel", "--enable-expert-parallel")
    else:
        settings.map("deployment.expert_parallel", "(off: vLLM's default)")
    if dep.moe_all_to_all:
        cmd.add(settings, "deployment.moe_all_to_all", "--all2all-backend", "deepep_low_latency")
        settings.note("deployment.moe_all_to_all", "vLLM runs one DeepEP mode a server: low-latency here, where the "
                                                  "simulation runs prompt steps with the high-throughput kernels")
    else:
        settings.map("deployment.moe_all_to_all", "(off: vLLM's default --all2all-backend allgather_reducescatter)")
    if replicas > 1 and plan.moe:
        # docs/serving/data_parallel_deployment.md: an MoE model's data-parallel ranks align their forward passes,
        # "the expert layers form a (DP x TP) sized tensor parallel group" (with expert parallel, the scenario
        # is refused: sim/deployment.py)
        settings.note("deployment.chips", f"the {replicas * ranks} data-parallel engines of one vLLM server step "
                                          "together for their expert layers, tensor-parallel over all its chips; "
                                          f"the simulation steps its {replicas} replicas apart, each with every "
                                          "expert over its own chips, as a server per replica runs them")
    if dep.attention_dp:
        settings.map("deployment.attention_dp", f"--tensor-parallel-size 1 --data-parallel-size {ranks}")
    else:
        settings.map("deployment.attention_dp", "(off)")
    # vLLM 0.34's `fp8` reads fp8 checkpoints only and names fp8_per_tensor for bf16 weights
    weight_flags(plan, cmd, settings, "vLLM", "fp8_per_tensor")
    # bf16 written out: `auto` takes a quantized checkpoint's own KV scheme (a ModelOpt FP8 checkpoint's
    # kv_cache_quant_algo: fp8; resolve_kv_cache_dtype_string, vllm/utils/torch_utils.py), not what was simulated
    kv_dtype = "fp8" if plan.kv_precision == "fp8" else "bfloat16"
    cmd.add(settings, "model.kv_cache_precision", "--kv-cache-dtype", kv_dtype)
    if plan.context_tokens is not None:
        # vLLM refuses to start where its KV cache cannot hold one request of its max_model_len, the model's
        # context unless told (check_enough_kv_cache_memory, vllm/v1/core/kv_cache_planning.py:196 in 0.34.0;
        # only `--max-model-len auto` fits it to the cache)
        cmd.add(None, None, "--max-model-len", plan.context_tokens)
        settings.note("model.name", f"--max-model-len {plan.context_tokens}: one replica's KV cache holds a request "
                                    f"of at most {plan.context_tokens:,} tokens, under the model's context, and vLLM "
                                    "refuses to start with a max_model_len its cache cannot hold")
    cmd.add(settings, "engine.max_num_seqs", "--max-num-seqs", eng.max_num_seqs)
    cmd.add(settings, "engine.max_num_batched_tokens", "--max-num-batched-tokens", eng.max_num_batched_tokens)
    cmd.add(settings, "engine.block_size", "--block-size", eng.block_size)
    cmd.add(settings, "engine.chunked_prefill",
            "--enable-chunked-prefill" if eng.chunked_prefill else "--no-enable-chunked-prefill")
    if eng.gpu_memory_utilization is not None:
        cmd.add(settings, "engine.gpu_memory_utilization", "--gpu-memory-utilization", eng.gpu_memory_utilization)
    else:
        settings.map("engine.gpu_memory_utilization", "(vLLM's own for its release, as simulated: 0.9, 0.92 from "
                                                      "0.20.0, the memory measured free less a margin from 0.34.0 on "
                                                      "CUDA and ROCm: engine/memory_share.py)")
    cmd.add(settings, "engine.prefix_caching",
            "--enable-prefix-caching" if eng.prefix_caching else "--no-enable-prefix-caching")
    cmd.add(settings, "engine.host_overlap", "--async-scheduling" if plan.host_overlap else "--no-async-scheduling")
    _cuda_graphs(plan, cmd, settings)
    nccl_nvls_default(plan, settings)
    _speculative(plan, cmd, settings)
    if head:  # (a headless host runs none: vLLM refuses --api-server-count with --headless)
        api_servers = max(1, role.api_servers * replicas // role.replicas)  # this process's share of the pool's
        cmd.add(settings, "deployment.api_servers", "--api-server-count", api_servers)
    cmd.add(settings, "delivery.stream_interval", "--stream-interval", s.delivery.stream_interval)
    if role.name != "server":
        nixl = json.dumps(NIXL, separators=(",", ":"))
        cmd.add(settings, "deployment.prefill_replicas", "--kv-transfer-config", nixl)
    if host is not None:
        cmd.add(None, None, "--host", host)
    if port is not None:
        cmd.add(None, None, "--port", port)
    _notes(plan, settings, replicas)
    return cmd


def _cuda_graphs(plan: Plan, cmd: Command, settings: Settings) -> None:
    eng = plan.scenario.engine
    if eng.cuda_graphs == "none":
        cmd.add(settings, "engine.cuda_graphs", "--enforce-eager")
    elif eng.cuda_graphs == "decode":
        cmd.add(settings, "engine.cuda_graphs", "--compilation-config",
                json.dumps({"cudagraph_mode": "FULL_DECODE_ONLY"}, separators=(",", ":")))
    else:
        settings.map("engine.cuda_graphs", "(vLLM's default: graphs for decode and mixed steps)")
    if eng.cuda_graph_max_tokens is not None and eng.cuda_graphs != "none":
        cmd.add(settings, "engine.cuda_graph_max_tokens", "--max-cudagraph-capture-size", eng.cuda_graph_max_tokens)
    else:
        settings.map("engine.cuda_graph_max_tokens", "(vLLM's own limit)")


def _speculative(plan: Plan, cmd: Command, settings: Settings) -> None:
    """--speculative-config: the drafter and its tokens a step, with the draft's checkpoint where the
    scenario names one; an EAGLE head's checkpoint is the user's to add."""
    speculative = plan.scenario.engine.speculative
    if speculative is None:
        settings.map("engine.speculative", "(none)")
        return
    # The scenario's method names are vLLM's SpeculativeConfig.method values (vllm/config/speculative.py);
    # "mtp" is its name for a model's own MTP layers, the per-model ones (deepseek_mtp, ...) deprecated to it.
    config: dict[str, object] = {"method": speculative.method,
                                 "num_speculative_tokens": speculative.num_speculative_tokens}
    if speculative.method in ("eagle", "eagle3"):
        settings.note("engine.speculative", f"add the {speculative.method.upper()} head's checkpoint (one trained for "
                                            f"{plan.checkpoint.hf_id}) as \"model\" in --speculative-config: vLLM "
                                            "refuses an EAGLE method without it")
    elif speculative.method == "draft_model" and plan.draft is not None:
        config["model"] = plan.draft.hf_id
    elif speculative.method == "draft_model":
        settings.note("engine.speculative", f"the draft model {speculative.draft_model} has no Hugging Face id: add "
                                            "its checkpoint as \"model\" in --speculative-config")
    cmd.add(settings, "engine.speculative", "--speculative-config", json.dumps(config, separators=(",", ":")))


def _notes(plan: Plan, settings: Settings, replicas: int) -> None:
    s = plan.scenario
    eng, dep = s.engine, s.deployment
    settings.map("engine.cuda_graph_padding", "(vLLM pads a batch up to the next size it captured)")
    settings.map("engine.prefill_cuda_graphs", "(vLLM's prompt steps replay graphs as engine.cuda_graphs says)")
    if eng.eager_host is None:
        settings.map("engine.eager_host", "(the engine's own launches)")
    else:
        settings.note("engine.eager_host", "no flag: vLLM compiles its model, and how it launches the kernels "
                                           "is not a setting")
    if plan.profile.engine != RUNS:
        settings.note("engine.scheduler", f"vLLM 0.34 runs its V1 engine only; the scenario models "
                                          f"{plan.profile.engine}")
    if eng.kv_admission == "reserve":
        settings.note("engine.kv_admission", "vLLM takes KV blocks as sequences grow; it cannot reserve a request's "
                                             "whole cache at admission")
    else:
        settings.map("engine.kv_admission", "(vLLM's own)")
    if eng.num_scheduler_steps > 1:
        settings.note("engine.num_scheduler_steps", "vLLM 0.34 has no multi-step scheduling (removed with V0)")
    else:
        settings.map("engine.num_scheduler_steps", "(one step per scheduler call)")
    if eng.prefills_alone:
        settings.note("engine.mixed_chunk", "the scenario runs prompts in steps of their own; vLLM puts prompt "
                                            "chunks and decodes in the same steps")
    else:
        settings.map("engine.mixed_chunk", "(vLLM mixes prompts and decodes)")
    if server_per_replica(plan):
        settings.note("deployment.routing", f"each replica is a vllm serve of its own: put a load balancer "
                                             f"({dep.routing}) in front of them, or launch with --engine k8s")
    elif dep.routing == VLLM_ROUTING or replicas == 1:
        settings.map("deployment.routing", "(vLLM's least-loaded engine, or one engine)")
    else:
        settings.note("deployment.routing", f"vLLM's API servers send each request to the engine with the fewest "
                                             f"outstanding requests; no flag gives {dep.routing}")
    if plan.detokenizes_in == "api-server":
        settings.map("delivery.detokenize", "(vLLM's API servers)")
    else:
        settings.note("delivery.detokenize", f"vLLM detokenizes in its API servers; the scenario in the "
                                             f"{plan.detokenizes_in} process")
    if plan.disaggregated:
        settings.note("deployment.prefill_replicas", "requests need a proxy that sends each to a prefill instance, "
                                                     f"then to a decode one (NixlConnector guide: {NIXL_DOCS})")
    else:
        settings.map("deployment.prefill_replicas", "(none: every replica prefills and decodes)")
