"""TensorRT-LLM: `trtllm-serve` (PyTorch backend), one server per replica, with the settings it takes only
from YAML in an --extra_llm_api_options file; disaggregated pools as context and generation servers behind
`trtllm-serve disaggregated -c` (docs/source/features/disagg-serving.md)."""

from __future__ import annotations

from typing import Any

from tokenpath.compute.chip import load_chip
from tokenpath.launch.command import Command, Settings
from tokenpath.launch.flags import programs
from tokenpath.launch.plan import Plan, Role, expert_precision_setting, nccl_nvls_default

# The engine's name: --engine's value, its table in flags.toml and Profile.launched_with.
NAME = __name__.rsplit(".", 1)[-1]
PROGRAM = programs()[NAME]["command"]
DISAGGREGATED = programs()[f"{NAME}-disaggregated"]["command"]
BACKEND = "pytorch"
# The KV transfer between context and generation servers; the guide names NIXL its default.
TRANSCEIVER = "NIXL"
# kv_admission -> the capacity scheduler's policy (llm_args.py, CapacitySchedulerPolicy).
ADMISSION = {"reserve": "GUARANTEED_NO_EVICT", "on_demand": "MAX_UTILIZATION"}
# The guide's context servers run without the overlap scheduler, which they do not support.
CONTEXT_OVERLAP = False
# The scenario's drafters -> speculative_config.decoding_type of the PyTorch backend (llm_args.py): "Eagle"
# runs an EAGLE-3 head (EagleDecodingConfig.spec_dec_mode); the draft-model type is left out (below).
DECODING_TYPE = {"mtp": "MTP", "eagle3": "Eagle", "ngram": "NGram"}


def command(plan: Plan, settings: Settings, options_path: str, host: str | None = None,
            port: int | None = None) -> Command:
    """`trtllm-serve` for one replica, its YAML at `options_path`."""
    s = plan.scenario
    dep, eng = s.deployment, s.engine
    cmd = Command(list(PROGRAM), [plan.checkpoint.hf_id])
    settings.map("model.name", "<model>")
    cmd.add(None, None, "--backend", BACKEND)
    if eng.eager_host is False:
        settings.note("engine.eager_host", "a TensorRT engine launches from C++: build one (trtllm-build) and serve "
                                           "it with --backend tensorrt; this command runs the PyTorch backend")
    else:
        settings.map("engine.eager_host", "--backend")
    cmd.add(settings, "deployment.tp", "--tp_size", dep.tp)
    cmd.add(settings, "deployment.pp", "--pp_size", dep.pp)
    if dep.expert_parallel:
        cmd.add(settings, "deployment.expert_parallel", "--ep_size", dep.tp)
    else:
        settings.map("deployment.expert_parallel", "(TensorRT-LLM's default split of the experts)")
    if dep.moe_all_to_all:
        settings.note("deployment.moe_all_to_all", "TensorRT-LLM picks its all-to-all itself: MNNVL where the NVLink "
                                                  "domain spans nodes, DeepEP with TRTLLM_CAN_USE_DEEP_EP=1 in its "
                                                  "environment (WideEPMoE.select_alltoall_method_type)")
    else:
        settings.map("deployment.moe_all_to_all", "(off: no all-to-all, as on one NVLink domain)")
    cmd.add(settings, "engine.max_num_seqs", "--max_batch_size", eng.max_num_seqs)
    cmd.add(settings, "engine.max_num_batched_tokens", "--max_num_tokens", eng.max_num_batched_tokens)
    nccl_nvls_default(plan, settings)
    cmd.add(None, None, "--extra_llm_api_options", options_path)
    if host is not None:
        cmd.add(None, None, "--host", host)
    if port is not None:
        cmd.add(None, None, "--port", port)
    return cmd


