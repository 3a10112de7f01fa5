"""Speculative decoding: the `[engine.speculative]` table, how many tokens a verify step accepts, and
whether each engine keeps its overlap scheduler with a drafter (its profile's `speculative_overlap`).

A drafter proposes `num_speculative_tokens` = k tokens after each decoding sequence's last one; the
target model then runs one step over the k + 1 positions of every sequence (the verify step: k + 1
query tokens and k + 1 LM-head rows a sequence), accepts the drafts up to the first it disagrees
with and samples one token of its own after them. A sequence so gains 1 to k + 1 tokens a step
(vLLM V1's `SpecDecodeBaseProposer` and `RejectionSampler`, vllm/v1/spec_decode/ and
vllm/v1/sample/rejection_sampler.py; SGLang's `EAGLEWorker`, python/sglang/srt/speculative/; the
method names are the engines'):

- "mtp": the model's own multi-token-prediction layers (DeepSeek-V3, Qwen3-Next, GLM-4.5): one
  decoder layer of the model's shape and its LM head per drafted token;
- "eagle", "eagle3": a one-layer draft head on the target's hidden states (EAGLE, EAGLE-3), dense at
  the target's width, with its own LM head (EAGLE-3's over a 32,000-token draft vocabulary);
- "ngram": tokens looked up in the prompt and the text so far (prompt lookup): no GPU work;
- "draft_model": a smaller model of the catalog (`draft_model`), run k times a step.

What each drafter costs on the chip: compute/drafter.py.

Whether a draft is accepted is a property of the text and the drafter, so it is the workload's
(`workload.draft_acceptance`): the chance that a drafted token is accepted when every draft before it
was. With that chance a, a verify step accepts j < k drafts with probability a^j (1 - a) and all k
with a^k, so a sequence gains (1 - a^(k+1)) / (1 - a) tokens a step on average.

In the simulation every decoding sequence of a step gains the same number of tokens, drawn per step
(`Acceptance`): each sequence's tokens per step follow the distribution above and its mean, but the
sequences of one step move together. Drafted tokens' KV slots beyond those accepted are given back
after the step, except where the engine keeps them (vLLM V1, whose block tables hold every verify token's
slot and its lookahead until the request ends; SGLang's speculative V2 worker, which holds its committed
tokens and two verify steps more: engine/draft_slots.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tokenpath.engine.release import release_at_least

# Drafts per step beyond any engine's published setting (vLLM and SGLang examples use 1 to 7).
MAX_SPECULATIVE_TOKENS = 16
# Acceptance draws are made in blocks of this many steps (one numpy call each).
_DRAW_BLOCK = 4096

Method = Literal["mtp", "eagle", "eagle3", "ngram", "draft_model"]


class SpeculativeSpec(BaseModel):
    """`[engine.speculative]`: the drafter and how many tokens it proposes a step."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    method: Method = Field(description="the drafter: mtp (the model's own MTP layers), eagle or eagle3 (a one-layer "
                                       "draft head), ngram (prompt lookup, no GPU work) or draft_model (a "
                                       "smaller model, named in draft_model)")
    num_speculative_tokens: int = Field(ge=1, le=MAX_SPECULATIVE_TOKENS,
                                        description="tokens drafted per sequence and step (vLLM's "
                                                    "num_speculative_tokens, SGLang's speculative_num_steps)")
    draft_model: str | None = Field(None, min_length=1, description="method draft_model only: the draft "
                                                                    "model's catalog name or config.json path")

    @model_validator(mode="after")
    def _draft_model_named(self) -> SpeculativeSpec:
        if self.method == "draft_model" and self.draft_model is None:
            raise ValueError("method = \"draft_model\" needs draft_model, the draft's catalog name "
                             "(`tokenpath models`) or config.json path")
        if self.method != "draft_model" and self.draft_model is not None:
            raise ValueError(f"draft_model applies to method = \"draft_model\" only; remove it for {self.method}")
        return self

    def mean_tokens(self, acceptance: float) -> float:
        """The tokens a decoding sequence gains a verify step on average at `acceptance`."""
        return mean_tokens_per_step(acceptance, self.num_speculative_tokens)

    def describe(self, acceptance: float) -> str:
        """One line for reports: the drafter and the mean tokens a step at `acceptance`."""
        drafter = f"draft model {self.draft_model}" if self.method == "draft_model" else self.method
        return (f"speculative {drafter}, {self.num_speculative_tokens} drafts a step, acceptance {acceptance:g}: "
                f"{self.mean_tokens(acceptance):.2f} tokens a step")


def sglang_keeps_overlap(method: str, release: str | None) -> bool:
    """Whether SGLang keeps its overlap scheduler with a drafter: from 0.5.11, whose speculative V2 worker
    (SGLANG_ENABLE_SPEC_V2, True by default from then in srt/environ.py) overlaps EAGLE, EAGLE3, their
    MTP (NEXTN) and STANDALONE drafters; earlier releases, and NGRAM, turn it off (server_args.py,
    disable_overlap_schedule)."""
    return method != "ngram" and release_at_least(release, "0.5.11")


