"""Every tunable assumption of the compute model, in one place.

They are shared by all models and chips: no constant here is specific to one model. Each is an
assumption to calibrate against measurements (`tokenpath validate` compares with published serving
numbers); a chip's own matmul rate, streaming bandwidth and fixed time of a GEMM come from its
measurements in catalog/chips.toml instead, where those are published.

The values themselves are in the registry of assumptions (config/assumptions.py, beside each one's source
and guard); each is bound here to a constant of its own, under its full reasoning.
"""

from tokenpath.config.assumptions import default

DEFAULT_MATMUL_EFFICIENCY = default("default_matmul_efficiency")
"""Fraction of peak tensor FLOP/s a large GEMM reaches, for a chip without a published measured rate
at any precision (one measured at some runs the others at its own measured fraction: compute/chip.py).
0.7 is about the median of the measured/peak ratios catalog/chips.toml does publish (0.51 for MI300X
bf16 to 0.87 for A100 bf16)."""

SERVING_GEMM_FRACTION = default("serving_gemm_fraction")
"""Fraction of a chip's large-GEMM ceiling (the measured MAMF rate, or the default above) that the
weight GEMMs of a serving step reach, beside what their shapes cost them. A step's GEMMs have the model's
own shapes (M = the step's tokens, N a tensor-parallel shard, K the hidden or intermediate width): where
AIConfigurator measured the engine's GEMM kernels on the chip, each GEMM's rate is also scaled by its
shape's measured efficiency (compute/gemm_efficiency.py). What is left, the FP8/FP4 scaling epilogues and
running between other kernels rather than in a benchmark's loop, is this fraction. Fitted in code on the
28 rows of the TensorRT-LLM offline throughput group in `tokenpath validate` (H100, H200 and B200; each
run with the request count and batch limits trtllm-bench used; validate/fit.py's GROUP_PROCEDURES), each
of which `validate` predicts with the value fitted on the other 27 (4.1%, worst 16.1%): 0.85, on a grid
5% apart, their median |error| 3.9% (0.80 gives 5.5%, 0.90 6.4%). Before the shapes' efficiency it was
0.80, set on the group's H100 rows."""

GEMM_OVERLAP_NORM = default("gemm_overlap_norm")
"""How a GEMM's compute and memory times combine: its time is their p-norm with this p,
(compute^p + memory^p)^(1/p), rather than the plain roofline max (p = infinity). Far from the ridge
point the two agree; near it, where the step's tokens (the GEMM's M) make streaming the weights and
multiplying them take about as long, a real kernel saturates neither (tile and wave quantization,
its pipeline's prologue and epilogue), and p = 2 charges up to 1.41x the max there. Decode steps of
large batches sit at that ridge. Set by hand with SERVING_GEMM_FRACTION (then 0.80) on the H100 offline
rows of `tokenpath validate` (p of 1.5, 2, 3, 4, 8 and infinity tried: median 3.0%, 4.4% with the plain
max); math.inf gives the plain max. No fit procedure refits it, so the offline group's held-out median is
in sample for it (the serving fraction alone is fitted on the group's other rows). The shapes'
efficiencies (catalog/gemm_efficiency.csv) were derived with p = 2: regenerate them if it changes, which a
fit of p per held-out row would have to do too."""

HBM_BW_EFFICIENCY = default("hbm_bw_efficiency")
"""Fraction of peak HBM bandwidth a streaming kernel (weight-bound GEMV, paged-attention KV reads)
sustains, for a chip whose catalog entry publishes no `measured_stream_bw`. About 0.85 is widely
reported for H100/H200 streaming kernels. Where measured, the chip's own figure replaces it
(catalog/chips.toml: decode GEMMs in AIConfigurator's tables sustain 0.73 of peak on A100, 0.84 on
H100, 0.82 on H200, 0.76 on B200; hipBLASLt's GEMVs 0.74 on MI300X); an override of this assumption
replaces both."""

KERNEL_FIXED_S = default("kernel_fixed_s")
"""Fixed time of one kernel of a step other than a GEMM by weights (norms, activations, RoPE, attention
and its KV-cache write, an input's quantization, the routed experts' grouped GEMMs), on top of its
work: its start from the captured graph, the ramp-up of its thread blocks and the drain at its end.
The shortest GEMM in AIConfigurator's measured H100 table (aiconfigurator-core 0.12.0,
systems/data/h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet: bf16, m=8, n=32, k=32, almost no work)
takes 2.45 us. vLLM's decode attention in the same tables (RoPE, KV-cache write, split-KV attention
and its combine) takes 11.2 us over one cached token. A decode step of a large model at small batch
is mostly such fixed costs: compute/ops.py counts each op's kernels. A chip whose catalog entry
publishes its own (`measured_kernel_fixed`: MI300X's 4.5 us, a kernel's launch and clean-up as Kog AI
measured them) takes that instead; an override of this assumption replaces both."""