def extra_options(plan: Plan, role: Role, settings: Settings) -> dict[str, Any]:
    """The --extra_llm_api_options YAML of a `role` server, as a table."""
    s = plan.scenario
    eng = s.engine
    kv_cache = {"dtype": "fp8" if plan.kv_precision == "fp8" else "auto", "enable_block_reuse": eng.prefix_caching,
                "tokens_per_block": eng.block_size}
    if eng.gpu_memory_utilization is not None:
        kv_cache["free_gpu_memory_fraction"] = eng.gpu_memory_utilization
    for setting in ("model.kv_cache_precision", "engine.prefix_caching", "engine.block_size",
                    "engine.gpu_memory_utilization"):
        settings.map(setting, "kv_cache_config")
    if eng.cuda_graphs == "none":
        graphs = None
        settings.map("engine.cuda_graph_max_tokens", "(no graphs)")
        settings.map("engine.cuda_graph_padding", "(no graphs)")
    else:  # decode batches up to the limit replay a graph, padded up to the nearest size captured or, unpadded,
        # only at the sizes captured (engine/cuda_graphs.py); where every size replays one, up to the largest
        # batch the server forms (CudaGraphConfig.max_batch_size takes a number, not null)
        limit = eng.graph_max_tokens(load_chip(s.deployment.chip).hbm_bytes, s.deployment.tp)
        graphs = {"max_batch_size": eng.max_num_seqs if limit is None else limit,
                  "enable_padding": eng.cuda_graph_padding}
        settings.map("engine.cuda_graph_max_tokens", "cuda_graph_config.max_batch_size")
        settings.map("engine.cuda_graph_padding", "cuda_graph_config.enable_padding")
        if eng.cuda_graphs == "all":
            settings.note("engine.cuda_graphs", "TensorRT-LLM captures decode-only batches; steps with prompts run "
                                                "without a graph (its C++ and fused ops launch them)")
    settings.map("engine.cuda_graphs", "cuda_graph_config")
    settings.map("engine.prefill_cuda_graphs", "(TensorRT-LLM runs a step holding a prompt eagerly)")
    overlap = plan.host_overlap
    if role.name == "prefill" and overlap:
        overlap = CONTEXT_OVERLAP
        settings.note("engine.host_overlap", "the context servers run without the overlap scheduler, which "
                                             "TensorRT-LLM does not support for them")
    settings.map("engine.host_overlap", "disable_overlap_scheduler")
    settings.map("engine.chunked_prefill", "enable_chunked_prefill")
    settings.map("engine.kv_admission", "scheduler_config.capacity_scheduler_policy")
    settings.map("delivery.stream_interval", "stream_interval")
    settings.map("deployment.attention_dp", "enable_attention_dp")
    options: dict[str, Any] = {
        "enable_attention_dp": s.deployment.attention_dp,
        "enable_chunked_prefill": eng.chunked_prefill,
        "kv_cache_config": kv_cache,
        "cuda_graph_config": graphs,
        "disable_overlap_scheduler": not overlap,
        "scheduler_config": {"capacity_scheduler_policy": ADMISSION[eng.kv_admission]},
        "stream_interval": s.delivery.stream_interval,
    }
    speculative = _speculative(plan, settings)
    if speculative is not None:
        options["speculative_config"] = speculative
    if role.name != "server":
        options["cache_transceiver_config"] = {"backend": TRANSCEIVER}
        settings.map("deployment.prefill_replicas", "cache_transceiver_config")
    else:
        settings.map("deployment.prefill_replicas", "(none: every replica prefills and decodes)")
    _notes(plan, settings)
    return options


def disaggregated_config(host: str, port: int, context_urls: list[str], generation_urls: list[str]) -> dict[str, Any]:
    """The file `trtllm-serve disaggregated -c` reads: where it listens and its servers."""
    return {"hostname": host, "port": port, "backend": BACKEND,
            "context_servers": {"num_instances": len(context_urls), "urls": context_urls},
            "generation_servers": {"num_instances": len(generation_urls), "urls": generation_urls}}


