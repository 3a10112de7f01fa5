"""bench: measure a real OpenAI-compatible server under a scenario's workload, in the shared schema.

    plan, header = build_plan(scenario, Target(base_url, model), tokenizer, name)
    outcome = execute(plan, "results.jsonl", header)
    summary = bench_summary(*read_results("results.jsonl"))

`run_bench` does all three.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenpath.bench.plan import Target, build_plan, default_workers, preflight, workload_requests
from tokenpath.bench.prompts import PromptBuilder, corpus_text
from tokenpath.bench.results import RESULTS_SCHEMA, bench_summary, build_run, read_results, token_times
from tokenpath.bench.runner import Outcome, Plan, execute
from tokenpath.bench.stream import MAX_EVENT_BYTES
from tokenpath.bench.tokenizer import Tokenizer, load_tokenizer, tokenizer_name
from tokenpath.sim.scenario import Scenario

__all__ = [
    "RESULTS_SCHEMA", "BenchResult", "Outcome", "Plan", "PromptBuilder", "Target", "Tokenizer", "bench_summary",
    "build_plan", "build_run", "corpus_text", "default_workers", "execute", "load_tokenizer", "preflight",
    "read_results", "run_bench", "token_times", "workload_requests",
]


@dataclass(frozen=True)
class BenchResult:
    summary: dict[str, Any]
    header: dict[str, Any]
    rows: list[dict[str, Any]]
    outcome: Outcome


def run_bench(scenario: Scenario, target: Target, results_path: str, tokenizer: str | Tokenizer | None = None,
              workers: int | None = None, timeouts: dict[str, float | None] | None = None,
              progress: Callable[[int, int], None] | None = None, kernel_timestamps: bool = True,
              max_event_bytes: int = MAX_EVENT_BYTES, unique_prompts: bool = True) -> BenchResult:
    """Measure `target` under `scenario`'s workload; every finished request goes to `results_path`."""
    loaded = tokenizer if tokenizer is not None and not isinstance(tokenizer, str) else load_tokenizer(tokenizer)
    name = tokenizer_name(loaded, tokenizer if isinstance(tokenizer, str) else None)
    requests = workload_requests(scenario)
    plan, header = build_plan(scenario, target, loaded, name, requests, timeouts, kernel_timestamps=kernel_timestamps,
                              max_event_bytes=max_event_bytes, unique_prompts=unique_prompts)
    count = workers if workers is not None else default_workers(scenario, requests)
    outcome = execute(plan, results_path, header, count, progress)
    header, rows = read_results(results_path)
    return BenchResult(bench_summary(header, rows), header, rows, outcome)
