"""Every constant that sets a prediction, in one registry: name, value, unit, source, and what guards it.

The registry holds the values; the modules that document them bind each to a constant of their own
(`KERNEL_FIXED_S = default("kernel_fixed_s")`), beside its full reasoning (compute/efficiency.py,
engine/host_time.py, fabric/collectives.py, ...). So the values sit on the ground floor, which imports
none of those modules, and a scenario can override any by name and every report can say which were
changed.

Overrides flow as data: a scenario's `[assumptions]` table becomes an `Assumptions` object. The compute
model is handed it (`assumptions.value(name)`); fabric and engine code read theirs through
`assumed(name, CONSTANT)` while the deployment is built inside `Assumptions.active()`. Either way a value
is read as objects are built, and they keep it, so a built deployment carries its assumptions into
forked workers and `serve` without any module global changing. Two scenarios in one process each see
their own values.
"""

from __future__ import annotations

import contextlib
import difflib
import math
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from tokenpath.config.errors import UserError, quoted
from tokenpath.config.units import MAX_BANDWIDTH_BPS, MAX_COST_S, MIN_BANDWIDTH_BPS, PLAIN_NUMBER

# None outside `Assumptions.active()` (every constant at its default), not a shared mutable {}
_ACTIVE: ContextVar[Mapping[str, float] | None] = ContextVar("tokenpath_assumptions", default=None)


def active_values() -> Mapping[str, float] | None:
    """The values of the `Assumptions.active()` block in force, if any."""
    return _ACTIVE.get()


def assumed(name: str, default: float) -> float:
    """The active run's value of assumption `name`; `default` (the module's constant) when not overridden."""
    values = _ACTIVE.get()
    return default if values is None else values.get(name, default)


@dataclass(frozen=True)
class Assumption:
    """One registered constant: its default `value`, in `unit` (SI), and `module.constant`, the constant
    bound to it where its full reasoning is written (`tokenpath assumptions --json`'s `defined_in`)."""

    name: str
    value: float
    module: str
    constant: str
    unit: str        # "s", "bytes", "B/s", or "1" for a plain number (a fraction, a ratio, a count)
    source: str
    guarded_by: str  # the tests and `tokenpath validate` groups that would fail if it drifted


_EFF, _HOST, _COLL, _BUILD = ("tokenpath.compute.efficiency", "tokenpath.engine.host_time",
                              "tokenpath.fabric.collectives", "tokenpath.fabric.build")
_TUNER, _TUNER_TESTS = "tokenpath.fabric.tuner", "tests/test_fabric_tuner.py, tests/test_fabric_hierarchy.py"
_DELIVERY = "tokenpath.delivery.spec"
_TEMPLATE, _TEMPLATE_TESTS = "tokenpath.engine.template_work", "tests/test_template_work.py"
_EXPERTS, _EXPERTS_TESTS = "tokenpath.engine.expert_kernels", "tests/test_expert_kernels.py"
_ROOFLINE_TESTS = "tests/test_compute_roofline.py"
_SEARCH, _SEARCH_TESTS = "tokenpath.compute.vector_search", "tests/test_retrieval.py"

