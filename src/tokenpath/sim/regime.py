"""The regime a run falls in, as the validated latency rows are grouped (docs/validation.md, error bands):
the engine profile, the load, the model's family and the chip's generation.

The load regime is read off the run itself, from what `result_document` already weighs:

- overloaded: the run's own verdict (diagnose/overload.py: it was offered more than it served);
- saturated: otherwise, requests wait for their first step for at least SATURATED_QUEUE_SHARE of
  their mean TTFT (diagnose/felt.py's split): the engine has more work than it admits at once;
- light: otherwise, the mean batch is under LIGHT_MAX_BATCH_SEQS sequences: most steps run one
  request, so latency is the unloaded one;
- moderate: the rest: requests share steps and wait little.

An engine's busy share does not separate them: a continuous-batching engine runs steps whenever it
holds a request, so it reads 95-100% busy on every latency row, one request at a time included.
"""

from __future__ import annotations

from typing import Any

from tokenpath.compute.model_spec import ModelSpec

LOAD_REGIMES = ("light", "moderate", "saturated", "overloaded")
# A mean batch under two sequences: most steps run a single request.
LIGHT_MAX_BATCH_SEQS = 2.0
# Requests waiting for a slot longer than the engine takes to make their first token.
SATURATED_QUEUE_SHARE = 0.5
MODEL_FAMILIES = ("dense", "MoE", "MLA")


def model_family(model: ModelSpec) -> str:
    """"MLA" for multi-head latent attention (DeepSeek's, MoE or not: its attention sets its KV cache and
    decode cost), else "MoE" for routed experts, else "dense"."""
    if model.is_mla:
        return "MLA"
    return "MoE" if model.is_moe else "dense"


def load_regime(overloaded: bool, queue_share_of_ttft: float, mean_batch_seqs: float) -> str:
    """The load regime of a run (the module's docstring says how)."""
    if overloaded:
        return "overloaded"
    if queue_share_of_ttft >= SATURATED_QUEUE_SHARE:
        return "saturated"
    if mean_batch_seqs < LIGHT_MAX_BATCH_SEQS:
        return "light"
    return "moderate"


def regime_block(scheduler: str, engine_version: str | None, chip: str, chip_generation: str, model: ModelSpec,
                 overloaded: bool, ttft_parts_s: dict[str, float], mean_batch_seqs: float,
                 speculative: str | None = None, locked_loop: bool = False,
                 attention_dp: bool = False) -> dict[str, Any]:
    """The result document's `regime`: its four keys (engine, load, model_family, chip_generation), the
    chip, engine version, speculative method (None: none), whether it runs attention data-parallel and
    whether it is a closed loop of fixed lengths through the front end (`locked_loop`), which the envelope
    also checks, and the two figures the load regime was read from."""
    total_s = sum(value for part, value in ttft_parts_s.items() if part != "application")  # the model's TTFT
    queue_share = ttft_parts_s.get("queue", 0.0) / total_s if total_s > 0 else 0.0
    return {"engine": scheduler, "load": load_regime(overloaded, queue_share, mean_batch_seqs),
            "model_family": model_family(model), "chip_generation": chip_generation, "chip": chip,
            "engine_version": engine_version, "speculative": speculative, "attention_dp": attention_dp,
            "locked_loop": locked_loop,
            "queue_share_of_ttft": queue_share,
            "mean_batch_seqs": mean_batch_seqs}
