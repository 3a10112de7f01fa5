"""vLLM V1's engine-core host time per decoding sequence: its own Scheduler, run on this machine's CPU.

Each step of vLLM V1's engine core calls `Scheduler.schedule()`, hands the batch to the model, then
`Scheduler.update_from_output()` with the tokens sampled, and encodes the outputs for the API server
(`EngineCoreOutputs`, msgpack). This script runs that loop with vLLM's own classes and no GPU: the
model's step is replaced by one sampled token a sequence. Every sequence decoding (prompts of 200
tokens, prefix caching on, 16-token blocks, as vLLM serves by default), it times the steps at
several batch sizes: the time a step takes grows in proportion to the sequences in it, and the median
over the sizes of that time per sequence is the registry's `host_per_sequence_s` (config/assumptions.py).
The GPU worker's own per-request work (preparing the batch's inputs) is not in it, so it is a floor.

It needs vLLM installed, which needs no GPU to import:

    python -m venv /tmp/vllm-venv && /tmp/vllm-venv/bin/pip install vllm==0.11.0
    /tmp/vllm-venv/bin/python benchmarks/vllm_scheduler_host.py [--sizes 16 64 256 1024] [--steps 200]

It does not import tokenpath (the two need not share an environment). vLLM wants a model's
config.json: the script writes a Llama-3.1-8B-shaped one to a temporary directory (the scheduler reads
no weights and, with skip_tokenizer_init, no tokenizer).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

BLOCK_TOKENS = 16
PROMPT_TOKENS = 200
WARMUP_STEPS = 20
# Llama-3.1-8B's shape (its config.json's fields the scheduler's ModelConfig reads)
MODEL_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
                "num_hidden_layers": 32, "vocab_size": 128256, "max_position_embeddings": 131072,
                "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "dtype": "bfloat16", "bos_token_id": 128000,
                "eos_token_id": 128001, "hidden_act": "silu", "tie_word_embeddings": False}


def make_scheduler(model_dir: str, max_seqs: int):
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    scheduler_config = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=max(8192, max_seqs),
                                       max_model_len=8192, enable_chunked_prefill=True)
    model_config = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="bfloat16", seed=0)
    cache_config = CacheConfig(block_size=BLOCK_TOKENS, gpu_memory_utilization=0.9, swap_space=0,
                               cache_dtype="auto", enable_prefix_caching=True)
    config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config, cache_config=cache_config,
                        device_config=DeviceConfig(device="cpu"))
    blocks = 200_000  # room for every sequence: no preemption
    cache_config.num_gpu_blocks = blocks
    kv_cache = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(BLOCK_TOKENS, 1, 1, torch.float32, False))])
    return Scheduler(vllm_config=config, kv_cache_config=kv_cache, log_stats=True,
                     structured_output_manager=StructuredOutputManager(config))


def step_seconds(model_dir: str, sequences: int, steps: int) -> list[float]:
    """The host time of `steps` all-decode steps of `sequences` sequences, one each."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.serial_utils import MsgpackEncoder

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK_TOKENS, sha256)
    scheduler = make_scheduler(model_dir, sequences)
    params = SamplingParams(ignore_eos=True, max_tokens=1_000_000)
    for i in range(sequences):
        scheduler.add_request(Request(request_id=str(i), prompt_token_ids=[i % 1000 + 1] * PROMPT_TOKENS,
                                      sampling_params=params, pooling_params=None, eos_token_id=2,
                                      block_hasher=hasher))
    encoder = MsgpackEncoder()
    times = []
    for k in range(steps + WARMUP_STEPS):
        start = time.perf_counter()
        batch = scheduler.schedule()
        ids = list(batch.num_scheduled_tokens)
        sampled = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: j for j, r in enumerate(ids)},
                                    sampled_token_ids=[[7] for _ in ids], logprobs=None, prompt_logprobs_dict={},
                                    pooler_output=[])
        outputs = scheduler.update_from_output(batch, sampled)
        for output in outputs.values():
            encoder.encode(output)
        elapsed = time.perf_counter() - start
        decoding = len(ids) == sequences and all(n == 1 for n in batch.num_scheduled_tokens.values())
        if k >= WARMUP_STEPS and decoding:
            times.append(elapsed)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512, 1024])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    import vllm

    with tempfile.TemporaryDirectory() as model_dir:
        Path(model_dir, "config.json").write_text(json.dumps(MODEL_CONFIG))
        medians = []
        for sequences in args.sizes:
            seconds = statistics.median(step_seconds(model_dir, sequences, args.steps))
            medians.append(seconds)
            print(f"vLLM {vllm.__version__}: {sequences:5d} decoding sequences, median step {seconds * 1e3:7.3f} ms "
                  f"({seconds / sequences * 1e6:5.2f} us a sequence)", flush=True)
    per_sequence = statistics.median(m / n for m, n in zip(medians, args.sizes))
    slope, intercept = np.polyfit(np.asarray(args.sizes, float), np.asarray(medians), 1)
    print(f"vLLM {vllm.__version__}: {per_sequence * 1e6:.2f} us a decoding sequence (median over the sizes); "
          f"least squares: {intercept * 1e3:.3f} ms + {slope * 1e6:.2f} us x sequences")


if __name__ == "__main__":
    main()