REGISTRY: tuple[Assumption, ...] = (
    # -- compute: a step's kernels ----------------------------------------------------------------------
    Assumption("default_matmul_efficiency", 0.7, _EFF, "DEFAULT_MATMUL_EFFICIENCY", "1",
               "median measured/peak GEMM ratio of catalog/chips.toml, for chips measured at no precision",
               "tests/test_catalog.py; validate trtllm_offline (H200, B200 rows)"),
    Assumption("serving_gemm_fraction", 0.85, _EFF, "SERVING_GEMM_FRACTION", "1",
               "fitted on TensorRT-LLM's offline throughput rows (validate/fit.py, GROUP_PROCEDURES)",
               "validate trtllm_offline; " + _ROOFLINE_TESTS),
    Assumption("gemm_overlap_norm", 2.0, _EFF, "GEMM_OVERLAP_NORM", "1",
               "p of the p-norm of a GEMM's compute and memory times: set by hand on TensorRT-LLM's 12 H100 offline "
               "throughput rows (validate trtllm_offline) with serving_gemm_fraction at 0.80 (p of 1.5, 2, 3, 4, 8 "
               "and infinity tried; median 3.0%, 4.4% with the max); no fit procedure, so that group's median is "
               "in sample for it; catalog/gemm_efficiency.csv was derived with it",
               "validate trtllm_offline; " + _ROOFLINE_TESTS),
    Assumption("hbm_bw_efficiency", 0.85, _EFF, "HBM_BW_EFFICIENCY", "1",
               "streaming kernels reach about 85% of peak HBM bandwidth (widely reported); the default of "
               "chips whose catalog entry has no measured_stream_bw",
               "validate latency (TPOT rows); " + _ROOFLINE_TESTS),
    Assumption("kernel_fixed_s", 2.45e-6, _EFF, "KERNEL_FIXED_S", "s",
               "shortest GEMM in AIConfigurator's measured H100 table (aiconfigurator-core 0.12.0): 2.45 us; the "
               "default of chips whose catalog entry has no measured_kernel_fixed",
               "validate latency; " + _ROOFLINE_TESTS),
    Assumption("gemm_fixed_s", 3.65e-6, _EFF, "GEMM_FIXED_S", "s",
               "fixed time of a GEMM by weights, fitted with the streaming bandwidth to AIConfigurator's measured "
               "H100 bf16 GEMMs of M <= 16 (benchmarks/aiconfigurator_stream_bw.py); the default of chips whose "
               "catalog entry has no measured_gemm_fixed",
               "validate latency; " + _ROOFLINE_TESTS),
    Assumption("expert_gemm_half_width", 450.0, _EFF, "EXPERT_GEMM_HALF_WIDTH", "1",
               "routed experts' grouped GEMMs run at w / (w + this) of the dense rate, w the expert's width on a "
               "chip: fitted to AIConfigurator's measured MoE tables on H100 / H200 (benchmarks/aiconfigurator_moe.py)",
               "validate latency (DeepSeek-V3 rows); " + _ROOFLINE_TESTS),
    Assumption("block_scaled_expert_gemm_ceiling", 0.61, _EFF, "BLOCK_SCALED_EXPERT_GEMM_CEILING", "1",
               "grouped GEMMs of fp8 experts scaled per 128 x 128 block reach at most this fraction of the dense "
               "rate: fitted to the same tables (benchmarks/aiconfigurator_moe.py)",
               "validate latency (DeepSeek-V3 rows); " + _ROOFLINE_TESTS),
    Assumption("eager_kernel_launch_s", 3.708e-6, _EFF, "EAGER_KERNEL_LAUNCH_S", "s",
               "fitted on the TTFT of TensorRT-LLM v0.6.1's four batch-1 rows (validate/fit.py, GROUP_PROCEDURES)",
               "validate trtllm_batch1_ttft; " + _ROOFLINE_TESTS),
    Assumption("activation_bytes", 2.0, _EFF, "ACTIVATION_BYTES", "bytes",
               "activations, residual stream and all-reduced hidden states are bf16",
               _ROOFLINE_TESTS),
    Assumption("attention_plateau_fraction", 0.8, _EFF, "ATTENTION_PLATEAU_FRACTION", "1",
               "FlashAttention-3 forward on H100 (pytorch/benchmark ff65cb67): its plateau over the chip's MAMF, "
               "with attention_query_overhead_pairs", _ROOFLINE_TESTS),
    Assumption("attention_query_overhead_pairs", 256.0, _EFF, "ATTENTION_QUERY_OVERHEAD_PAIRS", "1",
               "fitted to FlashAttention-3 forward on H100 (pytorch/benchmark ff65cb67), within 2.1%",
               _ROOFLINE_TESTS),
    Assumption("reserved_logit_rows", 256.0, _EFF, "RESERVED_LOGIT_ROWS", "1",
               "fp32 logit rows the memory reserve holds where no cap on sequences is given (with one, a row "
               "a sequence): an engine's usual cap of 256",
               _ROOFLINE_TESTS),
    Assumption("runtime_reserve_bytes", float(2**30), _EFF, "RUNTIME_RESERVE_BYTES", "bytes",
               "about 1 GiB of non-torch memory (CUDA context, comm buffers, graphs) as engines report",
               _ROOFLINE_TESTS),
    Assumption("logit_bytes", 4.0, "tokenpath.compute.ops", "LOGIT_BYTES", "bytes",
               "logits are computed and sampled in fp32 (vLLM's sampler)", _ROOFLINE_TESTS),
    Assumption("sampler_profile_bytes_per_logit", 24.0, _EFF, "SAMPLER_PROFILE_BYTES_PER_LOGIT", "bytes",
               "the tensors alive at the peak of vLLM's PyTorch top-k/top-p sampling, which its memory "
               "profile runs: bf16 and fp32 logits, sorted values and int64 indices, probabilities, two masks",
               "tests/test_compute_roofline.py, tests/test_memory_reserve.py"),
    # -- compute: a small model served beside the LLM on CPU cores (compute/served.py) -----------------------
    Assumption("cpu_core_encoder_flops", 2 * 110e6 * 128 / 0.273, "tokenpath.compute.served", "CPU_CORE_ENCODER_FLOPS",
               "1",
               "FLOP/s of one CPU core in an encoder's forward pass: ONNX Runtime runs BERT-base (110M parameters) "
               "over 128 tokens in 273 ms on one thread of a Xeon W-2123 (nightr.gitbook.io/nnopt, BERT): "
               "2 x 110M x 128 / 273 ms",
               "tests/test_application_served.py"),
    Assumption("cpu_core_bw_Bps", 19.9e9, "tokenpath.compute.served", "CPU_CORE_BW_BPS", "B/s",
               "single-thread STREAM Triad on a Xeon E5-2690 v3, 19.9 GB/s (John McCalpin, Intel community "
               "forum: single core bandwidth, haswell vs. broadwell vs. skylake)",
               "tests/test_application_served.py"),
    # -- engine: the host's share of a step ---------------------------------------------------------------
    Assumption("host_step_s", 0.8750e-3, _HOST, "HOST_STEP_S", "s",
               "the fixed host time per scheduler call of vLLM V1, SGLang and TensorRT-LLM (scheduling and input "
               "preparation); fitted on the TPOT / ITL of the rows whose steps wait for it (validate/fit.py)",
               "validate latency, validate --cross; tests/test_engine.py, tests/test_validate_cross.py"),
    Assumption("vllm_v0_host_window_s", 1.92e-3, _HOST, "VLLM_V0_HOST_WINDOW_S", "s",
               "vLLM V0's host time per scheduler call, in its path (the vllm-v0 profile): Scheduler.schedule and "
               "prepare_model_input, once per multi-step window; fitted on the V0 rows run one step at a time "
               "(validate/fit.py)",
               "validate latency, validate --cross; tests/test_validate_cross.py"),
    Assumption("vllm_v0_host_step_s", 0.1139e-3, _HOST, "VLLM_V0_HOST_STEP_S", "s",
               "vLLM V0's host time in every step's path besides (the vllm-v0 profile): the engine's step loop, the "
               "sampler's tensors and pythonized outputs; fitted on the multi-step V0 rows (validate/fit.py)",
               "validate latency, validate --cross; tests/test_validate_cross.py"),
    Assumption("eager_host_per_kernel_s", 63.2e-6, _HOST, "EAGER_HOST_PER_KERNEL_S", "s",
               "SGLang's and vLLM V0's host time to launch each kernel of an eager step, queued ahead of the GPU "
               "(compute/roofline.launch_queue_s); fitted on the TTFT of every SGLang and vLLM V0 row "
               "(validate/fit.py)",
               "validate latency, validate --cross; tests/test_compute_roofline.py, tests/test_simulate.py"),
    Assumption("trtllm_eager_host_per_kernel_s", 76.0e-6, _HOST, "TRTLLM_EAGER_HOST_PER_KERNEL_S", "s",
               "TensorRT-LLM's PyTorch backend's host time to launch each kernel of an eager step, its fused ops "
               "counted by engine/eager_launches.py, queued ahead of the GPU; fitted on the TTFT of the TensorRT-LLM "
               "rows run on that backend (validate/fit.py)",
               "validate latency, validate --cross; tests/test_eager_launches.py"),
    Assumption("host_per_sequence_s", 7.57e-6, _HOST, "HOST_PER_SEQUENCE_S", "s",
               "vLLM 0.11.0's V1 Scheduler.schedule + update_from_output + output encoding per decoding sequence, "
               "run on this project's machine (benchmarks/vllm_scheduler_host.py)",
               "validate latency; tests/test_engine.py"),
    # -- fabric: links and collectives ---------------------------------------------------------------------
    Assumption("nvlink_hop_latency_s", 0.6e-6, _BUILD, "NVLINK_HOP_LATENCY_S", "s",
               "NCCL's per-step NVLink latency (src/graph/tuning.cc hwLatencies NVLINK, LL: 0.6 us)",
               "validate nccl_allreduce; tests/test_fabric.py"),
    Assumption("xgmi_hop_latency_s", 0.8e-6, _BUILD, "XGMI_HOP_LATENCY_S", "s",
               "RCCL's per-step xGMI latency on CDNA3 platforms (ROCm/rccl src/graph/tuning.cc tuning_model_5 "
               "hwLat NVLINK, Ring / LL: 0.8 us), for the scale-up links of chips RCCL runs on",
               "tests/test_fabric_rccl.py"),
    Assumption("scaleout_link_latency_s", 2.7e-6 / 4, _BUILD, "SCALEOUT_LINK_LATENCY_S", "s",
               "NCCL's network step latency (tuning.cc hwLatencies NET, LL: 2.7 us) over 4 links of a route",
               "validate collectives_scaleout; tests/test_fabric_spec.py"),
    Assumption("base_latency_s", 6.6e-6, _COLL, "BASE_LATENCY_S", "s",
               "NCCL src/graph/tuning.cc: base latency of a collective launch (Ring, LL), 6.6 us",
               "validate nccl_allreduce; tests/test_fabric_collectives.py"),
    Assumption("rccl_base_latency_s", 12.0e-6, _COLL, "RCCL_BASE_LATENCY_S", "s",
               "ROCm/rccl src/graph/tuning.cc baseLat: base latency of a collective launch (Ring and Tree, LL), "
               "12.0 us, on the chips RCCL runs on",
               "tests/test_fabric_rccl.py"),
    Assumption("net_overhead_s", 1.0e-6, _COLL, "NET_OVERHEAD_S", "s",
               "NCCL src/graph/tuning.cc getNetOverhead: 1.0 us on Intel and other CPUs (2.0 us on AMD), the least "
               "an inter-node ring's step inside a node takes (x3 under Simple; ncclTopoTuneModel)",
               "validate latency; tests/test_fabric_hierarchy.py"),
    Assumption("nvls_latency_s", 25.0e-6, _COLL, "NVLS_LATENCY_S", "s",
               "NVLS all-reduce latency as NCCL's tuner rates it (src/graph/tuning.cc hwLatencies NVLINK / "
               "NVLS / Simple, 25 us)",
               "validate nccl_allreduce; tests/test_fabric.py"),
    Assumption("nvls_tree_net_step_latency_s", 20.9e-6, _COLL, "NVLS_TREE_NET_STEP_LATENCY_S", "s",
               "NCCL tuning.cc hwLatencies NET / NVLSTree / Simple, 20.9 us per network step",
               "validate collectives_scaleout; tests/test_fabric_hierarchy.py"),
    Assumption("scaleup_bw_efficiency", 370.0 / 450.0, _COLL, "SCALEUP_BW_EFFICIENCY", "1",
               "ring all-reduce busbw 370 of 450 GB/s on 8x H100 (nccl-tests issues 212, 309)",
               "validate nccl_allreduce; tests/test_fabric_collectives.py"),
    Assumption("nvls_link_efficiency", (480.0 / (2 * 7 / 8)) * (1 + 1 / 8) / 450.0, _COLL,
               "NVLS_LINK_EFFICIENCY", "1",
               "NVLS busbw 480 GB/s on 8x H100 (nccl-tests issue 212) as link traffic over 450 GB/s",
               "validate nccl_allreduce; tests/test_fabric_collectives.py"),
    Assumption("scaleout_bw_efficiency", 47.0 / 50.0, _COLL, "SCALEOUT_BW_EFFICIENCY", "1",
               "a 400 Gb/s NIC reaches 46-48 of 50 GB/s busbw (nccl-tests issue 290)",
               "validate collectives_scaleout; tests/test_fabric_hierarchy.py"),
    Assumption("tree_all_reduce_efficiency", 0.92, _TUNER, "TREE_ALL_REDUCE_EFFICIENCY", "1",
               "NCCL src/graph/tuning.cc ncclTopoTuneModel: a tree all-reduce's bus bandwidth x .92 (then "
               "perChMaxTreeBws), inside a node and across nodes",
               "validate collectives_scaleout; " + _TUNER_TESTS),
    Assumption("tree_same_gpu_nic_efficiency", 0.85, _TUNER, "TREE_SAME_GPU_NIC_EFFICIENCY", "1",
               "NCCL tuning.cc: a tree's bus bandwidth x .85 where its graph is NCCL_TOPO_PATTERN_TREE (all NIC "
               "traffic to and from one GPU), the pattern search.cc finds on nodes with a NIC per GPU",
               _TUNER_TESTS),
    Assumption("ring_simple_latency_plateau", 1.4, _TUNER, "RING_SIMPLE_LATENCY_PLATEAU", "1",
               "NCCL tuning.cc ncclTopoGetAlgoTime: a Simple ring all-reduce across nodes takes its latency x 1.4 "
               "'Plateau effect of ring', compute capability 8.0 on)",
               "validate collectives_scaleout; " + _TUNER_TESTS),
    Assumption("ll_max_bus_bw_two_nodes_Bps", 39.0e9, _TUNER, "LL_MAX_BUS_BW_TWO_NODES_BPS", "B/s",
               "NCCL tuning.cc llMaxBws: LL's most bus bandwidth over 2 nodes of Intel (or other non-AMD) CPUs, "
               "39.0 GB/s (AMD: 22.5)",
               _TUNER_TESTS),
    Assumption("ll_max_bus_bw_more_nodes_Bps", 20.4e9, _TUNER, "LL_MAX_BUS_BW_MORE_NODES_BPS", "B/s",
               "NCCL tuning.cc llMaxBws: LL's most bus bandwidth over 3 or more nodes of Intel (or other non-AMD) "
               "CPUs, 20.4 GB/s (AMD: 19.0)",
               _TUNER_TESTS),
    Assumption("low_latency_all_to_all_s", 30.7e-6, _COLL, "LOW_LATENCY_ALL_TO_ALL_S", "s",
               "fitted on DeepEP's EP8 low-latency dispatch row on H800 (77 us)",
               "validate deepep_low_latency; tests/test_fabric_collectives.py"),
    Assumption("ugal_hop_ratio", 2.0, "tokenpath.fabric.dragonfly", "UGAL_HOP_RATIO", "1",
               "UGAL stand-in: Valiant when MIN links would carry over 2x all-Valiant's mean global load "
               "(a Valiant path crosses two global links, a MIN path one)",
               "tests/test_fabric_dragonfly.py"),
    # -- delivery: the last mile (the defaults of the scenario's [delivery] table) ---------------------------
    Assumption("host_link_bw_Bps", 64e9, _DELIVERY, "PCIE_GEN5_X16_PER_DIRECTION_BPS", "B/s",
               "PCIe Gen5 x16, 64 GB/s per direction (the H200 SXM host link, nvidia.com/h200)",
               "tests/test_delivery.py"),
    Assumption("host_link_latency_s", 10e-6, _DELIVERY, "D2H_COPY_LATENCY_S", "s",
               "a small device-to-host cudaMemcpy costs about 10 us on PCIe Gen5 hosts",
               "tests/test_delivery.py"),
    Assumption("detokenize_per_token_s", 6.45e-6, _DELIVERY, "DETOKENIZE_PER_TOKEN_S", "s",
               "vLLM V1's API server per streamed token before its chunk is built, timed running vLLM 0.11.0's "
               "own code: the msgpack decode of the engine core's outputs (0.27 us), OutputProcessor."
               "process_outputs (detokenizing with DecodeStream, the stop check, the RequestOutput, the "
               "collector's put: 4.78 us) and the Prometheus logger's two observations (1.41 us), 32 sequences, "
               "no stop strings, median step, on this project's 2-core AMD EPYC machine "
               "(benchmarks/vllm_output_processor.py; 7.09 us with two stop strings; vLLM V0's path read "
               "17-55 us, vLLM issue 5206)",
               "tests/test_delivery.py; benchmarks/vllm_output_processor.py"),
    Assumption("vllm_v0_detokenize_per_token_s", 17e-6, _DELIVERY, "VLLM_V0_DETOKENIZE_PER_TOKEN_S", "s",
               "vLLM V0's incremental detokenize call per token, in its engine's process (the vllm-v0 "
               "profile): 17-55 us (vLLM issue 5206), the low end",
               "tests/test_frontend.py"),
    Assumption("sglang_detokenize_per_token_s", 11.23e-6, _DELIVERY, "SGLANG_DETOKENIZE_PER_TOKEN_S", "s",
               "SGLang's DetokenizerManager per streamed token, timed running SGLang 0.5.23's own code on the messages "
               "its scheduler code builds: the BatchTokenIDOutput unpickled (its default IPC, 1.62 us), "
               "handle_batch_token_id_out (two batch_decode windows, the new text: 7.88 us) and the BatchStrOutput "
               "pickled (1.70 us), 32 sequences, median step, on this project's 2-core AMD EPYC machine "
               "(benchmarks/sglang_output_path.py; 10.50-15.43 us from 8 to 256 sequences)",
               "tests/test_frontend.py; benchmarks/sglang_output_path.py"),
    Assumption("sglang_output_per_token_s", 5.19e-6, _DELIVERY, "SGLANG_OUTPUT_PER_TOKEN_S", "s",
               "SGLang's TokenizerManager (its API server) per streamed token taking in the detokenizer's text, timed "
               "likewise: the BatchStrOutput unpickled (1.36 us) and _handle_batch_output (each request's "
               "meta_info and out dict, its state's event: 3.83 us), 32 sequences, metrics off as by default "
               "(benchmarks/sglang_output_path.py; 4.96-6.52 us from 8 to 256 sequences, 10 us more per "
               "token for both processes together with --enable-metrics)",
               "tests/test_frontend.py; benchmarks/sglang_output_path.py"),
    Assumption("frame_per_event_s", 20.7e-6, _DELIVERY, "FRAME_PER_EVENT_S", "s",
               "10.6 + 10.1 us: one streamed chunk built as vLLM's serving_chat.py builds it (a pydantic "
               "ChatCompletionStreamResponse, model_dump_json, SSE framing), 10.6 us on a current x86 core; then "
               "written through the engine's HTTP layer (its output collector, two async generators, Starlette's "
               "StreamingResponse, uvicorn's write), 10.1 us of the server process's CPU: FastAPI 0.165, "
               "Starlette 1.10, uvicorn 0.55 with uvloop 0.23 and httptools 0.9, 32 streams x 512 chunks on "
               "loopback, median of 5 runs (9.1-11.2 us) on a shared 2-core AMD EPYC at load 6 "
               "(tokenpath calibrate delivery: [framing], [engine_http])",
               "tests/test_delivery.py; tokenpath calibrate delivery"),
    Assumption("frontend_per_request_s", 947.6e-6, _DELIVERY, "FRONTEND_PER_REQUEST_S", "s",
               "913 + 34.6 us: a streaming chat request through FastAPI under uvicorn as vLLM serves it (HTTP "
               "parsing, access log, CORS, routing, the body parsed into vLLM's pydantic ChatCompletionRequest, "
               "with_cancellation, the response's head, [DONE] and end, the connection closed), 913 us of the "
               "server process's CPU (685 us of it without parsing the body): FastAPI 0.165, Starlette 1.10, "
               "uvicorn 0.55 with uvloop 0.23 and httptools 0.9, bursts of 200 on loopback, median of 5 runs "
               "(613-1039 us) on a shared 2-core AMD EPYC at load 6; then its ids pickled to the engine's process "
               "over a socket, 34.6 us on a current x86 core (tokenpath calibrate delivery: [engine_http], "
               "[request])", "tests/test_frontend.py; tokenpath calibrate delivery"),
    Assumption("chat_template_per_request_s", 49.1e-6, _DELIVERY, "CHAT_TEMPLATE_PER_REQUEST_S", "s",
               "a system + user conversation rendered by mistral-common's chat encoding for the default "
               "tokenizer, its text encoding taken out: 49.1 us on a current x86 core (tokenpath calibrate "
               "delivery; Llama 3's template in Jinja2, as transformers renders it, 24.9 us)",
               "tests/test_frontend.py; tokenpath calibrate delivery"),
    # -- an engine's routed experts where MXFP4 weights run weight-only (engine/expert_kernels.py) ------------
    Assumption("vllm_mxfp4_weight_only_expert_time", 1.73, _EXPERTS, "VLLM_MXFP4_WEIGHT_ONLY_EXPERT_TIME", "1",
               "vLLM's MXFP4 routed experts on Hopper, as a multiple of the model's roofline time beyond their "
               "kernels' fixed time: the median of 10 AIConfigurator w4a16_mxfp4 tables (H100, H200; vLLM 0.19.0 "
               "and 0.24.0; TP1-8; each the median over 8-1,024 tokens), 1.30-2.14 (benchmarks/"
               "aiconfigurator_mxfp4.py)", _EXPERTS_TESTS),
    Assumption("sglang_mxfp4_weight_only_expert_time", 4.42, _EXPERTS, "SGLANG_MXFP4_WEIGHT_ONLY_EXPERT_TIME", "1",
               "SGLang's, likewise: the median of 8 tables (H100, H200; SGLang 0.5.14; TP1-8), 4.18-4.57 "
               "(benchmarks/aiconfigurator_mxfp4.py)", _EXPERTS_TESTS),
    Assumption("trtllm_mxfp4_weight_only_expert_time", 1.67, _EXPERTS, "TRTLLM_MXFP4_WEIGHT_ONLY_EXPERT_TIME", "1",
               "TensorRT-LLM's, likewise: 2 tables (H200, TP1; 1.3.0rc10 and rc20), 1.67 both "
               "(benchmarks/aiconfigurator_mxfp4.py)", _EXPERTS_TESTS),
    Assumption("template_format_detection_per_char_s", 1.13e-6, _TEMPLATE, "TEMPLATE_FORMAT_DETECTION_PER_CHAR_S",
               "s", "a chat template's source parsed in transformers' Jinja2 environment and its tree walked for "
               "assignments and for loops, as vLLM 0.6.5-0.9.1 detect its content format on every request: 1.150 "
               "and 1.117 us a character on two 4.1-4.3k-character templates (Qwen3's, vLLM's MiniCPM-V 4.5 "
               "fallback), medians of 9 on this project's shared 2-core AMD EPYC (benchmarks/template_parse.py)",
               _TEMPLATE_TESTS),
    Assumption("template_kwargs_resolution_per_char_s", 2.57e-6, _TEMPLATE, "TEMPLATE_KWARGS_RESOLUTION_PER_CHAR_S",
               "s", "a sandboxed Jinja2 environment built, a chat template's source parsed and its undeclared "
               "variables listed, as vLLM 0.11.0 resolves a request's template arguments: 2.592 and 2.540 us a "
               "character on the same two templates, medians of 9 (benchmarks/template_parse.py)", _TEMPLATE_TESTS),
    Assumption("tokenize_per_token_s", 1.04e-6, _DELIVERY, "TOKENIZE_PER_TOKEN_S", "s",
               "Hugging Face tokenizers encoding English prose, as vLLM and SGLang tokenize a prompt for every "
               "model but Mistral's: 1.04 us a token, the slope over prompts of 128 to 2,048 tokens through "
               "SGLang 0.5.23's chat path (tokenizers 0.23.3 under transformers 5.25, Tekken's vocabulary "
               "converted to a tokenizer.json) on this project's 2-core AMD EPYC machine "
               "(benchmarks/sglang_request_path.py; mistral-common's Tekkenizer, which vLLM uses for Mistral "
               "models, 0.414 us on the same prose in the same run; tokenpath calibrate delivery times the "
               "tokenizer it is given)",
               "tests/test_frontend.py; benchmarks/sglang_request_path.py; tokenpath calibrate delivery"),
    Assumption("invisible_token_fraction", 15 / 4110, _DELIVERY, "INVISIBLE_TOKEN_FRACTION", "1",
               "15 of the 4,110 Tekken tokens of the workload's English corpus show nothing visible alone, all "
               "white space (measured; 5.9% of Chinese text, 45% of emoji-heavy text, 11% of code)",
               "tests/test_delivery.py"),
    # -- retrieval: one query on a vector index (an application's retrieval stage) ------------------------
    Assumption("cpu_memory_bw_Bps", 0.8 * 8 * 4.8e9 * 8, _SEARCH, "CPU_MEMORY_BW_BPS", "B/s",
               "one Intel Xeon Platinum 8480C socket (2 x 56 cores host NVIDIA DGX H100, DGX H100 user guide): 8 "
               "channels of DDR5-4800 (Intel ark, Xeon Platinum 8480+), 307.2 GB/s peak, x 0.8: multi-threaded "
               "STREAM sustains 75-85% of peak DRAM bandwidth in each generation (J. McCalpin, sites.utexas.edu/"
               "jdm4372/2025/02/17/single-core-memory-bandwidth-latency-bandwidth-and-concurrency)", _SEARCH_TESTS),
    Assumption("cpu_cores", 56.0, _SEARCH, "CPU_CORES", "1",
               "cores of that socket (Intel ark, Xeon Platinum 8480+; DGX H100 user guide: 8480C, 56 cores)",
               _SEARCH_TESTS),
    Assumption("cpu_core_flops", 2.0e9 * 64, _SEARCH, "CPU_CORE_FLOPS", "1",
               "FP32 FLOP/s of one 8480C core: 2.0 GHz base (Intel ark, 8480+) x two 512-bit FMA units, 64 FLOP a "
               "cycle (chipsandcheese.com/p/a-peek-at-sapphire-rapids: 2 x 512-bit FMA throughput)", _SEARCH_TESTS),
    Assumption("ivf_imbalance", 1.235, _SEARCH, "IVF_IMBALANCE", "1",
               "FAISS's k-means of SIFT1M into 16,384 clusters: imbalance=1.235 (github.com/facebookresearch/faiss/"
               "wiki/Indexing-1M-vectors, HNSW benchmarks, kmeans baseline log)", _SEARCH_TESTS),
    Assumption("hnsw_distance_fraction", (4782698 / 10000 * 65960703 / 94231860 - 16 * math.log(1e6) / math.log(16))
               / (16 * 2 * 16), _SEARCH, "HNSW_DISTANCE_FRACTION", "1",
               "FAISS issue 3819: bench_hnsw.py's IndexHNSWSQ (M 16) on SIFT1M at efSearch 16 checks 478.3 links a "
               "query; over the whole run 70% of the links checked cost a distance (65,960,703 of 94,231,860), "
               "so 334.8 at that row; less the upper layers' 16 x log_16(1e6), over efSearch x 2M", _SEARCH_TESTS),
    Assumption("hnsw_visit_s", 189e-9, _SEARCH, "HNSW_VISIT_S", "s",
               "fitted (geometric mean of the five rows) to FAISS's IndexHNSWFlat (M 32) on SIFT1M at efSearch 16 to "
               "256: 0.011-0.104 ms a query with 20 threads on 2 x Xeon E5-2680 v2 (github.com/facebookresearch/"
               "faiss/wiki/Indexing-1M-vectors, HNSW benchmarks), each row's time per thread over the model's "
               "distances, less each distance's bytes and FLOPs at that machine's figures", _SEARCH_TESTS),
    Assumption("pq_lookup_s", 7.517e-3 / (1e6 * 16), _SEARCH, "PQ_LOOKUP_S", "s",
               "FAISS benchs/README.md: IndexPQ of 16 bytes a vector on SIFT1M, one thread, 7.517 ms a query "
               "(bench_polysemous_sift1m.py, PQ baseline) over its 1M x 16 code bytes", _SEARCH_TESTS),
)

