"""The engine calibration file `tokenpath calibrate engine` writes and `[assumptions] calibration` reads.

    schema = "tokenpath.engine-calibration/1"
    measured_at = "2026-01-01T00:00:00+00:00"
    [server]   base_url, model (or the results files fitted)
    [scenario] name, fingerprint, and the deployment fitted on: model, precision, chip, engine,
               engine_version (a run of another is outside the validated envelope: sim/envelope.py)
    [fit]      fitted (names), rms_error_before, rms_error_after, not_fitted (name -> why), cut_by_budget
               (what --budget's end left undone; empty: the whole fit ran)
    [fitted.NAME]  value, uncertainty (one standard deviation), default, unit   (SI units)
    [[probe]]  one per phase: phase, results, requests, lengths, concurrency or rate, the measured
               TTFT and TPOT medians and what simulate predicts for them before and after the fit
"""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any

import tomli_w

from tokenpath.calibrate.fit import Fit
from tokenpath.calibrate.measured import Measured
from tokenpath.compute.chip import load_chip
from tokenpath.compute.model import load_model
from tokenpath.config.assumptions import ENGINE_CALIBRATION_SCHEMA, lookup
from tokenpath.config.errors import UserError
from tokenpath.sim.envelope import fitted_on
from tokenpath.sim.scenario import Scenario


def _number(value: float) -> float | str:
    return value if math.isfinite(value) else "nan"


def calibration_document(fit: Fit, measured: list[Measured], skipped: list[str], scenario: Scenario,
                         server: dict[str, Any]) -> dict[str, Any]:
    probe = []
    for m, before, after in zip(measured, fit.predicted_before, fit.predicted_after):
        row = {key: _number(v) if isinstance(v, float) else v for key, v in m.describe().items()}
        ttft_key, decode_key = m.statistic.keys()
        row.update({f"{ttft_key}_predicted_before": _number(before[0]),
                    f"{decode_key}_predicted_before": _number(before[1]),
                    f"{ttft_key}_predicted_after": _number(after[0]),
                    f"{decode_key}_predicted_after": _number(after[1])})
        probe.append(row)
    return {
        "schema": ENGINE_CALIBRATION_SCHEMA,
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "server": server,
        "scenario": {"name": scenario.name, "fingerprint": scenario.fingerprint(),
                     **fitted_on(scenario, load_model(scenario.model_source()).name,
                                 load_chip(scenario.deployment.chip).name)},
        "fit": {"fitted": fit.names, "rms_error_before": fit.rms_before, "rms_error_after": fit.rms_after,
                "not_fitted": fit.not_fitted, "phases_skipped": skipped, "cut_by_budget": fit.cut_by_budget},
        "fitted": {name: {"value": fit.values[name], "uncertainty": fit.uncertainty[name],
                          "default": lookup(name).value, "start": fit.start[name], "unit": lookup(name).unit}
                   for name in fit.names},
        "probe": probe,
    }


def write_calibration(path: str | Path, document: dict[str, Any]) -> None:
    try:
        Path(path).write_text(tomli_w.dumps(document), encoding="utf-8")
    except OSError as error:
        raise UserError(f"--out {path}: cannot write it ({error.strerror}); choose a writable path") from None
