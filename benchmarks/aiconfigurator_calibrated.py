"""Measure once, predict any load, on AIConfigurator's measured serving runs that the project does not ship.

`tokenpath validate --calibrated` checks the workflow the README recommends (fit `calibrate engine`'s
assumptions on one light-load measurement, predict every other load) on the published rows the project
ships. This script runs the same check where the fit has never been looked at: configurations of
AIConfigurator's `silicon_sample.csv` (the runs `aiconfigurator_silicon.py` predicts uncalibrated, the
project's shipped ones left out) that were measured at three or more concurrencies, the same engine,
model, chips, tensor parallelism, lengths and measuring day otherwise. Each is fitted on its lowest
concurrency with `calibrate engine`'s fit, as `validate --calibrated` fits a row
(validate/calibrated.py's `calibrate_configuration`: the run as a phase, its mean TTFT and TPOT the
figures), and its other runs are predicted with the values fitted, each with its own engine limits
(TensorRT-LLM's depend on the concurrency AIConfigurator deployed it for).

    pip install aiconfigurator-core
    python benchmarks/aiconfigurator_calibrated.py --configurations 10 --seed 1 [--workers 2]

It prints each configuration's fit and predictions, then the median |error| of the predicted runs,
calibrated and with the registry's values. One to two minutes a configuration on one core. Not a speed
claim: an accuracy check of calibration on held-out runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pandas as pd
from aiconfigurator_silicon import MODELS, candidate_runs, default_csv, row_of

from tokenpath.config.assumptions import format_value
from tokenpath.sim.forked import can_fork, map_forked
from tokenpath.validate.calibrated import MIN_LOADS, Configuration, calibrate_configuration
from tokenpath.validate.latency import load_latency

# What makes runs one configuration: all but the concurrency (and TensorRT-LLM's limits, which follow it).
CONFIGURATION = ["backend", "model_path", "system", "tp_size", "isl", "osl", "gemm_quant_mode", "measured"]


def configurations(runs: pd.DataFrame, count: int, seed: int) -> list[pd.DataFrame]:
    """Up to `count` configurations measured at MIN_LOADS or more concurrencies, drawn at random (seeded), each
    its runs by concurrency."""
    runs = runs.assign(measured=runs.silicon_data_source.str.extract(r"measured=(\d{4}-\d{2}-\d{2})")[0].fillna(""))
    groups = [group.sort_values("concurrency") for _, group in runs.groupby(CONFIGURATION, sort=True)
              if group.concurrency.nunique() >= MIN_LOADS]
    order = pd.Series(range(len(groups))).sample(frac=1.0, random_state=seed).tolist()
    return [groups[k] for k in order[:count]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, help="silicon_sample.csv (default: the installed aiconfigurator-core's)")
    parser.add_argument("--configurations", type=int, default=10, help="configurations drawn at random")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1, help="configurations fitted side by side (forked)")
    args = parser.parse_args()
    data = load_latency()
    shipped = {row.get("id") for row in data["rows"]}
    drawn = configurations(candidate_runs(args.csv or default_csv(), shipped), args.configurations, args.seed)
    if not drawn:
        sys.exit(f"no configuration of the unshipped runs has {MIN_LOADS} or more concurrencies")
    rows, found = [], []
    for group in drawn:
        first = len(rows)
        rows.extend({**row_of(run, "profiling_phase"), "source": "aiconfigurator_silicon"}
                    for _, run in group.iterrows())
        found.append(Configuration(tuple(range(first, len(rows))), first))  # the lowest concurrency first

    def work(configuration: Configuration, report) -> dict:
        result = calibrate_configuration(configuration, rows, data["sharegpt"])
        report(1)
        return result

    if args.workers > 1 and can_fork():
        results = map_forked(work, found, min(args.workers, len(found)))
    else:
        results = [work(c, lambda _: None) for c in found]
    predicted = []
    for group, result in zip(drawn, results):
        run = group.iloc[0]
        fitted = ", ".join(f"{name} {format_value(name, result['start'][name])} -> {format_value(name, value)}"
                           for name, value in result["fitted"].items()) or "nothing"
        print(f"{run.backend} {MODELS[run.model_path]} {run.system} tp{int(run.tp_size)} {int(run.isl)}/{int(run.osl)} "
              f"{run.gemm_quant_mode}, fitted at {result['fitted_on']['load']}: {fitted}")
        for r in result["rows"]:
            print(f"    {r['load']:16} TTFT {r['ttft_ms']:8.1f} ms {r['ttft_error']:+6.0%} "
                  f"(uncalibrated {r['uncalibrated_ttft_error']:+6.0%})  TPOT {r['decode_ms']:6.1f} ms "
                  f"{r['decode_error']:+6.0%} (uncalibrated {r['uncalibrated_decode_error']:+6.0%})")
            predicted.append(r)

    def median(key: str) -> float:
        return statistics.median(abs(r[key]) for r in predicted)

    print(f"\n{len(results)} configurations, {len(predicted)} runs predicted from the lowest concurrency: median "
          f"|error| TTFT {median('ttft_error'):.1%}, TPOT {median('decode_error'):.1%}; with the registry's values "
          f"TTFT {median('uncalibrated_ttft_error'):.1%}, TPOT {median('uncalibrated_decode_error'):.1%}")


if __name__ == "__main__":
    main()