BY_NAME: dict[str, Assumption] = {a.name: a for a in REGISTRY}


def default(name: str) -> float:
    """The registry's value of assumption `name`, for the module that documents it to bind its constant."""
    return BY_NAME[name].value


# Delivery assumptions are the defaults of fields of the scenario's [delivery] table.
DELIVERY_FIELDS = {"host_link_bw_Bps": "host_link_bw", "host_link_latency_s": "host_link_latency",
                   "detokenize_per_token_s": "detokenize_per_token", "frame_per_event_s": "frame_per_event",
                   "invisible_token_fraction": "invisible_token_fraction",
                   "frontend_per_request_s": "frontend_per_request",
                   "chat_template_per_request_s": "chat_template_per_request",
                   "tokenize_per_token_s": "tokenize_per_token"}

# Delivery assumptions an engine profile takes in place of a [delivery] field's default, where the table
# leaves the field unset (engine/profiles.py, Profile.detokenize_assumption and output_assumption).
PROFILE_DELIVERY_FIELDS = {"vllm_v0_detokenize_per_token_s": "detokenize_per_token",
                           "sglang_detokenize_per_token_s": "detokenize_per_token",
                           "sglang_output_per_token_s": "output_per_token"}

CALIBRATION_KEY = "calibration"

# What a value may be, beyond its unit: (lowest, highest, whether the lowest itself is excluded).
# Durations are each a cost per kernel, step, hop, token or request: 0 to 1 s, as the [delivery] table's
# host costs (config/units.MAX_COST_S); bandwidths the scenario's range (1 kB/s to 100 PB/s); a fraction of
# a rate is above 0 and at most 1; sizes and ratios are above 0; counts (_COUNTS) are whole. Anything else:
# any finite number >= 0.
_FRACTIONS = ("default_matmul_efficiency", "serving_gemm_fraction", "attention_plateau_fraction", "hbm_bw_efficiency",
              "scaleup_bw_efficiency",
              "nvls_link_efficiency", "scaleout_bw_efficiency", "block_scaled_expert_gemm_ceiling",
              "tree_all_reduce_efficiency", "tree_same_gpu_nic_efficiency",
              "hnsw_distance_fraction")