GEMM_FIXED_S = default("gemm_fixed_s")
"""Fixed time of one GEMM by weights, on top of its weights streamed (or its FLOPs): on chips whose
catalog entry has no measured_gemm_fixed, the H100's. A decode GEMM (a few tokens by a weight matrix
of megabytes) runs split-K or stream-K kernels whose reduction and tail cost more than the shortest
kernel's 2.45 us: fitted together with the streaming bandwidth to each of AIConfigurator's measured
bf16 GEMM tables (M <= 16, weights of 1 MB and more), a GEMM costs 3.65 us plus its weights at 0.857
of the H100's peak bandwidth (medians over the engines' tables; 2.9-4.0 us per table), 3.9-4.3 us on
H200, B200 and GB200 and 5.4 us on A100. With KERNEL_FIXED_S instead, the model read decode GEMMs of
under 32 MB 15-27% fast on every chip measured. `python benchmarks/aiconfigurator_stream_bw.py`
reproduces the figures. The tables' fp8 GEMMs, which the model runs as an input quantization kernel
and the GEMM (2.45 + 3.65 = 6.1 us on H100), have intercepts of about 6-10 us with SGLang's kernels
and 10-15 us with vLLM's and TensorRT-LLM's (least squares over M <= 8 on H100, H200 and B200)."""

EAGER_KERNEL_LAUNCH_S = default("eager_kernel_launch_s")
"""Time a step that does not replay a captured CUDA graph loses per kernel it launches, on top of the
kernel's KERNEL_FIXED_S: the host's launch call, which the GPU waits for when kernels are short. A
graph replays all its kernels with one launch. Fitted in code on the four rows of the TensorRT-LLM
batch-1 TTFT group in `tokenpath validate` (context phases, which that runtime runs eagerly;
validate/fit.py's GROUP_PROCEDURES), each of which `validate` predicts with the value fitted on the
other three. With the fixed cost, an eager kernel costs about 6 us, the order reported for eager
launches; applied to every chip and runtime."""

EXPERT_GEMM_HALF_WIDTH = default("expert_gemm_half_width")
"""Routed experts run as grouped GEMMs, one small GEMM per expert, each as wide as the expert's
intermediate width on one chip, w (moe_intermediate_size / tp when tensor parallelism splits the
experts, the whole width when experts are placed whole). Narrow experts keep a kernel's tiles short
on one side and its K loop short (the down projection's K is w), so where the routed tokens make
them compute-bound they run at w / (w + 450) of the dense serving GEMM rate: 30% at w = 192
(Qwen3-30B-A3B at tp 4), 36% at w = 256 (DeepSeek-V3 at tp 8), 82% at w = 2048. From AIConfigurator's
measured MoE tables (aiconfigurator-core 0.12.0, systems/data/{h100_sxm,h200_sxm}/moe/*: SGLang,
TensorRT-LLM and vLLM kernels; bf16 and per-tensor fp8; one expert-parallel rank, uniform routing,
at least 256 tokens per expert): the fit of w / (w + w_half) to the median fraction per width,
median |log error| 0.09. `benchmarks/aiconfigurator_moe.py` reproduces it. Only the compute side
changes: at decode sizes experts stream their weights as other GEMMs do."""

BLOCK_SCALED_EXPERT_GEMM_CEILING = default("block_scaled_expert_gemm_ceiling")
"""What fp8 expert weights scaled per 128 x 128 block (DeepSeek-V3's published checkpoints,
`weight_block_size` in their config) add: their grouped GEMMs rescale every block of K, and reach at
most 0.61 of the dense rate, so they run at 0.61 x w / (w + EXPERT_GEMM_HALF_WIDTH) of it (22% at
DeepSeek-V3's w = 256). The same tables' block-scaled runs (Hopper, the same selection), fitted with
the half-width above, median |log error| 0.10. Dense GEMMs of block-scaled weights (DeepGEMM) run
at the per-tensor rate in the same tables, so only the experts pay it."""

ACTIVATION_BYTES = default("activation_bytes")
"""Bytes per activation element: activations, the residual stream and all-reduced hidden states are
bf16."""