def _speculative(plan: Plan, settings: Settings) -> dict[str, Any] | None:
    """speculative_config: the decoding type and its k drafts a step (MTPDecodingConfig counts them in
    num_nextn_predict_layers), or None with a note where no decoding type serves the drafter as written."""
    speculative = plan.scenario.engine.speculative
    if speculative is None:
        settings.map("engine.speculative", "(none)")
        return None
    k = speculative.num_speculative_tokens
    if speculative.method == "eagle":
        settings.note("engine.speculative", "not written: TensorRT-LLM's PyTorch backend runs EAGLE-3 heads only "
                                            "(decoding_type Eagle); simulate method = \"eagle3\" to launch one")
        return None
    if speculative.method == "draft_model":
        draft = plan.draft.hf_id if plan.draft is not None else f"the checkpoint of {speculative.draft_model}"
        settings.note("engine.speculative", "not written: TensorRT-LLM's releases spell the draft-target decoding "
                                            "type differently (DraftTarget, Draft_Target); add speculative_config "
                                            f"with that of yours, max_draft_len: {k} and speculative_model_dir: "
                                            f"{draft}")
        return None
    settings.map("engine.speculative", "speculative_config")
    config: dict[str, Any] = {"decoding_type": DECODING_TYPE[speculative.method]}
    if speculative.method == "mtp":
        config["num_nextn_predict_layers"] = k
    else:
        config["max_draft_len"] = k
    if speculative.method == "eagle3":
        settings.note("engine.speculative", "add speculative_model_dir with the EAGLE3 head's checkpoint (one "
                                            f"trained for {plan.checkpoint.hf_id}) to speculative_config: "
                                            "TensorRT-LLM refuses Eagle without it")
    return config


def _precision(plan: Plan, settings: Settings) -> None:
    wanted = plan.scenario.model.precision
    how = plan.weights()
    if how == "as-stored":
        settings.map("model.precision", "(the checkpoint's own)")
    elif how == "given":
        settings.note("model.precision", f"served as the --model-id checkpoint stores it: use one stored in {wanted}")
    else:
        settings.note("model.precision", f"{plan.checkpoint.hf_id} is stored in {plan.checkpoint.stored()}; "
                                          f"TensorRT-LLM's PyTorch backend takes the quantization from the "
                                          f"checkpoint: pass --model-id with a {wanted} (ModelOpt) checkpoint")
    expert_precision_setting(plan, settings)


def _notes(plan: Plan, settings: Settings) -> None:
    s = plan.scenario
    eng, dep = s.engine, s.deployment
    _precision(plan, settings)
    settings.note("engine.gpu_memory_utilization", "for TensorRT-LLM a share of the memory left after the weights "
                                                   "and a profiling step (kv_cache_config.free_gpu_memory_fraction, "
                                                   "0.9 when unset)")
    if eng.prefills_alone:
        settings.note("engine.mixed_chunk", "the scenario runs prompts in steps of their own; TensorRT-LLM puts "
                                            "contexts and generations in the same steps")
    else:
        settings.map("engine.mixed_chunk", "(TensorRT-LLM mixes contexts and generations)")
    if eng.num_scheduler_steps > 1:
        settings.note("engine.num_scheduler_steps", "TensorRT-LLM has no multi-step scheduling")
    else:
        settings.map("engine.num_scheduler_steps", "(one step per scheduler call)")
    servers = sum(role.replicas for role in plan.roles)
    if dep.api_servers is None or dep.api_servers == servers:
        settings.map("deployment.api_servers", "(one OpenAI server per trtllm-serve)")
    else:
        settings.note("deployment.api_servers", f"trtllm-serve runs one OpenAI server per instance ({servers} here); "
                                                f"the scenario has {dep.api_servers}")
    if plan.detokenizes_in == "api-server":
        settings.map("delivery.detokenize", "(trtllm-serve's OpenAI server)")
    else:
        settings.note("delivery.detokenize", f"trtllm-serve detokenizes in its OpenAI server; the scenario in the "
                                             f"{plan.detokenizes_in} process")
    if plan.disaggregated:
        settings.map("deployment.routing", "(trtllm-serve disaggregated: round robin)")
    elif dep.replicas == 1:
        settings.map("deployment.routing", "(one replica)")
    else:
        settings.note("deployment.routing", f"each replica is a trtllm-serve of its own: put a load balancer "
                                             f"({dep.routing}) in front of them, or launch with --engine k8s")
