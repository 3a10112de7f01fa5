"""The `[engine]` table: the serving engine's batching limits, as vLLM names them, and its scheduler profile."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tokenpath.config.errors import UserError
from tokenpath.engine.batch_limits import SGLANG_SPECULATIVE_MAX_RUNNING, VLLM_V1_LARGE_GPU_LIMITS, decodes_a_step
from tokenpath.engine.cuda_graphs import PromptStepShape, sglang_prefill_capture_sizes
from tokenpath.engine.draft_slots import DraftHold
from tokenpath.engine.host_time import eager_host_paid, host_overlapped
from tokenpath.engine.kv_blocks import DEFAULT_BLOCK_SIZE
from tokenpath.engine.memory_share import KvMargin, ServerShape
from tokenpath.engine.profiles import DEFAULT_PROFILE, PROFILES, Profile, choices, listed, names_where, profiles_where
from tokenpath.engine.release import release_at_least
from tokenpath.engine.speculative import SpeculativeSpec

# Bounds far beyond any serving engine (vLLM's defaults are 256-1024 sequences and 2,048-16,384 tokens
# per step; TensorRT-LLM's largest published batch is 4,096 sequences and 23,552 tokens), which keep
# the per-step bookkeeping within memory.
MAX_NUM_SEQS = 2**20
MAX_STEP_TOKENS = 2**24
# vLLM's KV-cache block sizes run from 1 to 256 tokens; SGLang's page size is 1 to 64.
MAX_BLOCK_SIZE = 4096

# The scheduler's choices, in PROFILES' order (its error lists them).
Scheduler = Literal[tuple(PROFILES)]  # type: ignore[valid-type]
# The setting that mixes prompt chunks with decodes (Profile.prefills_alone_unless), as an error names it.
_MIXED_BY = {"chunked_prefill": "chunked prefill has", "mixed_chunk": "mixed chunks have"}


def _quoted_where(test: Callable[[Profile], bool]) -> str:
    """The profiles that pass `test` as an error suggests them: "a" or "b"."""
    return listed([f'"{name}"' for name in names_where(test)], "or")


class EngineSpec(BaseModel):
    """Continuous-batching limits, the scheduler profile, and which steps replay a captured CUDA graph.

    Limits: where the table leaves them out, the profile's for the scenario's chip (Profile.batch_limits,
    engine/batch_limits.py: vLLM V1 256 sequences and 2048 tokens on an A100 or a GPU under 70 GiB;
    SGLang's chunked prefill by the GPU's memory); otherwise, as here without a chip, 1024 sequences and
    8192 tokens per step, what vLLM's OpenAI server picks on a GPU with at least 70 GiB that is not an
    A100 (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults).
    CUDA graphs: unset, the profile's (engine/profiles.py): every step of vLLM V1 pays no per-kernel
    launch cost; TensorRT-LLM's PyTorch backend replays decode batches only, SGLang and vLLM V0 decode
    batches up to a size (engine/cuda_graphs.py). `cuda_graphs = "none"` is an eager engine (vLLM
    --enforce-eager), whose every step pays compute.efficiency.EAGER_KERNEL_LAUNCH_S per kernel.
    Scheduler profiles: engine/profiles.py, each with its sources (and MULTI_STEP there).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_num_seqs: int = Field(VLLM_V1_LARGE_GPU_LIMITS.max_num_seqs, ge=1, le=MAX_NUM_SEQS,
                              description="most sequences in one step, each rank's under attention data-parallel "
                                          "but SGLang's (unset: the profile's for the chip, "
                                          "engine/batch_limits.py; with a drafter, "
                                          f"{profiles_where(lambda p: p.speculative_max_running is not None)}'s "
                                          f"{SGLANG_SPECULATIVE_MAX_RUNNING} in its recent releases)")
    max_num_batched_tokens: int = Field(VLLM_V1_LARGE_GPU_LIMITS.max_num_batched_tokens, ge=1, le=MAX_STEP_TOKENS,
                                        description="most tokens (prefill + decode) in one step, each rank's "
                                                    "under attention data-parallel (SGLang's: the replica's, "
                                                    "divided among them) (unset: the profile's for the chip, "
                                                    "engine/batch_limits.py)")
    block_size: int = Field(DEFAULT_BLOCK_SIZE, ge=1, le=MAX_BLOCK_SIZE,
                            description="tokens per KV-cache block (unset: the profile's for its release: vLLM 16, "
                                        "64 from 0.34.0; 16 otherwise; engine/kv_blocks.py)")
    chunked_prefill: bool = Field(
        True, description="split long prompts across steps within the token budget; without, a prompt runs whole "
                          "in one step (unset: the profile's: "
                          f"{profiles_where(lambda p: not p.chunked_prefill)} off, as trtllm-serve starts, the others "
                          "on)")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1,
        description="share of memory the engine may use, as its own flag means it: for vLLM everything it "
                    "allocates (the KV cache takes what the weights and a step's activations leave), for SGLang the "
                    "weights and the KV pool (--mem-fraction-static), for TensorRT-LLM a share of what the weights "
                    "and a step leave (free_gpu_memory_fraction); from vLLM 0.34.0 on CUDA and ROCm a cap on the "
                    "cache it sizes from measured memory (unset: the profile's for its release: vLLM 0.9, 0.92 "
                    "from 0.20.0, all but a margin from 0.34.0; SGLang's rule of the GPU's memory and the "
                    "server's settings; TensorRT-LLM 0.9; engine/memory_share.py)")
    cuda_graphs: Literal["all", "decode", "none"] = Field(
        "all", description="steps that replay a captured CUDA graph: all (vLLM V1), decode (only steps where "
                           "every sequence decodes one token: SGLang, TensorRT-LLM, vLLM V0) or none (eager) "
                           "(unset: the profile's: decode under "
                           f"{profiles_where(lambda p: p.cuda_graphs == 'decode')}, all otherwise)")
    cuda_graph_max_tokens: int | None = Field(
        None, ge=0, le=MAX_STEP_TOKENS,
        description="largest step, in tokens, that replays a captured graph (unset: the profile's: the "
                    "engine's own limit, engine/cuda_graphs.py, under "
                    f"{profiles_where(lambda p: p.cuda_graph_max_bs is not None)}; any size otherwise)")
    cuda_graph_padding: bool = Field(
        True, description="a decode batch between the sizes captured is padded up to the next one; false: it runs "
                          "eagerly, as TensorRT-LLM's cuda_graph_config.enable_padding = false (unset: the profile's: "
                          f"{profiles_where(lambda p: not p.cuda_graph_padding)} unpadded, replaying only the sizes "
                          "it captures, engine/cuda_graphs.py; the others pad)")
    prefill_cuda_graphs: bool | None = Field(
        None, description=f"{profiles_where(lambda p: p.prefill_graphs is not None)} only: its prompt steps, up to "
                          "its prefill chunk (2,048 tokens for an MLA model), replay CUDA graphs broken around "
                          "attention (SGLang's piecewise, then breakable, prefill graphs; false: "
                          "--disable-prefill-cuda-graph; true: forced on, as --enforce-piecewise-cuda-graph) "
                          "(unset: as the release does: on NVIDIA GPUs from SGLang 0.5.10, unless the server's "
                          "shape turns them off, engine/cuda_graphs.py)")
    scheduler: Scheduler = Field(DEFAULT_PROFILE, description=f"the engine's profile: {choices()}")
    mixed_chunk: bool = Field(
        False, description=f"{profiles_where(lambda p: p.prefills_alone_unless == 'mixed_chunk')} only: decodes "
                           "join the prefill steps (SGLang --enable-mixed-chunk)")
    kv_admission: Literal["reserve", "on_demand"] = Field(
        "on_demand", description="reserve each request's whole KV cache at admission (TensorRT-LLM's "
                                 "GUARANTEED_NO_EVICT, the default there) or take blocks as it grows (MAX_UTILIZATION, "
                                 "as vLLM); unset: the profile's")
    host_overlap: bool | None = Field(
        None, description="the host prepares each step while the GPU runs the one before, so a step takes the "
                          "longer of the two and a busy engine's batch is formed when the step before starts "
                          f"(unset: the profile's: {profiles_where(lambda p: p.host_overlap)} yes, "
                          f"{profiles_where(lambda p: p.host_overlap_since is not None)} from the release that made "
                          "it the default (vLLM 0.14.0's async scheduling, engine/profiles.py), the others no; with a "
                          "drafter, no where the engine then turns its overlap off: engine/speculative.py)")
    eager_host: bool | None = Field(
        None, description="the host's Python launches the kernels of a step that replays no CUDA graph one by one, "
                          "paying its host time per kernel (engine/host_time.py); false: they are launched from "
                          "compiled code, as TensorRT-LLM's TensorRT engines (NIM's, and its releases before 1.0) "
                          "launch them (unset: the profile's: "
                          f"{profiles_where(lambda p: p.eager_host is not None)} yes, the others no)")
    nccl_nvls: bool = Field(
        True, description="NCCL may run the tensor-parallel all-reduces in the NVLink switches (NVLS) where the chips' "
                          "domain has them (SGLang --enable-nccl-nvls; false: NCCL_NVLS_ENABLE=0) (unset: the "
                          f"profile's: {profiles_where(lambda p: not p.nccl_nvls)} no, the others yes)")
    prefix_caching: bool = Field(
        True, description="keep the KV blocks of shared prompt prefixes and reuse them (vLLM V1's automatic "
                          "prefix caching, on by default; SGLang's RadixAttention; TensorRT-LLM's KV cache reuse): "
                          "see docs/prefix-caching.md (unset: the profile's: "
                          f"{profiles_where(lambda p: not p.prefix_caching)} off, the others on)")
    num_scheduler_steps: int = Field(
        1, ge=1, le=1024, description="decode steps per scheduler call (vLLM V0 --num-scheduler-steps), where "
                                   "prompts run in steps of their own")
    speculative: SpeculativeSpec | None = Field(
        None, description="speculative decoding: a drafter proposes tokens that one verify step accepts or not "
                          "(engine/speculative.py); the workload's draft_acceptance says how many are accepted")
    version: str | None = Field(
        None, min_length=1, max_length=200,
        description="the engine's release this scenario stands for, as a string (\"0.6.0\"): where a profile "
                    "names the release a behaviour arrived in, an earlier one runs without it (an MLA model's "
                    "attention: vLLM before 0.7.1 expands it per head; docs/model.md); unset, or text that "
                    "starts with no release number, the newest. `simulate` says whether the validated latency "
                    "rows cover it (docs/validation.md)")

    @model_validator(mode="before")
    @classmethod
    def _profile_defaults(cls, data: Any) -> Any:
        """The profile's defaults for the settings the table leaves out (an unknown profile is left
        to the scheduler's own check)."""
        if not isinstance(data, dict):
            return data
        scheduler = data.get("scheduler", DEFAULT_PROFILE)
        profile = PROFILES.get(scheduler) if isinstance(scheduler, str) else None
        if profile is None:
            return data
        defaults = {"kv_admission": profile.kv_admissions[0], "cuda_graphs": profile.cuda_graphs,
                    "prefix_caching": profile.prefix_caching, "nccl_nvls": profile.nccl_nvls,
                    "chunked_prefill": profile.chunked_prefill, "cuda_graph_padding": profile.cuda_graph_padding}
        defaults.update(profile.batch_limits(None, None, None).given())
        release = data.get("version") if isinstance(data.get("version"), str) else None
        block = profile.default_block_size
        defaults["block_size"] = block(release) if callable(block) else block
        if profile.host_overlap_since is not None and release_at_least(release, profile.host_overlap_since):
            defaults["host_overlap"] = True  # vLLM V1's async scheduling, on by default from its release
        speculative = data.get("speculative")
        if speculative is not None:  # what the engine changes when a drafter runs
            method = speculative.get("method") if isinstance(speculative, dict) else getattr(speculative, "method",
                                                                                            None)
            if profile.speculative_max_running is not None:
                defaults["max_num_seqs"] = profile.speculative_max_running(release)
            keeps = profile.speculative_overlap
            if keeps is not None and isinstance(method, str) and not keeps(method, release):
                defaults["host_overlap"] = False
        return {**defaults, **data}

    @field_validator("version", mode="before")
    @classmethod
    def _version_as_text(cls, value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ValueError(f"a release is text: quote it, version = \"{value}\" (--set 'engine.version=\"{value}\"')")
        return value

    @model_validator(mode="after")
    def _budget_covers_every_sequence(self) -> EngineSpec:
        # vLLM refuses this too (SchedulerConfig): every running sequence must be able to decode in every step.
        # TensorRT-LLM takes a smaller budget (Profile.budget_below_running), the decodes past it waiting (Profile.
        # decodes_past_budget), but none would run where it holds not one.
        width = self.decode_width
        if self.profile.budget_below_running:
            if self.max_num_batched_tokens < width:
                raise ValueError(
                    f"max_num_batched_tokens ({self.max_num_batched_tokens}) holds no decoding sequence's "
                    f"{width} tokens (its drafts and one more), so none would ever decode; raise "
                    f"max_num_batched_tokens to at least {width}")
        elif self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least max_num_seqs "
                f"({self.max_num_seqs}); raise max_num_batched_tokens or lower max_num_seqs"
            )
        return self

    @model_validator(mode="after")
    def _settings_fit_the_profile(self) -> EngineSpec:
        profile, mixes_by = self.profile, self.profile.prefills_alone_unless
        if self.mixed_chunk and mixes_by != "mixed_chunk":
            mixing = _quoted_where(lambda p: p.prefills_alone_unless == "mixed_chunk")
            raise ValueError(f"mixed_chunk applies to scheduler = {mixing} only; remove mixed_chunk")
        if self.mixed_chunk and not self.chunked_prefill:
            raise ValueError("mixed_chunk needs chunked_prefill = true (SGLang mixes decodes into chunked prefill "
                             "steps only); set chunked_prefill = true or mixed_chunk = false")
        if self.mixed_chunk and self.speculative is not None:
            raise ValueError("mixed_chunk with a drafter is not modelled: SGLang turns mixed chunks off with one "
                             "before 0.5.19 (server_args.py), and from 0.5.19 decodes one token a sequence in a "
                             "mixed step (arg_groups/speculative_hook.py); set mixed_chunk = false")
        if self.kv_admission not in profile.kv_admissions:
            offering = _quoted_where(lambda p: self.kv_admission in p.kv_admissions)
            raise ValueError(f"kv_admission = \"{self.kv_admission}\" is not {profile.engine}'s; use scheduler = "
                             f"{offering} or kv_admission = \"{profile.kv_admissions[0]}\"")
        if self.num_scheduler_steps > 1 and not self.prefills_alone:
            engine = f"{profile.engine} has" if mixes_by is None else _MIXED_BY[mixes_by]
            alone = _quoted_where(lambda p: p.prefills_alone_unless == "chunked_prefill")
            raise ValueError(f"num_scheduler_steps > 1 is vLLM V0's multi-step scheduling and {engine} none here; "
                             f"use scheduler = {alone} with chunked_prefill = false, or num_scheduler_steps = 1")
        if profile.chunk_unit == "block" and self.chunked_prefill and self.max_num_batched_tokens < self.block_size:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) is under one KV block "
                             f"({self.block_size} tokens), and {profile.engine} cuts prompt chunks to whole blocks, "
                             "so a longer prompt would never start; raise max_num_batched_tokens or lower block_size")
        if not self.cuda_graph_padding and profile.unpadded_graph_sizes is None:
            unpadded = _quoted_where(lambda p: p.unpadded_graph_sizes is not None)
            raise ValueError(f"cuda_graph_padding = false: {profile.engine} pads every decode batch to a size it "
                             f"captured; remove cuda_graph_padding, or use scheduler = {unpadded}")
        if self.prefill_cuda_graphs is not None and profile.prefill_graphs is None:
            graphing = _quoted_where(lambda p: p.prefill_graphs is not None)
            raise ValueError(f"prefill_cuda_graphs applies to scheduler = {graphing} only ({profile.engine}'s prompt "
                             "steps replay graphs as cuda_graphs says); remove prefill_cuda_graphs")
        since = profile.prefill_graphs_since
        if self.prefill_cuda_graphs and since is not None and not release_at_least(self.version, since):
            raise ValueError(f"prefill_cuda_graphs = true: {profile.engine} replays prompt steps as graphs from "
                             f"{since}; set version to {since} or later, or remove prefill_cuda_graphs")
        if self.eager_host and profile.eager_host is None:
            paying = _quoted_where(lambda p: p.eager_host is not None)
            raise ValueError(f"eager_host = true: {profile.engine} compiles its model and no host time per kernel is "
                             f"modelled for it; remove eager_host, or use scheduler = {paying}")
        if self.num_scheduler_steps > 1 and self.speculative is not None:
            raise ValueError("speculative decoding does not run with multi-step scheduling (vLLM V0 refuses the two "
                             "together); remove speculative or set num_scheduler_steps = 1")
        return self

    @property
    def profile(self) -> Profile:
        return PROFILES[self.scheduler]

    def pays(self, assumption: str) -> bool:
        """Whether this engine pays a host-time assumption (Profile.pays), its host time per eager kernel
        as eager_host leaves it (engine/host_time.eager_host_paid)."""
        if assumption == self.profile.eager_host:
            return eager_host_paid(self.scheduler, self.eager_host) == assumption
        return self.profile.pays(assumption)

    @property
    def whole_prompt_admission(self) -> bool:
        """Whether a waiting prompt is admitted only while the free KV blocks hold the whole of it, in this
        release (Profile.whole_prompt_admission_since)."""
        since = self.profile.whole_prompt_admission_since
        return since is not None and release_at_least(self.version, since)

    @property
    def prefills_alone(self) -> bool:
        """Whether prompts run in steps of their own while the decoding sequences pause: prefill-first
        without mixed chunks, and vLLM V0 without chunked prefill (Profile.prefills_alone_unless)."""
        mixes_by = self.profile.prefills_alone_unless
        return mixes_by is not None and not getattr(self, mixes_by)

    @property
    def decode_width(self) -> int:
        """The tokens a decoding sequence runs a step: one, or speculating its drafts and one more."""
        return 1 if self.speculative is None else self.speculative.num_speculative_tokens + 1

    def decodes_a_step(self) -> int:
        """The most decoding sequences a step runs: max_num_seqs, or where those past the token budget wait
        (Profile.decodes_past_budget), as many as max_num_batched_tokens holds at `decode_width` tokens each, and
        vLLM V1's one whose drafts it trims to the rest (engine/batch_limits.py, decodes_a_step)."""
        past = self.profile.decodes_past_budget
        if past == "run":
            return self.max_num_seqs
        return decodes_a_step(self.max_num_seqs, self.max_num_batched_tokens, self.decode_width, past == "trim")

    def rank_limits(self, ranks: int) -> tuple[int, int | None]:
        """Under attention data-parallel over `ranks`, each rank's running sequences and prompt tokens a step
        (None: no share of its own, without chunked prefill): the engine's limits each (vLLM's data-parallel
        engine cores, TensorRT-LLM's ranks), or SGLang's share of the server's (Profile.attention_dp_splits_budget:
        chunked_prefill_size // dp_size and max_running_requests // dp_size, arg_groups/parallel_hook.py)."""
        if not self.profile.attention_dp_splits_budget:
            return self.max_num_seqs, self.max_num_batched_tokens
        budget = max(self.max_num_batched_tokens // ranks, 1) if self.chunked_prefill else None
        return max(self.max_num_seqs // ranks, 1), budget

    def longest_request_tokens(self, kv_capacity_tokens: int, drafts: int | None = None) -> int:
        """The longest request (prompt and output) a KV cache of `kv_capacity_tokens` can finish, in whole
        blocks: reserving, its whole length and the `drafts` a verify step runs past it (None: this engine's
        speculative tokens) wait for their reservation; taking blocks as it grows, every token's KV but the
        last one's, which is never written, must fit, or it would be preempted and recomputed forever at
        its last block. vLLM refuses to start where its longest request does not fit the cache."""
        cache_tokens = kv_capacity_tokens // self.block_size * self.block_size
        if self.kv_admission != "reserve":
            hold = self.draft_hold()  # (an engine that keeps drafts' slots holds more past the last token)
            return cache_tokens + 1 - (0 if hold is None else hold.beyond_last_token)
        if drafts is None:
            drafts = 0 if self.speculative is None else self.speculative.num_speculative_tokens
        return cache_tokens - drafts

    def draft_hold(self) -> DraftHold | None:
        """What a decoding sequence holds for its drafts where this engine keeps their KV slots from step to
        step (Profile.draft_hold, engine/draft_slots.py); None without a drafter, or where it frees them."""
        rule = self.profile.draft_hold
        if self.speculative is None or rule is None:
            return None
        return rule(self.speculative.method, self.speculative.num_speculative_tokens,
                    host_overlapped(self.scheduler, self.host_overlap))

    @property
    def step_bounds_prompts(self) -> bool:
        """Whether the step's token budget bounds a prompt, which runs whole: without chunked prefill, unless
        the engine runs a longer one alone (Profile.long_prompt_alone: SGLang)."""
        return not self.chunked_prefill and not self.profile.long_prompt_alone

    @property
    def step_holds_whole_request(self) -> bool:
        """Whether one step must hold a request's whole length: where it bounds prompts (`step_bounds_prompts`)
        and sequences can be preempted (KV taken as it grows, not reserved), the recompute of its prompt
        and the tokens it generated runs in one step."""
        return self.step_bounds_prompts and self.kv_admission != "reserve"

    def whole_step_tokens(self, input_tokens, output_tokens):
        """The tokens of a request (ints, or arrays of them) that one step must hold whole, which
        max_num_batched_tokens bounds (the replica admits no more of a request than its step's budget),
        or None where the step bounds no prompt: its prompt, or its whole length (`step_holds_whole_request`)."""
        if not self.step_bounds_prompts:
            return None
        return input_tokens + output_tokens if self.step_holds_whole_request else input_tokens

    @property
    def latent_attention(self) -> bool:
        """Whether an MLA model's attention runs in its latent space in this release
        (Profile.latent_attention_since), or expanded per head."""
        since = self.profile.latent_attention_since
        return since is None or release_at_least(self.version, since)

    def memory_share(self, hbm_bytes: float, tp: int, pp: int, attention_dp: bool,
                     prefill_graph_tokens: int | None = None, mla: bool = False, generation: str = "") -> float:
        """`gpu_memory_utilization`, or the profile's on a GPU of `hbm_bytes` and `generation` ("": not
        known) for this server's shape (Profile.default_memory_share), its prompt steps replayed up to
        `prefill_graph_tokens` (None: none, prefill_graph_max_tokens) for an MLA model or not."""
        if self.gpu_memory_utilization is not None:
            return self.gpu_memory_utilization
        default = self.profile.default_memory_share
        if not callable(default):
            return default
        graph_max = self.graph_max_tokens(hbm_bytes, tp) or 0
        drafter = None if self.speculative is None else self.speculative.method
        captured = 0 if prefill_graph_tokens is None else len(sglang_prefill_capture_sizes(prefill_graph_tokens))
        share = default(ServerShape(self.version, hbm_bytes, tp, pp, self.max_num_batched_tokens, graph_max,
                                    attention_dp, drafter, captured, mla, generation))
        if share <= 0:  # the engine's rule reserves more than the GPU holds for these settings
            raise UserError(f"engine: {self.profile.engine}'s default memory share for max_num_batched_tokens = "
                            f"{self.max_num_batched_tokens} and CUDA graphs of up to {graph_max} sequences comes "
                            f"to {share:g} of the GPU's {hbm_bytes / 2**30:.3g} GiB; lower cuda_graph_max_tokens or "
                            "max_num_batched_tokens, or set engine.gpu_memory_utilization")
        return share

    @property
    def sets_own_running(self) -> bool:
        """Whether the engine sets its running requests from its KV cache (Profile.running_from_kv, SGLang's):
        the table leaves max_num_seqs out, so max_num_seqs holds a placeholder until the deployment is sized."""
        return self.profile.running_from_kv is not None and "max_num_seqs" not in self.model_fields_set

    def with_running_from_kv(self, kv_tokens: int, context_len: int, workers: int) -> EngineSpec:
        """This engine with the running requests its profile sets from a KV cache of `kv_tokens` over
        `workers` schedulers (data-parallel attention ranks) for a model of `context_len` tokens of context,
        where it sets them (`sets_own_running`); within the step's token budget, which the replica holds
        every running sequence's decode to. Itself otherwise."""
        rule = self.profile.running_from_kv
        if rule is None or not self.sets_own_running:
            return self
        running = min(workers * rule(kv_tokens // workers, context_len), self.max_num_batched_tokens)
        return self.model_copy(update={"max_num_seqs": running})

    @property
    def drafter_in_pool(self) -> bool:
        """Whether a drafter's weights and KV cache come out of the KV pool in this release
        (Profile.drafter_in_pool)."""
        rule = self.profile.drafter_in_pool
        return rule(self.version) if callable(rule) else rule

    @property
    def runs_finished_batch(self) -> bool:
        """Whether this release, overlapped and left with nothing else, runs the batch it formed for the
        sequences its last step finished (Profile.runs_finished_batch)."""
        rule = self.profile.runs_finished_batch
        return rule(self.version) if callable(rule) else rule

    @property
    def api_servers_per_replica(self) -> bool:
        """Whether this release runs an API-server process per data-parallel replica by default, or one
        for the server (Profile.api_servers)."""
        rule = self.profile.api_servers
        return (rule(self.version) if callable(rule) else rule) == "per-replica"

    def kv_margin(self, generation: str) -> KvMargin | None:
        """What this release keeps free beyond a step's activations where it sizes its KV cache from the
        memory it measures on a chip of `generation` (Profile.measured_kv_margin), or None where its share
        sizes it."""
        margin = self.profile.measured_kv_margin
        return None if margin is None else margin(self.version, generation)

    def sliding_pool_ratio(self, generation: str, architecture: str) -> float | None:
        """A sliding-window model's (of `architecture`) sliding-layer tokens per full-attention token in this
        release's KV pool on a chip of `generation` (Profile.sliding_pool_ratio), or None where the engine
        frees the blocks out of a window."""
        rule = self.profile.sliding_pool_ratio
        return None if rule is None else rule(self.version, generation, self.speculative is not None, architecture)

    def graph_max_tokens(self, hbm_bytes: float, tp: int) -> int | None:
        """`cuda_graph_max_tokens`, or the profile's on a GPU of `hbm_bytes` at `tp` in this release
        (None: any size)."""
        limit = self.profile.cuda_graph_max_bs if self.cuda_graph_max_tokens is None else self.cuda_graph_max_tokens
        return limit(hbm_bytes, tp, self.version) if callable(limit) else limit

    def prefill_graph_max_tokens(self, mla: bool, generation: str, pp: int, attention_dp: bool) -> int | None:
        """The largest prompt step that replays a graph, where the profile replays those apart from
        cuda_graphs (Profile.prefill_graphs), on a server of an MLA model or not, on chips of `generation`
        (catalog/chips.toml), at `pp` and with attention data-parallel or not; None: none."""
        rule = self.profile.prefill_graphs
        if rule is None or self.cuda_graphs == "none":
            return None
        shape = PromptStepShape(self.version, self.max_num_batched_tokens, mla, generation, pp, attention_dp,
                                self.speculative is not None)
        return rule(shape, self.prefill_cuda_graphs)

    def graph_batch_sizes(self, hbm_bytes: float, tp: int) -> frozenset[int] | None:
        """The only decode batch sizes that replay a graph, where batches are not padded (None: every
        size up to graph_max_tokens)."""
        rule = self.profile.unpadded_graph_sizes
        limit = self.graph_max_tokens(hbm_bytes, tp)
        if self.cuda_graph_padding or self.cuda_graphs == "none" or rule is None or limit is None:
            return None
        return rule(limit)