_POSITIVE = ("activation_bytes", "logit_bytes", "host_link_bw_Bps", "ugal_hop_ratio", "cpu_memory_bw_Bps",
             "vllm_mxfp4_weight_only_expert_time", "sglang_mxfp4_weight_only_expert_time",
             "trtllm_mxfp4_weight_only_expert_time",
             "cpu_cores", "cpu_core_flops", "cpu_core_encoder_flops", "cpu_core_bw_Bps",
             "ll_max_bus_bw_two_nodes_Bps", "ll_max_bus_bw_more_nodes_Bps")
_COUNTS = ("cpu_cores", "reserved_logit_rows")
RANGES: dict[str, tuple[float, float, bool]] = {
    **{a.name: (0.0, MAX_COST_S, False) for a in REGISTRY if a.unit == "s"},
    **{name: (0.0, 1.0, True) for name in _FRACTIONS},
    **{name: (0.0, math.inf, True) for name in _POSITIVE},
    **{a.name: (MIN_BANDWIDTH_BPS, MAX_BANDWIDTH_BPS, False) for a in REGISTRY if a.unit == "B/s"},
    "gemm_overlap_norm": (1.0, math.inf, False),  # a p-norm; inf: the plain roofline max
    "ring_simple_latency_plateau": (1.0, math.inf, False),  # a latency it multiplies
    "invisible_token_fraction": (0.0, 0.999, False),
    "ivf_imbalance": (1.0, math.inf, False),  # a probed list holds at least the mean
}


