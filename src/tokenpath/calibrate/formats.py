"""Measurements other benchmark clients saved, read as the phases `calibrate engine --from` fits
(calibrate/measured.py's `Measured`), the format told from the content:

- tokenpath bench results (JSONL under a `tokenpath.bench/1` header): probe.measured_from_results;
- `vllm bench serve --save-result --save-detailed` (vllm/benchmarks/serve.py; benchmarks/
  benchmark_serving.py before it): one JSON object per run (one per line with --append-result),
  whose per-request lists `ttfts`, `itls`, `input_lens`, `output_lens` and `errors` only
  --save-detailed keeps; recent versions add `start_times` (each request's send) and `latencies`;
- SGLang `python -m sglang.bench_serving --output-file F --output-details` (python/sglang/
  bench_serving.py): one JSON line per run with the same per-request lists (no send times);
- a guidellm report saved as JSON (`benchmarks.json`: GenerativeBenchmarksReport): one phase per
  benchmark of its `benchmarks`, from each request's start, prompt and output tokens, TTFT and
  inter-token latency (guidellm's schema version 2, and 0.2-0.3's `start_time` form).

Each phase keeps the requests that completed: their prompt and output tokens (vLLM's and SGLang's
prompt counts are the client's, so a chat run's get the scenario's template tokens added, as bench
results do), when each was sent (where the file says; else the sends the client scheduled: its
--request-rate drawn as a Poisson (gamma, with vLLM's --burstiness) process, at most its
--max-concurrency outstanding), and the medians of their TTFT and TPOT, (E2E - TTFT) / (tokens - 1)
per request. A vLLM or SGLang run's first prompt is held in the server's prefix cache from the client's
warm-up (CLIENT_WARMUP_PROMPTS). Anything a reader needs and a file lacks is a one-line UserError naming
the field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, ValidationError

from tokenpath.calibrate.measured import Measured
from tokenpath.config import files
from tokenpath.config.config_errors import explain
from tokenpath.config.errors import UserError, quoted
from tokenpath.prefixes import cached_prompts
from tokenpath.workload import Requests
from tokenpath.workload.arrivals import arrival_times_s, vllm_send_times_s
from tokenpath.workload.spec import (
    MAX_ARRIVAL_SPAN_S,
    MAX_BURSTINESS,
    MAX_RATE_PER_S,
    MAX_TOKENS,
    MIN_BURSTINESS,
    MIN_RATE_PER_S,
    ArrivalSpec,
)

FORMATS = ("a tokenpath bench results file, a `vllm bench serve --save-result --save-detailed` result, an SGLang "
           "`bench_serving --output-file --output-details` line or a guidellm report (.json)")
# The per-request lists a vLLM or SGLang result needs, and the flag that keeps them.
PER_REQUEST = ("ttfts", "itls", "input_lens", "output_lens")
KEEP_FLAG = {"vllm": "--save-result --save-detailed", "sglang": "--output-details"}
TOOL = {"vllm": "a vllm bench serve", "sglang": "an SGLang bench_serving"}
# Keys that only one client writes: SGLang names its E2E "e2e_latency" and retokenizes outputs; vLLM
# names it "e2el" and records its model and tokenizer ids.
SGLANG_KEYS = ("median_e2e_latency_ms", "mean_e2e_latency_ms", "total_output_tokens_retokenized", "dataset_name")
VLLM_KEYS = ("median_e2el_ms", "mean_e2el_ms", "model_id", "tokenizer_id", "burstiness", "endpoint_type")
# The scheduled sends a replay draws where a file has no send times (one fixed draw).
ARRIVAL_SEED = 0
# The requests with the run's first prompt that vLLM's and SGLang's clients send before the run: vLLM's
# initial test run (vllm/benchmarks/serve.py: `input_requests[0]`, then --num-warmups more of it) and
# SGLang's warm-up (python/sglang/bench_serving.py: --warmup-requests, default 1, `test_request =
# input_requests[0]`). A server with prefix caching holds that prompt when the run begins.
CLIENT_WARMUP_PROMPTS = 1

_FINITE = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)
# A token count as a file states it: one a prompt or completion may have (workload.spec.MAX_TOKENS).
_Tokens = Annotated[int, Field(ge=0, le=MAX_TOKENS)]


class _ClientRun(BaseModel):
    """What a vLLM or SGLang result gives per request (SGLang's script is vLLM's, adapted)."""

    model_config = _FINITE

    ttfts: list[NonNegativeFloat]                 # seconds
    itls: list[list[NonNegativeFloat]]
    input_lens: list[_Tokens]
    output_lens: list[_Tokens]
    errors: list[str | None] | None = None
    start_times: list[float] | None = None        # seconds, the client's clock
    latencies: list[NonNegativeFloat] | None = None
    request_rate: Annotated[float, Field(allow_inf_nan=True)] | str | None = None
    burstiness: float = Field(1.0, ge=MIN_BURSTINESS, le=MAX_BURSTINESS)
    ramp_up_strategy: str | None = None
    max_concurrency: int | None = Field(None, ge=1)
    backend: str | None = None
    endpoint_type: str | None = None


class _GuidellmRequest(BaseModel):
    """One request of a guidellm benchmark (its computed fields, as the report writes them)."""

    model_config = _FINITE

    prompt_tokens: _Tokens
    output_tokens: _Tokens
    time_to_first_token_ms: NonNegativeFloat
    inter_token_latency_ms: NonNegativeFloat | None = None
    request_start_time: float | None = None  # schema version 2
    start_time: float | None = None          # 0.2-0.3


def read_measured(path: str, chat_template_tokens: int = 0) -> list[Measured]:
    """The phases a measurement file holds (one for bench results, one per run or benchmark else)."""
    from tokenpath.bench.results import is_results_header
    from tokenpath.calibrate.probe import measured_from_results

    text = files.read_text(path, "the measurement file", files.MAX_DATA_BYTES)
    first = text.split("\n", 1)[0]
    head = _loads(first) if first.strip() else None
    if is_results_header(head):
        return [measured_from_results(path, chat_template_tokens=chat_template_tokens)]
    where = files.shown(path)
    stem = Path(path).stem
    documents = _documents(text, where)
    measured: list[Measured] = []
    for k, (line, document) in enumerate(documents):
        at = f"{where}:{line}" if len(documents) > 1 else where
        name = f"{stem}-{k + 1}" if len(documents) > 1 else stem
        kind = _kind(document, at)
        if kind == "guidellm":
            measured += _guidellm(document, at, name)
        else:
            measured.append(_client_run(document, kind, at, name, chat_template_tokens))
    return measured


# What `_loads` returns for text that is not JSON (None is JSON's null).
_NOT_JSON = object()


def _loads(text: str) -> Any:
    """JSON (with the Infinity and NaN Python's json writes), or _NOT_JSON where it is not."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _NOT_JSON


def _documents(text: str, where: str) -> list[tuple[int, Any]]:
    """(line, object) of the file: one JSON document, or JSON lines."""
    whole = _loads(text)
    if whole is not _NOT_JSON:
        return [(1, whole)]
    documents = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        document = _loads(line)
        if document is _NOT_JSON:
            raise UserError(f"{where}:{number}: not JSON; give {FORMATS}")
        documents.append((number, document))
    if not documents:
        raise UserError(f"{where}: empty; give {FORMATS}")
    return documents


def _kind(document: Any, where: str) -> Literal["vllm", "sglang", "guidellm"]:
    if isinstance(document, dict):
        if "benchmarks" in document:
            return "guidellm"
        if any(key in document for key in SGLANG_KEYS):
            return "sglang"
        if any(key in document for key in VLLM_KEYS):
            return "vllm"
    raise UserError(f"{where}: not a measurement tokenpath reads; give {FORMATS}")


def _checked(model: type[BaseModel], table: Any, where: str) -> Any:
    try:
        return model.model_validate(table)
    except ValidationError as error:
        raise UserError(explain(error, where, model)) from None


def _medians_s(ttft_s: np.ndarray, tpot_s: np.ndarray) -> tuple[float, float]:
    """TTFT and TPOT medians over the requests (TPOT's: those with 2+ tokens, nan where none has)."""
    return float(np.median(ttft_s)), float(np.median(tpot_s)) if len(tpot_s) else math.nan


def _rate(value: float | str | None, where: str) -> float:
    if value is None:
        return math.inf
    if isinstance(value, str):
        if value.strip().lower() in ("inf", "infinity"):
            return math.inf
        if value.strip() == "trace":  # SGLang's bench_serving --use-trace-timestamps
            raise UserError(f"{where}: request_rate: \"trace\": the run sent its requests at a trace's timestamps, "
                            "which the file does not hold, so its load cannot be replayed; calibrate from a run at a "
                            "request rate or a max concurrency")
        raise UserError(f"{where}: request_rate: {quoted(value)} is not a rate; the file is damaged")
    if value == math.inf:
        return math.inf
    if not MIN_RATE_PER_S <= value <= MAX_RATE_PER_S:
        raise UserError(f"{where}: request_rate: {value!r} must be from {MIN_RATE_PER_S:g} to {MAX_RATE_PER_S:g} "
                        "requests/s (or inf)")
    return float(value)


def _client_run(document: dict[str, Any], kind: Literal["vllm", "sglang"], where: str, name: str,
                chat_template_tokens: int) -> Measured:
    """A vLLM or SGLang run: its completed requests, sent when the file says (else as scheduled)."""
    missing = next((key for key in PER_REQUEST if key not in document), None)
    if missing is not None:
        raise UserError(f"{where}: {TOOL[kind]} result without per-request `{missing}`; rerun with "
                        f"{KEEP_FLAG[kind]}")
    run = _checked(_ClientRun, document, where)
    n = len(run.ttfts)
    for key in ("itls", "input_lens", "output_lens", "errors", "start_times", "latencies"):
        values = getattr(run, key)
        if values is not None and len(values) != n:
            raise UserError(f"{where}: `{key}` has {len(values)} entries and `ttfts` {n}; the file is damaged")
    if run.ramp_up_strategy is not None and run.start_times is None:
        raise UserError(f"{where}: a ramp-up run without per-request `start_times`; rerun with a vLLM that saves "
                        "them (--save-detailed)")
    ok = np.array([not (run.errors and run.errors[i]) and run.ttfts[i] > 0 and run.output_lens[i] >= 1
                   for i in range(n)], bool)
    if not ok.any():
        raise UserError(f"{where}: no request of it completed; nothing to fit")
    rate = _rate(run.request_rate, where)
    if run.start_times is not None:
        sent = np.array(run.start_times, np.float64)
        arrival_s = sent[ok] - sent[ok].min()
    else:  # as the client scheduled them: vLLM's rescaled to end at n / rate, SGLang's as drawn
        spec = ArrivalSpec(rate=rate, burstiness=run.burstiness)
        schedule = vllm_send_times_s if kind == "vllm" else arrival_times_s
        arrival_s = schedule(spec, n, np.random.default_rng(ARRIVAL_SEED))[ok]
        arrival_s -= arrival_s.min()
    _check_span(arrival_s, where, "start_times")
    order = np.argsort(arrival_s, kind="stable")
    chat = "chat" in (run.backend or run.endpoint_type or "")
    prompt = np.array(run.input_lens, np.int64)[ok] + (chat_template_tokens if chat else 0)
    outputs = np.array(run.output_lens, np.int64)[ok]
    ttft_s = np.array(run.ttfts, np.float64)[ok]
    if run.latencies is not None:
        decode_s = np.array(run.latencies, np.float64)[ok] - ttft_s
        if (decode_s < 0).any():
            i = int(np.flatnonzero(ok)[np.argmax(decode_s < 0)])
            raise UserError(f"{where}: request {i}'s `latencies` entry ({run.latencies[i]:g} s) is shorter than its "
                            f"`ttfts` entry ({run.ttfts[i]:g} s): a request ends after its first token; the file "
                            "is damaged")
    else:
        decode_s = np.array([sum(run.itls[i]) for i in range(n) if ok[i]], np.float64)
    several = outputs > 1
    ttft_med_s, tpot_med_s = _medians_s(ttft_s, decode_s[several] / (outputs[several] - 1))
    prompt = np.maximum(prompt[order], 1)
    warm = cached_prompts(prompt, np.flatnonzero(ok)[order] < CLIENT_WARMUP_PROMPTS)  # the file's first requests
    requests = Requests(arrival_s[order], prompt, outputs[order], prefixes=warm)
    return Measured(name, requests, np.ones(len(requests), bool), ttft_med_s, tpot_med_s, where,
                    run.max_concurrency, rate, sent=run.start_times is not None)


def _strategy(benchmark: dict[str, Any]) -> tuple[int | None, float]:
    """(concurrency, rate) of a guidellm benchmark's scheduling strategy (config.strategy; args.strategy
    before schema version 2): synchronous is one at a time, concurrent its streams."""
    holder = benchmark.get("config") if isinstance(benchmark.get("config"), dict) else benchmark.get("args")
    strategy = holder.get("strategy") if isinstance(holder, dict) else None
    if not isinstance(strategy, dict):
        return None, math.inf
    kind = strategy.get("type_")
    if kind == "synchronous":
        streams = 1
    else:
        streams = strategy.get("streams" if kind == "concurrent" else "max_concurrency")
    rate = strategy.get("rate") if kind in ("constant", "poisson") else None
    concurrency = streams if _number(streams) and isinstance(streams, int) and streams >= 1 else None
    return concurrency, float(rate) if _number(rate) and math.isfinite(rate) and rate > 0 else math.inf


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _guidellm(document: dict[str, Any], where: str, name: str) -> list[Measured]:
    """One phase per benchmark of a guidellm report: its successful requests, sent when they started;
    those that started within its measured window (after warm-up, before cool-down) counted."""
    benchmarks = document["benchmarks"]
    if not isinstance(benchmarks, list):
        raise UserError(f"{where}: a guidellm report whose `benchmarks` is not a list; give the report guidellm saved")
    if not benchmarks:
        raise UserError(f"{where}: a guidellm report with no benchmarks (`benchmarks` is empty): the run measured "
                        "nothing; give a report of a run that completed a benchmark")
    measured = []
    for j, benchmark in enumerate(benchmarks):
        at = f"{where}: benchmarks[{j}]"
        requests = benchmark.get("requests") if isinstance(benchmark, dict) else None
        successful = requests.get("successful") if isinstance(requests, dict) else None
        if not isinstance(successful, list) or not successful:
            raise UserError(f"{at}: a guidellm benchmark without per-request `requests.successful`; give a report "
                            "saved as JSON with its requests")
        made = _successful_made(benchmark)
        if made is not None and made > len(successful):
            raise UserError(f"{at}: keeps {len(successful)} of its {made} successful requests (a sample); a replay "
                            "needs every one: rerun guidellm keeping all requests (no sample size)")
        stats = [_checked(_GuidellmRequest, r, f"{at}.requests.successful[{i}]") for i, r in enumerate(successful)]
        start_s = np.array([_start(s, f"{at}.requests.successful[{i}]") for i, s in enumerate(stats)], np.float64)
        order = np.argsort(start_s, kind="stable")
        outputs = np.array([max(s.output_tokens, 1) for s in stats], np.int64)[order]
        prompt = np.array([max(s.prompt_tokens, 1) for s in stats], np.int64)[order]
        ttft_s = np.array([s.time_to_first_token_ms / 1e3 for s in stats], np.float64)[order]
        itl_s = np.array([(s.inter_token_latency_ms or 0.0) / 1e3 for s in stats], np.float64)[order]
        start_s = start_s[order]
        _check_span(start_s - start_s[0], at, "request_start_time")
        counted = _measured_window(benchmark, start_s)
        several = counted & (outputs > 1)
        ttft_med_s, tpot_med_s = _medians_s(ttft_s[counted], itl_s[several])
        concurrency, rate = _strategy(benchmark)
        measured.append(Measured(f"{name}-{j + 1}" if len(benchmarks) > 1 else name,
                                 Requests(start_s - start_s[0], prompt, outputs), counted, ttft_med_s, tpot_med_s,
                                 at, concurrency, rate))
    return measured


def _check_span(arrival_s: np.ndarray, where: str, key: str) -> None:
    """Sends that span more than MAX_ARRIVAL_SPAN_S cannot be replayed (nor held in int64 nanoseconds)."""
    span_s = float(arrival_s.max() - arrival_s.min()) if len(arrival_s) else 0.0
    if not span_s <= MAX_ARRIVAL_SPAN_S:
        raise UserError(f"{where}: the requests' `{key}` span {span_s:.3g} s; a run replayed spans at most "
                        f"{MAX_ARRIVAL_SPAN_S / 86400:.0f} days: the file is damaged, or its times are not seconds")


def _start(stats: _GuidellmRequest, where: str) -> float:
    start = stats.request_start_time if stats.request_start_time is not None else stats.start_time
    if start is None:
        raise UserError(f"{where}: no `request_start_time` (or `start_time`): when it was sent is needed")
    return start


def _successful_made(benchmark: dict[str, Any]) -> int | None:
    """How many requests succeeded in the run (scheduler_metrics.requests_made; request_totals before
    schema version 2), where the report says."""
    metrics = benchmark.get("scheduler_metrics")
    totals = metrics.get("requests_made") if isinstance(metrics, dict) else benchmark.get("request_totals")
    made = totals.get("successful") if isinstance(totals, dict) else None
    return made if _number(made) and isinstance(made, int) else None


def _measured_window(benchmark: dict[str, Any], start_s: np.ndarray) -> np.ndarray:
    """The requests that started within the benchmark's measured window (scheduler_metrics'
    measure_start_time to measure_end_time); every one where it states none, or none started in it."""
    metrics = benchmark.get("scheduler_metrics")
    bounds = [metrics.get(key) for key in ("measure_start_time", "measure_end_time")] if isinstance(metrics, dict) \
        else [None, None]
    if not all(_number(b) and math.isfinite(b) for b in bounds):
        return np.ones(len(start_s), bool)
    counted = (start_s >= bounds[0]) & (start_s <= bounds[1])
    return counted if counted.any() else np.ones(len(start_s), bool)
