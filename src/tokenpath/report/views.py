"""What a report draws, read from any of the inputs it takes: a simulation in memory, a summary
JSON, a per-request results file (Parquet, CSV, JSONL), a bench results JSONL, a levers JSON
(`tokenpath levers --json`), a sweep Parquet (`tokenpath sweep`) or a search JSON (`tokenpath search
--json`).

A `RunView` is one run: its summary always, and what else its input has (per-request rows, ITL
gaps, one request's token times, the engine's steps, the roofline of one step). Charts are drawn
from what is there and say what is not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tokenpath.config import files
from tokenpath.config.errors import UserError
from tokenpath.sim.run import Run
from tokenpath.sim.summary import check_summary
from tokenpath.whatif.search import SCHEMA as SEARCH_SCHEMA

# Rows kept for charts: every chart's data is embedded in the HTML file, so a run of a million
# requests is shown through an even sample of its requests and steps (the summary's numbers are
# over all of them).
MAX_STEP_ROWS = 2_000
MAX_ITL_SAMPLES = 20_000
# What the search chart reads of each candidate.
SEARCH_COLUMNS = ("request_rate_per_chip", "ttft_p99_s")


@dataclass
class RunView:
    label: str
    summary: dict[str, Any]
    scenario_lines: list[tuple[str, str]] = field(default_factory=list)
    requests: Any = None                # pandas DataFrame of report.requests columns
    itl_s: np.ndarray | None = None     # gaps between text arrivals (a sample)
    reader: dict[str, Any] | None = None  # one request's token arrivals: {"request", "arrival_s", "first_visible_s"}
    steps: Any = None                   # pandas DataFrame: replica, start_s, step_s, seqs, tokens
    explain: dict[str, Any] | None = None


@dataclass
class Inputs:
    runs: list[RunView] = field(default_factory=list)
    levers: dict[str, Any] | None = None
    sweep: Any = None                   # pandas DataFrame, one row per point
    sweep_name: str = ""
    search: dict[str, Any] | None = None  # a search document (tokenpath.search/1)


def _reader_request(run: Run, warmup: int) -> dict[str, Any] | None:
    """The token arrivals of the measured completed request (after the first `warmup`) with the median E2E
    (a typical one)."""
    if run.token_client_ns is None:
        return None
    run = run.after(warmup)
    done = np.flatnonzero(run.completed & (run.output_tokens > 1))
    if len(done) == 0:
        return None
    i = int(done[np.argsort(run.e2e_ns[done], kind="stable")[len(done) // 2]])
    times = run.token_client_ns[run.token_offsets[i]:run.token_offsets[i + 1]] - run.sent_ns[i]
    return {"request": warmup + i, "arrival_s": (times / 1e9).tolist(),
            "first_visible_s": float(run.ttfv_ns[i] / 1e9)}


def _itl_sample(run: Run, warmup: int) -> np.ndarray | None:
    """The gaps between text arrivals of the measured requests (after the first `warmup`), or an even
    sample of them."""
    if run.token_client_ns is None:
        return None
    gaps = run.after(warmup).itl_ns()
    if len(gaps) > MAX_ITL_SAMPLES:
        gaps = np.sort(gaps)[np.linspace(0, len(gaps) - 1, MAX_ITL_SAMPLES).astype(np.int64)]
    return gaps / 1e9


def _requests_frame(run: Run, warmup: int, ids: np.ndarray | None = None) -> Any:
    import pandas as pd

    from tokenpath.report.requests import request_columns

    return pd.DataFrame(request_columns(run, warmup, ids))


def from_simulation(sim: Any, document: dict[str, Any], lines: list[tuple[str, str]], label: str) -> RunView:
    """A simulation in memory: everything."""
    import pandas as pd

    from tokenpath.report.explain import explain

    warmup = sim.scenario.workload.warmup_requests
    frames = []
    for replica, trace in enumerate(sim.traces):
        frames.append(pd.DataFrame({
            "replica": replica, "start_s": trace.step_start_ns / 1e9,
            "step_s": (trace.step_compute_ns + trace.step_traffic_ns + trace.step_blocking_ns) / 1e9,
            "seqs": trace.step_seqs, "tokens": trace.step_tokens,
        }))
    steps = pd.concat(frames, ignore_index=True) if frames else None
    if steps is not None and len(steps) > MAX_STEP_ROWS:
        steps = steps.iloc[np.linspace(0, len(steps) - 1, MAX_STEP_ROWS).astype(np.int64)]
    return RunView(label, document, lines, _requests_frame(sim.run, warmup), _itl_sample(sim.run, warmup),
                   _reader_request(sim.run, warmup), steps, document.get("explain") or explain(sim))


def from_bench(header: dict[str, Any], rows: list[dict[str, Any]], run: Run, summary: dict[str, Any],
               lines: list[tuple[str, str]], label: str) -> RunView:
    """A measured run (`run`: the rows' build_run): its requests and token arrivals (no attribution,
    steps or roofline)."""
    from tokenpath.bench.results import warmup_rows

    ids = np.array([row["i"] for row in rows], dtype=np.int64)
    warmup = warmup_rows(header, rows)
    return RunView(label, summary, lines, _requests_frame(run, warmup, ids), _itl_sample(run, warmup),
                   _reader_request(run, warmup))


def summary_lines(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """Scenario lines from a summary alone."""
    from tokenpath.report.simulation import assumptions_line

    scenario = summary.get("scenario", {})
    lines = [("scenario", f"{scenario.get('name')} (fingerprint {str(scenario.get('fingerprint'))[:12]})"),
             ("source", str(summary.get("source")))]
    if summary.get("source") == "simulate":
        lines.append(("assumptions", assumptions_line(scenario.get("assumptions"))))
    return lines


def _load_json(path: str) -> Any:
    try:
        return json.loads(files.read_text(path, "report input", 1 << 30))
    except json.JSONDecodeError as error:
        raise UserError(f"{files.shown(path)}: not JSON ({error.msg} at line {error.lineno}); give a --json file "
                        "of simulate, bench or levers") from None


def _check_summary(document: Any, path: str) -> dict[str, Any]:
    return check_summary(document, files.shown(path), "; give the --json of simulate or bench")


def _check_levers(document: dict[str, Any], path: str) -> dict[str, Any]:
    where = files.shown(path)
    _check_summary(document.get("baseline"), f"{path} (its baseline)")
    objective = document.get("objective")
    if not isinstance(objective, dict) or not isinstance(objective.get("name"), str):
        raise UserError(f"{where}: 'objective' must be an object with a 'name'; give the --json of `tokenpath levers`")
    if not isinstance(document.get("levers"), list):
        raise UserError(f"{where}: 'levers' must be a list of levers; give the --json of `tokenpath levers`")
    for k, lever in enumerate(document["levers"]):
        if not isinstance(lever, dict) or not isinstance(lever.get("name"), str):
            raise UserError(f"{where}: levers[{k}] has no 'name'; the file is damaged")
        if not isinstance(lever.get("change"), dict):
            raise UserError(f"{where}: levers[{k}] has no 'change' object; the file is damaged")
    return document


def _check_search(document: dict[str, Any], path: str) -> dict[str, Any]:
    where = files.shown(path)
    candidates = document.get("candidates")
    if not isinstance(candidates, list):
        raise UserError(f"{where}: 'candidates' must be a list; give the --json of `tokenpath search`")
    for k, row in enumerate(candidates):
        if not isinstance(row, dict) or not all(isinstance(row.get(key), (int, float)) for key in SEARCH_COLUMNS):
            raise UserError(f"{where}: candidates[{k}] lacks a number in {', '.join(SEARCH_COLUMNS)}; the file is "
                            "damaged")
        _check_summary(row.get("summary"), f"{path} (candidates[{k}].summary)")
    return document


def load_inputs(paths: list[str]) -> Inputs:
    """Read every input, telling each kind by its contents (see the module's docstring)."""
    from tokenpath.report.requests import META_SCHEMA, read_results_table

    inputs = Inputs()
    for path in paths:
        label = Path(path).name
        if not files.exists(path):
            raise UserError(f"{files.shown(path)}: no such results file; give a summary JSON, a bench or per-request "
                            "results file, or a sweep")
        suffix = Path(path).suffix.lower()
        if suffix == ".json":
            document = _load_json(path)
            if isinstance(document, dict) and "levers" in document:
                inputs.levers = _check_levers(document, path)
                continue
            if isinstance(document, dict) and document.get("schema") == SEARCH_SCHEMA:
                inputs.search = _check_search(document, path)
                continue
            summary = _check_summary(document, path)
            inputs.runs.append(RunView(label, summary, summary_lines(summary), explain=summary.get("explain")))
        elif suffix == ".jsonl" and _is_bench_file(path):
            from tokenpath.bench import read_results
            from tokenpath.bench.results import bench_summary, build_run
            from tokenpath.report.bench import describe_bench

            header, rows = read_results(path)
            run = build_run(rows, header)
            summary = bench_summary(header, rows, run)
            inputs.runs.append(from_bench(header, rows, run, summary, describe_bench(header, rows, path), label))
        elif suffix == ".parquet" and not _has_schema(path, META_SCHEMA):
            inputs.sweep, inputs.sweep_name = _read_sweep(path), label
        elif suffix in (".parquet", ".csv", ".jsonl"):
            frame, summary, lines = read_results_table(path)
            if "e2e_s" not in frame.columns:
                if any(str(column).startswith("latency_s.") for column in frame.columns):  # a sweep's rows
                    raise UserError(f"{files.shown(path)}: a sweep's table written as {suffix}; report reads a sweep "
                                    "from its .parquet: rerun the sweep with --out NAME.parquet")
                raise UserError(f"{files.shown(path)}: not a tokenpath bench results file, nor per-request results (no "
                                "'e2e_s' column); give the --results file of bench, simulate or report")
            summary = summary or _summary_of(frame)
            inputs.runs.append(RunView(label, summary, lines or summary_lines(summary), frame))
        else:
            raise UserError(f"{files.shown(path)}: unknown kind of file; give a .json summary or levers, a results "
                            ".parquet/.csv/.jsonl, a bench .jsonl or a sweep .parquet")
    if len(inputs.runs) > 2:
        raise UserError(f"report: {len(inputs.runs)} runs given; a report shows one run, or two side by side")
    if len(inputs.runs) == 2:
        from tokenpath.report.compare import run_names

        names = run_names(inputs.runs[0].summary, inputs.runs[1].summary)
        for run, name in zip(inputs.runs, names or ()):
            run.label = f"{run.label} ({name})"
    if not inputs.runs and inputs.levers is not None:
        baseline = inputs.levers["baseline"]
        inputs.runs.append(RunView("baseline", baseline, summary_lines(baseline)))
    if not inputs.runs and inputs.search is not None and inputs.search["candidates"]:
        best = inputs.search["candidates"][0]  # the run at its capacity
        inputs.runs.append(RunView(f"best: {best['layout']} at {best['request_rate']:.4g} req/s", best["summary"],
                                   summary_lines(best["summary"])))
    return inputs


def _is_bench_file(path: str) -> bool:
    """Whether the file's first line names a bench results schema, this version's or another's (which
    `read_results` refuses, naming both)."""
    from tokenpath.bench.results import RESULTS_SCHEMA

    family = RESULTS_SCHEMA.rpartition("/")[0] + "/"
    with open(path, "rb") as handle:
        return family.encode() in handle.readline(1 << 20)


def _has_schema(path: str, key: bytes) -> bool:
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(path).metadata or {}
    except Exception as error:  # pyarrow raises several kinds for a file that is not Parquet
        raise UserError(f"{files.shown(path)}: cannot read it as Parquet ({error})") from None
    return key in meta


def _read_sweep(path: str) -> Any:
    import pyarrow.parquet as pq

    frame = pq.read_table(path).to_pandas()
    if not any(name.startswith("latency_s.") for name in frame.columns):
        raise UserError(f"{files.shown(path)}: neither a results file nor a sweep (no 'latency_s.*' columns); "
                        "give the Parquet of `tokenpath sweep` or of --results")
    return frame


def _summary_of(frame: Any) -> dict[str, Any]:
    """A summary from per-request rows alone (a CSV or JSONL results file): latencies, attribution and
    counts; ITL needs token times these files do not have."""
    from tokenpath.sim.summary import PERCENTILES, SCHEMA

    measured = frame[~frame["warmup"].astype(bool)]
    kept = measured[measured["ok"].astype(bool)]

    def stats(column: str) -> dict[str, float | None]:
        values = kept[column].dropna().to_numpy(np.float64)
        if len(values) == 0:
            return {"mean": None, **{key: None for key in PERCENTILES}}
        return {"mean": float(values.mean()), **{k: float(np.percentile(values, q)) for k, q in PERCENTILES.items()}}

    # As summary.window_ns: the first measured send (a failed request's too) to the last byte.
    window = float(kept["last_byte_s"].max() - measured["send_s"].min()) if len(kept) else 0.0
    layers = ("queue", "compute", "traffic", "delivery")
    has_layers = all(kept[f"{layer}_s"].notna().all() for layer in layers) and len(kept)
    return {
        "schema": SCHEMA, "source": "results file", "scenario": {"name": "?", "fingerprint": "?"},
        "requests": {"completed": int(len(kept)), "failed": int((~measured["ok"].astype(bool)).sum()),
                     "input_tokens_mean": float(kept["input_tokens"].mean()) if len(kept) else 0.0,
                     "output_tokens_mean": float(kept["output_tokens"].mean()) if len(kept) else 0.0},
        "window_s": window,
        "throughput": {"output_tokens_per_s": float(kept["output_tokens"].sum()) / window if window else 0.0,
                       "requests_per_s": len(kept) / window if window else 0.0,
                       "goodput_requests_per_s": None},
        "latency_s": {"ttft": stats("ttft_s"), "ttfv": stats("ttfv_s"), "tpot": stats("tpot_s"),
                      "itl": stats("ttft_s") | {k: None for k in ("mean", *PERCENTILES)}, "e2e": stats("e2e_s")},
        "attribution_s": _attribution_of(kept, layers) if has_layers else None,
        "bottleneck": None,
    }


def _attribution_of(kept: Any, layers: tuple[str, ...]) -> dict[str, Any]:
    """The layers' means, with an application's layer and its stages where the rows have them."""
    means = {layer: float(kept[f"{layer}_s"].mean()) for layer in layers}
    if "application_s" in kept and kept["application_s"].notna().all():
        stages = [column for column in kept.columns if column.startswith("application.") and column.endswith("_s")]
        means["application"] = float(kept["application_s"].mean())
        means["application_detail"] = {column[len("application."):-2]: float(kept[column].mean()) for column in stages}
    return means