def trtllm_keeps_overlap(method: str, release: str | None) -> bool:
    """Whether TensorRT-LLM's PyTorch backend keeps its overlap scheduler with a drafter: not for n-gram
    drafts (SpeculativeDecodingMode.support_overlap_scheduler, tensorrt_llm/_torch/speculative/
    interface.py, false for NGRAM in every release read; py_executor_creator.py then disables it)."""
    return method != "ngram"


def vllm_keeps_async_scheduling(method: str, release: str | None) -> bool:
    """Whether vLLM V1 keeps its default async scheduling with a drafter (vllm/config/vllm.py,
    `async_scheduling is None`, read in 0.14.0, 0.15.0, 0.20.0, 0.26.0, 0.31.0, 0.33.0 and 0.34.0): EAGLE,
    EAGLE-3 and MTP drafts always; a draft model from 0.31; n-gram drafts (its CPU proposer) from 0.33,
    where the check applies to the V1 model runner only and the V2 runner is the default."""
    if method == "draft_model":
        return release_at_least(release, "0.31")
    if method == "ngram":
        return release_at_least(release, "0.33")
    return True


# The first vLLM release that gives the MTP layer's LM head the target's weights.
VLLM_MTP_SHARED_HEAD_SINCE = "0.16.0"


def mtp_head_shared(engine: str, release: str | None) -> bool:
    """Whether the engine (an engine profile's name, engine/profiles.py) gives an MTP drafter the target's
    LM head rather than holding the one it loads (compute/drafter.py, `shared_with_target`).
    vLLM V1's MTP model computes its logits with each layer's `shared_head.head` (deepseek_mtp.py,
    `DeepSeekMultiTokenPredictor.compute_logits`), loaded from the checkpoint (DeepSeek-V3's stores it at
    model.layers.61.shared_head.head). Before 0.16.0 `EagleProposer.load_model` (vllm/v1/spec_decode/
    eagle.py, read in 0.14.0 and 0.15.1) sets only the draft's unused `lm_head` to the target's, so the
    loaded head stays; from 0.16.0 `_maybe_share_lm_head` also makes each `shared_head.head` the target's
    (`VLLM_MTP_SHARED_HEAD_SINCE`). vLLM V0 is taken as before 0.16.0. SGLang gives its NEXTN drafter the
    target's head (eagle_worker_v2.py, `init_lm_head`: `set_embed_and_head`, read in 0.5.23);
    TensorRT-LLM's loader is not read here and is taken as sharing it."""
    if engine == "vLLM V0":
        return False
    if engine == "vLLM V1":
        return release_at_least(release, VLLM_MTP_SHARED_HEAD_SINCE)
    return True


def mean_tokens_per_step(acceptance: float, drafts: int) -> float:
    """Expected tokens a sequence gains per verify step: (1 - a^(k+1)) / (1 - a), k + 1 at a = 1."""
    if acceptance >= 1.0:
        return drafts + 1.0
    return (1.0 - acceptance ** (drafts + 1)) / (1.0 - acceptance)


@dataclass(frozen=True)
class Speculation:
    """A deployment's speculative decoding as its replicas run it: `drafts` per step, accepted with
    `acceptance`; each replica draws its steps' tokens from a stream seeded with `seed` (the same for
    every replica, so a run does not depend on how its replicas are spread over processes)."""

    drafts: int
    acceptance: float
    seed: int

    @property
    def width(self) -> int:
        """Query tokens a decoding sequence runs in a verify step: its drafts and one more."""
        return self.drafts + 1

    @property
    def mean_tokens(self) -> float:
        """The tokens a decoding sequence gains a verify step on average."""
        return mean_tokens_per_step(self.acceptance, self.drafts)

    def draws(self) -> Acceptance:
        return Acceptance(self.acceptance, self.drafts, self.seed)


class Acceptance:
    """Tokens gained per verify step (1 + drafts accepted), drawn from the distribution in the module
    docstring with a seeded generator: the same seed gives the same steps."""

    def __init__(self, acceptance: float, drafts: int, seed: int) -> None:
        if not 0.0 <= acceptance <= 1.0:
            raise ValueError(f"acceptance must be within [0, 1], got {acceptance}")
        self.acceptance, self.drafts = acceptance, drafts
        self._rng = np.random.default_rng(seed)
        self._block: list[int] = []

    def next(self) -> int:
        """The tokens every decoding sequence gains in the next verify step."""
        if not self._block:
            self._block = self._draw(_DRAW_BLOCK)
        return self._block.pop()

    def _draw(self, n: int) -> list[int]:
        a, k = self.acceptance, self.drafts
        if a <= 0.0 or a >= 1.0:
            return [1 if a <= 0.0 else k + 1] * n
        # P(accepted >= j) = a^j, so accepted = floor(log u / log a) for u uniform on (0, 1], capped at k.
        u = 1.0 - self._rng.random(n)
        accepted = np.minimum(np.floor(np.log(u) / math.log(a)), k).astype(np.int64)
        return (accepted + 1).tolist()
