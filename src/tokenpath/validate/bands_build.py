"""Writing catalog/validation/bands.toml (`tokenpath validate --cross --write-bands`): each validated row's
regime and signed errors, which sim/bands.py turns into a scenario's error bands.

The latency rows' TTFT and decode errors are the cross-validation's, each row predicted out of its fold
(validate/cross.py), and so is the throughput error of a row whose `also` states its output tokens per
second. The offline throughput group's rows (THROUGHPUT_GROUP, all requests at once) add throughput
errors as `validate` predicts them: the serving GEMM fraction is fitted on them (validate/fit.py's
GROUP_PROCEDURES), so each row with the value fitted on the group's other rows, not with the registry's,
which is the fit on every row, its own too. The `calibrated` table holds
the latency rows `validate --calibrated` predicts, each with its errors after the fit on its
configuration's lightest row (validate/calibrated.py): the bands of a calibrated scenario. A row's regime
is read off its simulation with the registry's values, as `simulate` reads a scenario's (sim/regime.py).

The file names its rows (sim/bands.py's ids), the sha256 of the rows files and the commit it was
written at, so a test can tell it is stale without simulating anything.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import tomli_w

from tokenpath.config.errors import UserError
from tokenpath.sim.bands import REGENERATE, SCHEMA, group_row_ids, latency_row_ids
from tokenpath.sim.forked import can_fork, map_forked

THROUGHPUT_GROUP = "trtllm_offline"
_HEADER = f"""# Error bands' data (sim/bands.py): each validated row's regime and its signed errors,
# predicted / measured - 1. Written by `{REGENERATE}` (validate/bands_build.py); do
# not edit it: regenerate it whenever the rows or the model change (docs/validation.md, error bands).
"""
_DIGITS = 6


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _regime_fields(regime: dict[str, Any]) -> dict[str, Any]:
    return {key: regime[key] for key in ("engine", "chip", "chip_generation", "model_family", "load")}


def _latency_regime(item: tuple[dict[str, Any], dict[str, Any]], progress: Callable[[int], None]) -> dict[str, Any]:
    from tokenpath.sim.simulate import simulate
    from tokenpath.validate.latency import row_prepared

    row, sharegpt = item
    regime = simulate(row_prepared(row, sharegpt)).summary["regime"]
    progress(1)
    return regime


def _group_regime(item: tuple[dict[str, Any], dict[str, Any]], progress: Callable[[int], None]) -> dict[str, Any]:
    from tokenpath.sim.simulate import simulate
    from tokenpath.validate.groups import row_scenario

    row, group = item
    regime = simulate(row_scenario(row, group)).summary["regime"]
    progress(1)
    return regime


def group_errors(name: str, workers: int, progress: Callable[[int], None]) -> tuple[list[dict[str, Any]],
                                                                                   list[dict[str, Any]]]:
    """A published group's rows that set no constant, and for each its regime (simulated with the
    registry's values, as `simulate` reads a scenario's) and its error as `validate` predicts it: with the
    constant the group fits fitted on its other rows."""
    from tokenpath.validate.groups import published_rows, run_validation

    groups, published = published_rows()
    rows = [row for row in published if row["group"] == name and not row.get("calibration")]
    validated = [r for r in run_validation({name})["rows"] if not r.get("calibration")]
    regimes = _map(_group_regime, [(row, groups[name]) for row in rows], workers, progress)
    return rows, [{"regime": regime, "error": r["error"]} for regime, r in zip(regimes, validated)]


def _map(work: Callable, items: Sequence, workers: int, progress: Callable[[int], None]) -> list:
    if workers > 1 and len(items) > 1 and can_fork():
        return map_forked(work, items, min(workers, len(items)), progress)
    return [work(item, progress) for item in items]


def _commit() -> tuple[str, bool]:
    """(the commit HEAD of the checkout this package runs from, whether its source, the rows and the model,
    differs from it, the bands file aside); ("unknown", False) outside a git checkout."""
    package = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(package), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(package), "status", "--porcelain", "--untracked-files=no", "--",
                                 ".", ":!catalog/validation/bands.toml"],
                                capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown", False
    return head, bool(status.strip())


def bands_document(rows: Sequence[dict[str, Any]], row_errors: Sequence[dict[str, float]],
                   regimes: Sequence[dict[str, Any]], throughput_rows: Sequence[dict[str, Any]],
                   throughput: Sequence[dict[str, Any]], meta: dict[str, Any],
                   calibrated: dict[int, dict[str, float]] | None = None) -> dict[str, Any]:
    """The file's document: `meta` first, then a `rows` table per latency row (cross-validated errors) and
    per offline throughput row (its error as `validate` predicts it), and a `calibrated` table per
    latency row in `calibrated` (row index -> its errors after a fit on a lighter load)."""
    ids = latency_row_ids(rows)

    def latency_record(k: int, regime: dict[str, Any]) -> dict[str, Any]:
        speculative = rows[k].get("engine_settings", {}).get("speculative")
        return {"id": ids[k], "source": rows[k]["source"], "engine_version": rows[k].get("engine_version", ""),
                "model": rows[k]["model"], **_regime_fields(regime),
                **({"speculative": speculative["method"]} if speculative else {}),
                **({"attention_dp": True} if rows[k].get("attention_dp") else {})}

    records = []
    for k, (errors, regime) in enumerate(zip(row_errors, regimes)):
        record = {**latency_record(k, regime), "cross_validated": True}
        record.update({f"{metric}_error": round(errors[metric], _DIGITS)
                       for metric in ("ttft", "decode", "throughput") if metric in errors})
        records.append(record)
    for row_id, row, result in zip(group_row_ids(THROUGHPUT_GROUP, len(throughput_rows)), throughput_rows,
                                   throughput):
        records.append({"id": row_id, "source": THROUGHPUT_GROUP, "engine_version": "", "model": row["model"],
                        **_regime_fields(result["regime"]), "cross_validated": False,
                        "throughput_error": round(result["error"], _DIGITS)})
    after_fit = [{**latency_record(k, regimes[k]), **{f"{metric}_error": round(errors[metric], _DIGITS)
                                                     for metric in ("ttft", "decode")}}
                 for k, errors in sorted((calibrated or {}).items())]
    return {**meta, "rows": records, **({"calibrated": after_fit} if after_fit else {})}


def build_bands(data: dict[str, Any], cross: dict[str, Any], workers: int,
                progress: Callable[[int], None]) -> dict[str, Any]:
    """The bands file's document from the latency data (`load_latency`'s) and its cross-validation
    (`cross_validate`'s document): each row simulated once more for its regime, the offline throughput
    group's rows for theirs and their errors, and the calibrated validation's predictions."""
    from tokenpath.validate.calibrated import calibrated_validation

    rows = data["rows"]
    starts = {fold["source"]: fold["fitted"] for fold in cross["by_source"]}  # (the calibrations start from them)
    document = calibrated_validation(rows, data["sharegpt"], starts, workers, progress)
    calibrated = {r["row"]: {"ttft": r["ttft_error"], "decode": r["decode_error"]}
                  for source in document["by_source"] for c in source["configurations"] for r in c["rows"]}
    regimes = _map(_latency_regime, [(row, data["sharegpt"]) for row in rows], workers, progress)
    offline, throughput = group_errors(THROUGHPUT_GROUP, workers, progress)
    commit, dirty = _commit()
    validation = resources.files("tokenpath.catalog") / "validation"
    meta = {"schema": SCHEMA, "generated_by": REGENERATE, "commit": commit, "commit_dirty": dirty,
            "latency_rows_sha256": _sha256((validation / "latency.toml").read_text(encoding="utf-8")),
            "published_rows_sha256": _sha256((validation / "published.toml").read_text(encoding="utf-8")),
            "throughput_group": THROUGHPUT_GROUP}
    return bands_document(rows, cross["row_errors"], regimes, offline, throughput, meta, calibrated)


def bands_path() -> Path:
    """The shipped bands file of the package that runs, where --write-bands writes."""
    return Path(str(resources.files("tokenpath.catalog") / "validation" / "bands.toml"))


def write_bands(document: dict[str, Any], path: Path) -> None:
    try:
        path.write_text(_HEADER + tomli_w.dumps(document), encoding="utf-8")
    except OSError as error:
        raise UserError(f"--write-bands: cannot write {path} ({error.strerror}); check its permissions") from None