EMBEDDING_PRECISION = "bf16"
"""Precision of the embedding table and LM head. Quantized checkpoints (FP8 Llama, DeepSeek-V3's
native FP8, NVFP4 exports) keep these two in bf16, so they are never counted at the weight
precision."""

ATTENTION_PLATEAU_FRACTION = default("attention_plateau_fraction")
"""Fraction of a chip's large-GEMM ceiling (the measured MAMF rate, or the default) that attention's
products reach on long sequences, its plateau: FlashAttention-3's forward pass on an H100 reads 621
TFLOP/s at 16k tokens against the H100's bf16 MAMF of 794.5 (0.78); 0.8 with the fixed work per query
below reproduces all six of its figures within 2.1% (ATTENTION_QUERY_OVERHEAD_PAIRS). Attention's kernels
are not the weight GEMMs SERVING_GEMM_FRACTION scales, which the same 0.8 stood for until those took their
shapes' measured efficiency."""

ATTENTION_QUERY_OVERHEAD_PAIRS = default("attention_query_overhead_pairs")
"""Attention's fixed work per query token, in (query, key) pairs: a FlashAttention-style kernel runs
as if each query attended this many more keys (loading its query tile, finishing its softmax,
writing its output). So attention is less efficient on short sequences: full attention over L
tokens runs at L / (L + 256) of the kernel's plateau rate. Fitted to FlashAttention-3's forward
pass on an H100 (bf16, head dim 128, batch x sequence = 16k, heads x head dim = 2048), measured in
pytorch/benchmark commit ff65cb67 ("Fix dimension order for FlashAttention-3"): 430, 517, 566,
590, 614 and 621 TFLOP/s at 512, 1k, 2k, 4k, 8k and 16k tokens. With the plateau at this model's
H100 bf16 attention rate (the MAMF ceiling x ATTENTION_PLATEAU_FRACTION, 636 TFLOP/s), 256 pairs
reproduces each within 2.1% (tests/test_compute_roofline.py)."""

ATTENTION_PRECISION = "bf16"
"""Tensor-core precision attention's QK^T and PV products run at. Even with an fp8 KV cache the
common kernels dequantize K/V and multiply in bf16, so attention FLOPs use the bf16 peak."""

RESERVED_LOGIT_ROWS = default("reserved_logit_rows")
"""Rows of fp32 logits the memory reserve assumes live at once where no cap on running sequences is
given: the LM head's output for the sequences sampled in one step, at an engine's usual default cap
(256). With a cap (`[engine] max_num_seqs`), a row per sequence up to it, as vLLM profiles its sampler."""

SAMPLER_PROFILE_BYTES_PER_LOGIT = default("sampler_profile_bytes_per_logit")
"""Bytes per logit (a row per sequence, a column per vocabulary entry, the whole vocabulary on every chip:
vLLM V1 all-gathers the logits) that an engine profiling its sampler's memory sets aside from its KV cache
(Profile.sampler_in_memory_profile; ComputeModel.activation_reserve_bytes). vLLM runs its sampler
in its memory profile with top-k and top-p on (V1: gpu_model_runner._dummy_sampler_run, top_p 0.9,
top_k the vocabulary less one, over min(max_num_batched_tokens, max_num_seqs) rows; V0:
model_runner.profile_run, SamplingParams(top_p=0.99, top_k=vocab_size - 1), "to reflect the accurate
memory usage"), whose PyTorch path (vllm/v1/sample/ops/topk_topp_sampler.py, apply_top_k_top_p) holds
at its peak the model's bf16 logits (2), their fp32 copy (4), the sorted values (4) and their int64
indices (8), the top-k and top-p masks (1 + 1) and the softmaxed probabilities (4): 24. vLLM pull
requests 32558 and 33538 measure that path at 1.25 GB for 256 x 131,072 logits and 5.00 GB for 1,024
(about 37 bytes each, its scratch and output counted). With it, gpt-oss-120b on one H100 (1,024
sequences, 201,088 logits each) sets aside 6.4 GiB besides its weights, where vLLM issue 23278's log
shows 7.4 (71.3 GiB at 0.9 of 79.2, less 66.0 of weights, and 2.1 short)."""

RUNTIME_RESERVE_BYTES = default("runtime_reserve_bytes")
"""Device memory outside weights, KV cache and activations: CUDA context, communication buffers and
captured CUDA graphs. About 1 GiB is the order of what engines report as non-torch memory."""
