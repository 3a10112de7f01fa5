"""The `[workload]` tables of a scenario: pydantic models, validated at the edge.

Unknown keys and values of the wrong type are errors. Problems are raised as pydantic
`ValidationError`s whose location names the field (e.g. `input`) and whose message says the fix;
the scenario layer turns them into a one-line `UserError`.
"""

from __future__ import annotations

import math
import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from tokenpath.config.files import PathText
from tokenpath.config.units import Duration

LengthKind = Literal["fixed", "normal", "lognormal", "uniform", "empirical", "sharegpt"]
TraceFormat = Literal["azure", "burstgpt", "mooncake"]

_CONFIG = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False, ser_json_inf_nan="strings")

# Fields each kind needs, and the ones it may take (min and max apply to every kind).
_REQUIRED = {
    "fixed": ("value",),
    "normal": ("mean", "sd"),
    "lognormal": ("mean", "sd"),
    "uniform": ("mean", "range_ratio"),
    "empirical": ("path",),
    "sharegpt": (),
}
_OPTIONAL = {"empirical": ("column",)}
_PER_KIND = ("value", "mean", "sd", "range_ratio", "path", "column")
# The most tokens one prompt or completion may have, in specs and traces alike.
MAX_TOKENS = 2**31 - 1
# The most requests one run takes: at about 1.2 kB of results per request (docs/model.md: 1M requests of the
# default scenario peak at 1.2 GB), 10M requests need about 12 GB. Trace replays are capped the same.
MAX_REQUESTS = 10_000_000
# Arrivals may span at most a year: public LLM serving traces cover days to months (Azure's 2024 trace:
# one week), and a longer span is nearly always a unit mistake (milliseconds read as seconds); it also
# keeps every simulated time far inside int64 nanoseconds (292 years).
MAX_ARRIVAL_SPAN_S = 365 * 86400.0
# Arrival rates from one request every 11.6 days to 10^9 per second ("inf" sends all at once), gamma
# shapes from very bursty to nearly constant, trace speed-ups from a millionth to a million.
MIN_RATE_PER_S, MAX_RATE_PER_S = 1e-6, 1e9
MIN_BURSTINESS, MAX_BURSTINESS = 1e-3, 1e3
MIN_TIME_SCALE, MAX_TIME_SCALE = 1e-6, 1e6
# A normal spec whose draws land at or above `min` less often than this would resample for too long.
_MIN_ACCEPT_PROBABILITY = 1e-3
# Tokens a chat endpoint's template adds to a one-message prompt, tokens(rendered conversation) less
# tokens(message text), measured on the question of delivery/chat_template.py (any message gives the same):
# - 3 with the default tokenizer, Mistral's Tekken (tekken_240911.json rendered by mistral-common 1.13.1's
#   encode_chat_completion: <s>[INST]...[/INST]);
# - 10 with Llama 3's template (Meta-Llama-3-8B-Instruct, delivery/chat_template.py's LLAMA3_TEMPLATE rendered
#   by its `render`) tokenized by Llama 3's own BPE (meta-llama/llama-models models/llama3/tokenizer.model
#   through tiktoken with that repository's pattern and special tokens): <|begin_of_text|>, user and assistant
#   headers of 4 tokens each (llama-models' test_tokenizer.py lists them), <|eot_id|>;
# - 35 with Llama 3.1's and 3.3's, whose template writes a system header even when no system message is given
#   ("Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024"), same tokenizer.
CHAT_TEMPLATE_EXAMPLES = "3 (Mistral's Tekken), 10 (Llama 3), 35 (Llama 3.1 and 3.3)"


