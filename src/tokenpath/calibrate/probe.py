"""The engine probe: a short, designed set of bench runs against a server, each one a phase.

- singles: one request at a time across prompt lengths: the prefill's cost against its length (TTFT);
- closed loops at a few concurrencies: the decode step's cost against the batch (TPOT);
- a short ramp: open-loop arrivals at two fractions of the throughput the largest loop reached, where
  queueing starts.

Each phase's results are a bench results file, so a probe can be fitted again later (`--from`). The
load is bounded (a fixed number of requests per phase, each capped in length) and the probe stops
itself when its time budget is spent: a phase in flight gets what remains as its time limit (its
request in flight then fails, and the ones not yet sent are not sent), and the phases after it are
not run. A phase that gets no valid answer for any other reason (an error status, a body that is not
an OpenAI stream) stops the probe at once with what the server answered.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenpath.bench import Target, read_results, run_bench
from tokenpath.bench.results import build_run, failures
from tokenpath.bench.stream import SKIPPED, TIMEOUT
from tokenpath.calibrate.measured import Measured, statistics_s
from tokenpath.config.errors import UserError
from tokenpath.sim.scenario import Scenario, build_scenario, set_path
from tokenpath.workload import Requests

DEFAULT_PROMPT_LENS = (128, 512, 2048)
DEFAULT_CONCURRENCIES = (1, 4, 16, 64)
DEFAULT_OUTPUT_LEN = 64
SINGLES_PER_LENGTH = 3
# Each phase's first request is sent but not counted: it opens the connection and finds the server's
# caches cold (its TTFT reads several ms long on loopback).
WARMUP_REQUESTS = 1
LOOP_WAVES = 3          # a closed loop of c runs LOOP_WAVES * c requests (at least 6)
RAMP_FRACTIONS = (0.5, 0.85)  # of the largest loop's measured requests/s
RAMP_BUDGET_SHARE = 0.1       # each ramp phase sends its arrivals over this share of the budget
MIN_RAMP_REQUESTS = 8


@dataclass(frozen=True)
class Phase:
    """One bench run of the probe: fixed lengths, a concurrency cap (closed loop) or a rate."""

    name: str
    input_len: int
    output_len: int
    num_requests: int
    concurrency: int | None = None
    rate: float = math.inf

    def overrides(self) -> dict[str, object]:
        return {"workload.input": {"kind": "fixed", "value": self.input_len},
                "workload.output": {"kind": "fixed", "value": self.output_len},
                "workload.num_requests": self.num_requests + WARMUP_REQUESTS,
                "workload.warmup_requests": WARMUP_REQUESTS,
                "workload.max_concurrency": self.concurrency, "workload.arrival.rate": self.rate,
                "workload.arrival.burstiness": 1.0}


def measured_from_results(path: str, name: str | None = None, chat_template_tokens: int = 0) -> Measured:
    """A bench results file as a probe phase (any bench run serves: its own workload is replayed).

    Its requests' prompts are what the engine prefilled, as a simulation's are: the server's own count
    where it reported one; else the client's, plus `chat_template_tokens` when the run went to a chat
    endpoint (whose server adds its template's tokens to what the client counted)."""
    header, rows = read_results(path)
    shared, sessions = header.get("shared_prefix_requests") or 0, header.get("sessions") or 0
    if shared or sessions:  # (replayed as prompts of their own, the server's cache hits would read as a fast GPU)
        what = (f"{shared:,} of its requests start with a shared prefix" if shared else
                f"its {sessions:,} multi-turn sessions send each turn's history again")
        raise UserError(f"--from {path}: {what}, which the server's prefix cache holds and the fit does not "
                        "replay as cached; calibrate from a run without workload.shared_prefix or sessions")
    ok = [row for row in rows if row["ok"]]
    if len(ok) < 1:
        raise UserError(f"--from {path}: no request of it completed; nothing to fit")
    sent_ns = np.array([row["sent_ns"] for row in ok], np.int64)
    order = np.argsort(sent_ns, kind="stable")
    sent_s = (sent_ns[order] - sent_ns[order[0]]) / 1e9
    template = chat_template_tokens if header.get("endpoint") == "chat" else 0
    prompt = np.array([row.get("prompt_tokens_server") or row["input_tokens"] + template for row in ok],
                      np.int64)[order]
    outputs = np.array([sum(row["arrival_tokens"]) for row in ok], np.int64)[order]
    requests = Requests(sent_s.astype(np.float64), np.maximum(prompt, 1), np.maximum(outputs, 1))
    workload = header.get("scenario", {}).get("table", {}).get("workload", {})
    warmup = workload.get("warmup_requests", 0) if isinstance(workload, dict) else 0
    warmup = warmup if isinstance(warmup, int) and not isinstance(warmup, bool) else 0
    counted = np.array([row["i"] >= warmup for row in ok])[order]
    if not counted.any():
        counted[:] = True
    ttft_s, tpot_s = statistics_s(build_run([ok[k] for k in order]), counted)
    arrival = workload.get("arrival", {}) if isinstance(workload, dict) else {}
    rate = arrival.get("rate", math.inf) if isinstance(arrival, dict) else math.inf
    return Measured(name or Path(path).stem, requests, counted, ttft_s, tpot_s, str(path),
                    workload.get("max_concurrency") if isinstance(workload, dict) else None,
                    float(rate) if isinstance(rate, (int, float)) else math.inf)


def first_phases(prompt_lens: tuple[int, ...], concurrencies: tuple[int, ...], output_len: int,
                 max_context: int) -> list[Phase]:
    """Singles across prompt lengths, then closed loops (prompts of the middle length)."""
    lengths = [n for n in prompt_lens if n + output_len <= max_context] or [max(1, max_context - output_len)]
    singles = [Phase(f"single-{n}", n, min(output_len, 16), SINGLES_PER_LENGTH, concurrency=1) for n in lengths]
    middle = sorted(lengths)[len(lengths) // 2]
    loops = [Phase(f"loop-{c}", middle, output_len, max(6, LOOP_WAVES * c), concurrency=c) for c in concurrencies]
    return singles + loops


def ramp_phases(loop: Measured, input_len: int, output_len: int, sending_s: float) -> list[Phase]:
    """Open-loop arrivals at fractions of the requests/s the largest closed loop sustained, each
    sending for about `sending_s`."""
    loop_s = float(loop.requests.arrival_s[-1]) + loop.decode_s * output_len + loop.ttft_s
    rate = len(loop.requests) / loop_s if loop_s > 0 else 0.0
    if not rate > 0 or not math.isfinite(rate):
        return []
    return [Phase(f"ramp-{f:g}", input_len, output_len, max(MIN_RAMP_REQUESTS, round(f * rate * sending_s)),
                  rate=round(f * rate, 3)) for f in RAMP_FRACTIONS]


def phase_scenario(table: dict, source: str, base_dir: Path | None, phase: Phase) -> Scenario:
    table = {key: (dict(value) if isinstance(value, dict) else value) for key, value in table.items()}
    for dotted, value in phase.overrides().items():
        set_path(table, dotted, value)
    return build_scenario(table, source, base_dir)


def run_probe(table: dict, source: str, base_dir: Path | None, target: Target, folder: Path, budget_s: float,
              max_context: int, prompt_lens: tuple[int, ...] = DEFAULT_PROMPT_LENS,
              concurrencies: tuple[int, ...] = DEFAULT_CONCURRENCIES, output_len: int = DEFAULT_OUTPUT_LEN,
              tokenizer: str | None = None, progress: Callable[[str, int, int], None] | None = None,
              clock: Callable[[], float] = time.monotonic) -> tuple[list[Measured], list[str]]:
    """Run the phases in order until the budget is spent: (what each measured, the phases skipped)."""
    from tokenpath.bench import load_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    start = clock()
    loaded = load_tokenizer(tokenizer)  # once: every phase builds its prompts with it
    phases = first_phases(prompt_lens, concurrencies, output_len, max_context)
    measured: list[Measured] = []
    skipped: list[str] = []
    ramp_added = False
    k = 0
    while k < len(phases):
        phase = phases[k]
        k += 1
        left_s = budget_s - (clock() - start)
        if left_s <= 0:
            skipped.append(phase.name)
            continue
        scenario = phase_scenario(table, source, base_dir, phase)
        path = folder / f"{phase.name}.jsonl"
        path.unlink(missing_ok=True)  # a results file from an earlier probe is replaced, not appended to
        report = None if progress is None else (lambda done, failed, name=phase.name: progress(name, done, failed))
        limit_s = max(left_s, 1.0)
        rows = run_bench(scenario, target, str(path), loaded, workers=1, progress=report,
                         timeouts={"request_timeout_s": limit_s, "run_timeout_s": limit_s}).rows
        if not any(row["ok"] for row in rows):
            refused = [row for row in rows if row["error"] not in (TIMEOUT, SKIPPED)]
            if refused:
                raise UserError(f"calibrate engine: {target.base_url} gave no valid answer in phase {phase.name} "
                                f"({failures(refused, 1)[0]}); check that it is an OpenAI-compatible server of "
                                f"--model {target.model!r} at --endpoint {target.endpoint}")
            skipped.append(phase.name)  # the budget ran out before an answer completed
            continue
        measured.append(measured_from_results(str(path), phase.name, scenario.chat_template_tokens()))
        if not ramp_added and phase.name.startswith("loop-") and k == len(phases):
            ramp_added = True
            loops = [m for m in measured if m.name.startswith("loop-")]
            if loops:
                phases += ramp_phases(loops[-1], phases[-1].input_len, output_len, RAMP_BUDGET_SHARE * budget_s)
    return measured, skipped