def _in_range(name: str, number: float) -> bool:
    low, high, open_low = RANGES.get(name, (0.0, math.inf, False))
    above = number > low if open_low else number >= low
    whole = name not in _COUNTS or number == int(number)
    return above and number <= high and whole and (math.isfinite(number) or name == "gemm_overlap_norm")


def _range_text(name: str) -> str:
    low, high, open_low = RANGES.get(name, (0.0, math.inf, False))
    text = f"{'above' if open_low else 'at least'} {format_value(name, low)}"
    text += f" and at most {format_value(name, high)}" if high < math.inf else ""
    return ("a whole number " if name in _COUNTS else "") + text


def lookup(name: str, where: str = "assumptions") -> Assumption:
    """The registered assumption `name`; an unknown name is a UserError naming the closest ones."""
    found = BY_NAME.get(name)
    if found is None:
        close = difflib.get_close_matches(str(name)[:200], list(BY_NAME), n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise UserError(f"{where}.{name}: no such assumption; {hint}`tokenpath assumptions` lists them all")
    return found


def parse_value(assumption: Assumption, value: object, where: str) -> float:
    """A value in the assumption's unit: a number already in it, or a string with a unit ("20 us")."""
    from tokenpath.config.units import parse_bandwidth_Bps, parse_bytes, parse_duration_s

    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise UserError(f"{where}: {quoted(value)} is not a number; give a number in {assumption.unit}")
    parse = {"s": parse_duration_s, "bytes": parse_bytes, "B/s": parse_bandwidth_Bps}.get(assumption.unit)
    if parse is not None:
        number = parse(value, where)
    else:
        try:  # (a string as the quantities' parser reads a number: float() would also take "1_000")
            if isinstance(value, str) and not PLAIN_NUMBER.fullmatch(value):
                raise ValueError(value)
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise UserError(f"{where}: {quoted(value)} is not a number; {assumption.name} is a plain number, "
                            f"e.g. {assumption.value:g}") from None
    if math.isnan(number) or not _in_range(assumption.name, number):
        raise UserError(f"{where}: {quoted(value)} is out of range; {assumption.name} must be "
                        f"{_range_text(assumption.name)} (default {format_value(assumption.name, assumption.value)})")
    return number


def check_table(table: Mapping[str, Any]) -> dict[str, Any]:
    """A scenario's [assumptions] table with each value in SI ({name: float}, plus `calibration`:
    a file name or a list of them). Raises UserError naming the key."""
    if not isinstance(table, dict):
        raise UserError(f"assumptions: {quoted(table)} is not a table; write [assumptions] with name = value "
                        "lines (`tokenpath assumptions` lists the names)")
    checked: dict[str, Any] = {}
    for name, value in table.items():
        if name == CALIBRATION_KEY:
            paths = [value] if isinstance(value, str) else value
            if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and p for p in paths):
                raise UserError("assumptions.calibration: give a calibration file, or a list of them, e.g. "
                                "calibration = \"engine-calibration.toml\"")
            checked[name] = value
            continue
        checked[name] = parse_value(lookup(name), value, f"assumptions.{name}")
    return checked