def _invalid(reason: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_workload", "{reason}", {"reason": reason})


def _resolve(path: str, base_dir: str | os.PathLike[str]) -> str:
    return path if os.path.isabs(path) else os.path.join(base_dir, path)


class LengthSpec(BaseModel):
    """How many tokens a request's prompt (or completion) has.

    - fixed: every request has `value` tokens.
    - normal: `int(gauss(mean, sd))` as LLMPerf draws it: truncated toward zero, redrawn while below `min`.
    - lognormal: lognormal whose resulting token count has mean `mean` and standard deviation `sd`,
      rounded to the nearest integer.
    - uniform: vLLM's random dataset, integers uniform in
      [floor(mean * (1 - range_ratio)), ceil(mean * (1 + range_ratio))], both ends included
      (lengths.py, uniform_bounds).
    - empirical: drawn with replacement from the integers in `path`: one per line, or, when `column`
      is given, that column of a CSV file with a header row.
    - sharegpt: ShareGPT V3 prompts or completions as vLLM's and SGLang's benchmark clients sample them
      (workload/sharegpt.py: the published means of the pairs the clients' filter keeps, a pair outside
      it drawn again).

    Every kind is then clipped to [`min`, `max`] (`max` defaults to MAX_TOKENS).
    """

    model_config = _CONFIG

    kind: LengthKind
    value: int | None = Field(None, ge=1, le=MAX_TOKENS)
    mean: float | None = Field(None, ge=0, le=MAX_TOKENS)
    sd: float | None = Field(None, ge=0, le=MAX_TOKENS)
    range_ratio: float | None = Field(None, ge=0, lt=1)
    path: PathText | None = None
    column: str | None = Field(None, max_length=200)
    min: int = Field(1, ge=1, le=MAX_TOKENS)
    max: int | None = Field(None, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _check_kind(self) -> LengthSpec:
        required = _REQUIRED[self.kind]
        missing = [name for name in required if getattr(self, name) is None]
        if missing:
            raise _invalid(f"kind {self.kind!r} needs {' and '.join(required)}; missing {', '.join(missing)}")
        allowed = required + _OPTIONAL.get(self.kind, ())
        unused = [name for name in _PER_KIND if name not in allowed and getattr(self, name) is not None]
        if unused:
            raise _invalid(f"kind {self.kind!r} does not use {', '.join(unused)}; remove it or change kind")
        if self.max is not None and self.max < self.min:
            raise _invalid(f"max {self.max} is below min {self.min}; raise max or lower min")
        if self.kind == "fixed" and not self.min <= self.value <= (self.max or self.value):
            raise _invalid(f"value {self.value} lies outside [min, max]; change value or the bounds")
        if self.kind == "lognormal" and self.mean < 1:
            raise _invalid(f"kind 'lognormal' needs mean >= 1 token, got {self.mean:g}")
        if self.mean is not None and self.max is not None and self.mean > self.max:
            raise _invalid(f"mean {self.mean:g} lies above max {self.max}: every draw would come out below its mean; "
                           "raise max or lower mean")
        if self.kind == "lognormal":
            median = self.mean / math.sqrt(1.0 + (self.sd / self.mean) ** 2)  # a lognormal's, from its mean and sd
            if median < self.min:
                raise _invalid(f"mean {self.mean:g} and sd {self.sd:g} put the median draw at {median:.3g} tokens, "
                               f"below min {self.min}: most draws would be clipped to it and the mean missed; lower sd")
        if self.kind == "normal" and self._accept_probability() < _MIN_ACCEPT_PROBABILITY:
            raise _invalid(
                f"mean {self.mean:g} and sd {self.sd:g} put almost no draws at or above min {self.min}; "
                "raise mean or sd, or lower min"
            )
        return self

    def _accept_probability(self) -> float:
        """P(int(gauss(mean, sd)) >= min); for an integer min >= 1 that is P(gauss(mean, sd) >= min)."""
        if self.sd == 0:
            return 1.0 if self.mean >= self.min else 0.0
        return 0.5 * math.erfc((self.min - self.mean) / (self.sd * math.sqrt(2.0)))

    def resolve_paths(self, base_dir: str | os.PathLike[str]) -> LengthSpec:
        """A copy whose relative `path` is taken relative to `base_dir`."""
        if self.path is None:
            return self
        return self.model_copy(update={"path": _resolve(self.path, base_dir)})


class ArrivalSpec(BaseModel):
    """When requests are sent.

    - gamma: inter-arrival gaps drawn from a gamma distribution with shape `burstiness` and mean
      1/`rate` (vLLM bench's --request-rate and --burstiness); burstiness 1 is a Poisson process,
      lower is burstier. The first request goes at t = 0 and the gaps are kept as drawn; vLLM's client
      sends its first after one gap and rescales the sends to end at n / rate (arrivals.py).
    - constant: request i goes at i / `rate`.

    `rate` is in requests per second; `"inf"` sends every request at t = 0 (an offline batch).
    """

    model_config = _CONFIG

    rate: float = Field(10.0, allow_inf_nan=True)
    burstiness: float = Field(1.0, ge=MIN_BURSTINESS, le=MAX_BURSTINESS)
    pattern: Literal["gamma", "constant"] = "gamma"

    @model_validator(mode="after")
    def _burstiness_needs_gamma(self) -> ArrivalSpec:
        if self.pattern == "constant" and "burstiness" in self.model_fields_set and self.burstiness != 1.0:
            raise _invalid(f"burstiness {self.burstiness:g} shapes gamma gaps, and pattern \"constant\" draws none; "
                           "remove burstiness or set pattern = \"gamma\"")
        return self

    @field_validator("rate", mode="before")
    @classmethod
    def _read_inf(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
            return math.inf
        return value

    @field_validator("rate")
    @classmethod
    def _check_rate(cls, value: float) -> float:
        if value == math.inf:
            return value
        if not MIN_RATE_PER_S <= value <= MAX_RATE_PER_S:
            raise _invalid(f"rate {value!r} must be a number of requests/s from {MIN_RATE_PER_S:g} to "
                           f"{MAX_RATE_PER_S:g}, or \"inf\" to send all at t = 0")
        return value


class TraceSpec(BaseModel):
    """A recorded trace to replay: its arrival times and token counts replace the generated ones.

    Formats: azure (Azure LLM inference trace CSV), burstgpt (BurstGPT CSV), mooncake (Mooncake JSONL).
    Trace inter-arrival times are divided by `time_scale` (2.0 replays twice as fast).
    """

    model_config = _CONFIG

    path: PathText
    format: TraceFormat
    time_scale: float = Field(1.0, ge=MIN_TIME_SCALE, le=MAX_TIME_SCALE)

    def resolve_paths(self, base_dir: str | os.PathLike[str]) -> TraceSpec:
        """A copy whose relative `path` is taken relative to `base_dir`."""
        return self.model_copy(update={"path": _resolve(self.path, base_dir)})


class SharedPrefixSpec(BaseModel):
    """Prompts that begin alike (system prompts, few-shot templates): a `fraction` of requests, chosen
    at random, start with one of `count` distinct shared prompts of `tokens` tokens, chosen uniformly;
    the drawn prompt length follows it (a request's prompt is `tokens` + its drawn input length)."""

    model_config = _CONFIG

    count: int = Field(1, ge=1, le=MAX_REQUESTS, description="distinct shared prefixes")
    tokens: int = Field(1000, ge=1, le=MAX_TOKENS // 2, description="tokens in each shared prefix")
    fraction: float = Field(1.0, ge=0, le=1, description="share of requests that start with one")


# A session has at most this many turns: long agent conversations in public traces run to hundreds of
# turns (LMSYS-Chat-1M's longest), and each turn's prompt repeats the whole history before it.
MAX_TURNS = 1000


class SessionSpec(BaseModel):
    """Multi-turn conversations: each session is `turns` requests (a number, or token-length style
    distribution of counts), each turn's prompt the whole history (earlier prompts and answers) plus a
    new message drawn from `input`, its answer from `output` (drawn counts are clipped to MAX_TURNS). A
    turn is sent `think_time` after the previous answer's last byte reaches the client
    (`think_distribution` "exponential": drawn with that mean), so each session is a closed loop;
    sessions start by the arrival process."""

    model_config = _CONFIG

    turns: int | LengthSpec = Field(3, description="turns per session: a count, or a distribution of counts")
    think_time: Duration = Field(5.0, description="wait between an answer's last byte and the next turn")
    think_distribution: Literal["fixed", "exponential"] = "fixed"

    @field_validator("turns")
    @classmethod
    def _check_turns(cls, value: int | LengthSpec) -> int | LengthSpec:
        return check_turns(value)


def check_turns(value: int | LengthSpec) -> int | LengthSpec:
    """A count of turns, or a distribution of counts, within 1 to MAX_TURNS (a pydantic field check)."""
    if isinstance(value, int) and not 1 <= value <= MAX_TURNS:
        raise _invalid(f"turns {value} must be from 1 to {MAX_TURNS}")
    if isinstance(value, LengthSpec):
        for name in ("value", "max"):
            if (getattr(value, name) or 0) > MAX_TURNS:
                raise _invalid(f"turns: {name} {getattr(value, name)} is above {MAX_TURNS}; lower it")
    return value


class WorkloadSpec(BaseModel):
    """What requests look like. The default is LLMPerf's workload (ray-project/llmperf
    token_benchmark_ray.py): input tokens normal(550, 150), output tokens normal(150, 80), here sent
    as a Poisson process at 10 requests/s, 2000 requests. Drawn as LLMPerf draws them (a draw truncated
    to a whole number, one of 0 or less drawn again: utils.py's sample_random_positive_int), the outputs
    have mean 155.3 and sd 74.2, the inputs 549.6 and 149.9.

    When `trace` is given, arrivals and lengths come from the trace and the `input`, `output` and
    `arrival` tables are ignored; `num_requests` then caps how many trace rows are taken (the first N
    in time order). With `sessions`, requests are the turns of multi-turn conversations and `num_requests`
    counts turns (the last session may be cut short); the arrival process then starts sessions.
    `max_concurrency` caps the requests outstanding at once (a closed loop); None leaves the loop open.
    `chat_template_tokens` are added to each drawn message, after any shared prefix, as a chat server's
    template adds them; a session's later turns carry every earlier message's ("auto" is counted by the
    scenario, which owns the tokenizer). The first `warmup_requests` are served but not measured.
    Relative file paths are taken relative to the current directory unless `resolve_paths` is called.
    """

    model_config = _CONFIG

    num_requests: int = Field(2000, ge=1, le=MAX_REQUESTS)
    warmup_requests: int = Field(
        0, ge=0, le=MAX_REQUESTS, description="the first requests sent, run but left out of every metric "
                                              "in the same continuous run (vLLM's bench serve and AIPerf "
                                              "instead let their warm-up finish before they measure: simulate "
                                              "their measured requests alone, with 0 here)")
    max_concurrency: int | None = Field(None, ge=1, le=MAX_REQUESTS)
    chat_template_tokens: int | Literal["auto"] = Field(
        0, description="tokens a chat endpoint's template adds to every prompt (role headers, special tokens, a "
                       "default system prompt): the engine prefills and caches them, the client's input_tokens "
                       f"leave them out. A one-message chat adds {CHAT_TEMPLATE_EXAMPLES}; "
                       "\"auto\": what the default tokenizer's template adds; 0: a completions endpoint")
    draft_acceptance: float | None = Field(
        None, ge=0, le=1, description="with speculative decoding ([engine.speculative]): the chance that a drafted "
                                      "token is accepted when every draft before it was, a property of the text and "
                                      "the drafter (DeepSeek-V3 reports 0.85-0.9 for its MTP layer's token)")
    input: LengthSpec = LengthSpec(kind="normal", mean=550, sd=150)
    output: LengthSpec = LengthSpec(kind="normal", mean=150, sd=80)
    arrival: ArrivalSpec = ArrivalSpec()
    trace: TraceSpec | None = None
    shared_prefix: SharedPrefixSpec | None = None
    sessions: SessionSpec | None = None

    @field_validator("chat_template_tokens", mode="before")
    @classmethod
    def _check_template_tokens(cls, value: object) -> object:
        whole = isinstance(value, int) and not isinstance(value, bool)
        if value == "auto" or (whole and 0 <= value <= MAX_TOKENS // 2):
            return value
        raise _invalid(f"use a whole number of tokens from 0 to {MAX_TOKENS // 2}, or \"auto\" for what the default "
                       "tokenizer's chat template adds")

    @model_validator(mode="after")
    def _measures_something(self) -> WorkloadSpec:
        if self.warmup_requests >= self.num_requests:
            raise _invalid(f"warmup_requests {self.warmup_requests} leaves none of the {self.num_requests} requests "
                           "to measure; lower warmup_requests or raise num_requests")
        if self.trace is not None and self.chat_template_tokens != 0:
            raise _invalid("a trace's token counts are the server's own, its chat template's included; remove "
                           "chat_template_tokens or trace")
        if self.trace is not None and self.shared_prefix is not None:
            raise _invalid("shared_prefix applies to generated requests, not to a trace (a mooncake trace names its "
                           "shared blocks in hash_ids); remove one of them")
        if self.sessions is not None:
            for name in ("trace", "shared_prefix", "max_concurrency"):
                if getattr(self, name) is not None:
                    raise _invalid(f"sessions are closed loops of generated requests and do not combine with {name}; "
                                   f"remove {name} or sessions")
        return self

    def resolve_paths(self, base_dir: str | os.PathLike[str]) -> WorkloadSpec:
        """A copy whose relative trace and empirical-length paths are taken relative to `base_dir`
        (e.g. the directory of the scenario file)."""
        update = {"input": self.input.resolve_paths(base_dir), "output": self.output.resolve_paths(base_dir)}
        if self.trace is not None:
            update["trace"] = self.trace.resolve_paths(base_dir)
        if self.sessions is not None and isinstance(self.sessions.turns, LengthSpec):
            update["sessions"] = self.sessions.model_copy(update={"turns": self.sessions.turns.resolve_paths(base_dir)})
        return self.model_copy(update=update)