@dataclass(frozen=True)
class Assumptions:
    """The values a run uses where they differ from the registry: `values` by name (SI units), with
    where each came from: `overridden` (named in the scenario) and `calibrated` (name -> the file)."""

    values: Mapping[str, float] = field(default_factory=dict)
    overridden: tuple[str, ...] = ()
    calibrated: Mapping[str, str] = field(default_factory=dict)
    calibration_files: tuple[str, ...] = ()

    delivery_calibration: str | None = None  # a `calibrate delivery` file among the calibration files
    # engine calibration file -> the deployment it was fitted on, as its [scenario] table records it
    # (FITTED_ON_KEYS; empty for a file written before it did)
    fitted_on: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def value(self, name: str) -> float:
        """This run's value of assumption `name`: its override or calibration, else the registry's."""
        return self.values.get(name, lookup(name).value)

    def delivery_fields(self, set_in_table: set[str] | frozenset[str]) -> dict[str, float]:
        """[delivery] field -> value for the delivery assumptions this run changes, except the fields
        the scenario's [delivery] table sets itself (those win)."""
        return {field: self.values[name] for name, field in DELIVERY_FIELDS.items()
                if name in self.values and field not in set_in_table}

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Model code reads these values (through `assumed`) inside this block."""
        token = _ACTIVE.set(dict(self.values))
        try:
            yield
        finally:
            _ACTIVE.reset(token)

    def describe(self) -> dict[str, Any]:
        """The result document's `scenario.assumptions` block."""
        def shown(value: float) -> float | str:  # JSON has no infinity
            return value if math.isfinite(value) else "inf"

        return {"overridden": {n: shown(self.values[n]) for n in self.overridden},
                "calibrated": {n: {"value": shown(self.values[n]), "file": f} for n, f in self.calibrated.items()},
                "calibration_files": list(self.calibration_files)}


DEFAULTS = Assumptions()  # the registry's values, none changed


def format_value(name: str, value: float) -> str:
    """A value for people, in its assumption's unit ("2 ms", "0.6")."""
    from tokenpath.config.units import format_bandwidth, format_bytes, format_duration

    unit = lookup(name).unit
    shown = {"s": format_duration, "bytes": format_bytes, "B/s": format_bandwidth}.get(unit)
    return shown(value) if shown is not None else f"{value:.4g}"


def listing(values: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    """Every assumption as a JSON-ready object (`values` overrides the registry's)."""
    values = values or {}
    return [{"name": a.name, "value": values.get(a.name, a.value), "default": a.value, "unit": a.unit,
             "source": a.source, "guarded_by": a.guarded_by, "defined_in": f"{a.module}.{a.constant}"}
            for a in REGISTRY]


ENGINE_CALIBRATION_SCHEMA = "tokenpath.engine-calibration/1"
DELIVERY_CALIBRATION_SCHEMA = "tokenpath.delivery-calibration/1"
# What an engine calibration's [scenario] table records of the deployment it was fitted on: its fitted
# rates belong to that model, precision, chip and engine release (sim/envelope.py compares them).
FITTED_ON_KEYS = ("model", "precision", "chip", "engine", "engine_version")


def read_calibration(path: str) -> tuple[dict[str, float], str | None, dict[str, str]]:
    """A calibration file's fitted values by name, or (for a `calibrate delivery` file) its path as the
    delivery calibration, and the deployment an engine calibration was fitted on (FITTED_ON_KEYS it
    records). Either kind joins a scenario through `[assumptions] calibration`."""
    from tokenpath.config import files

    where = f"assumptions.calibration = {files.shown(path)!r}"
    if not files.exists(path):
        files.check_path(path, "assumptions.calibration")
        raise UserError(f"{where}: no such file; write one with `tokenpath calibrate engine --out {path}` "
                        "(or `calibrate delivery`)")
    document = files.parse_toml(files.read_text(path, "calibration file"), where)
    schema = document.get("schema")
    if schema == DELIVERY_CALIBRATION_SCHEMA:
        return {}, path, {}
    if schema != ENGINE_CALIBRATION_SCHEMA:
        raise UserError(f"{where}: schema is {quoted(schema)}, expected {ENGINE_CALIBRATION_SCHEMA!r} or "
                        f"{DELIVERY_CALIBRATION_SCHEMA!r}; write it with `tokenpath calibrate engine`")
    fitted = document.get("fitted")
    if not isinstance(fitted, dict):
        raise UserError(f"{where}: no [fitted] table; write it again with `tokenpath calibrate engine`")
    values = {}
    for name, entry in fitted.items():
        assumption = lookup(name, f"{where}: fitted")
        value = entry.get("value") if isinstance(entry, dict) else None
        values[name] = parse_value(assumption, value, f"{where}: fitted.{name}.value")
    scenario = document.get("scenario")
    recorded = scenario if isinstance(scenario, dict) else {}
    fitted_on = {key: recorded[key] for key in FITTED_ON_KEYS if isinstance(recorded.get(key), str)}
    return values, None, fitted_on


def resolve(table: Mapping[str, Any], calibration_files: list[str]) -> Assumptions:
    """The Assumptions of a scenario's checked [assumptions] table, its calibration files (resolved
    paths) applied first, in order, and its own values over them."""
    values: dict[str, float] = {}
    calibrated: dict[str, str] = {}
    delivery_calibration = None
    fitted_on: dict[str, dict[str, str]] = {}
    for path in calibration_files:
        fitted, delivery, deployment = read_calibration(path)
        values.update(fitted)
        calibrated.update({name: path for name in fitted})
        delivery_calibration = delivery or delivery_calibration
        if deployment:
            fitted_on[path] = deployment
    own = {name: value for name, value in table.items() if name != CALIBRATION_KEY}
    values.update(own)
    for name in own:
        calibrated.pop(name, None)
    return Assumptions(values, tuple(own), calibrated, tuple(calibration_files), delivery_calibration, fitted_on)
