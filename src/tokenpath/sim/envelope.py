"""The validated envelope: what of a run no validated latency row covers.

A run is inside when some latency row of the bands file (sim/bands.py) has its chip, its chip's
generation, its engine profile, its model family and its load regime, each on its own (a combination
no row has is the band's back-off, which its basis names), and some row its engine profile on its chip's
generation: an engine's kernels, graphs and defaults differ from one generation to the next, and where
no row has the pair the unshipped runs missed most (docs/validation.md, "Error bands and the
validated envelope": vLLM and TensorRT-LLM on Blackwell); and, where the scenario states the engine's
release (`[engine] version`), some row of the same profile states that release: the same text, or a
first word that is it or starts with it and a dot ("0.6" covers "0.6.0" and "0.6.0 (V0)"), a tag's "v"
and trailing zeros aside ("v0.6.0" is "0.6.0"); where it
runs speculative decoding, some row runs the same method; where it runs attention data-parallel, some
row of its engine profile does (each engine's ranks schedule their own way: engine/replica.py, and the
unshipped TensorRT-LLM runs of it missed most, docs/validation.md); and it is not a closed loop of fixed lengths
through the server's front end or a network, which no row validates: the rows score such loops at the engine, since
their simulated rounds lock in step (validate/latency.locked_loop; docs/validation.md, "The front end in
the rows"). An engine calibration (`[assumptions] calibration`) is a measurement of the deployment it was
fitted on: a run of another model, precision, chip, engine profile or release is outside too, and takes
the uncalibrated band (sim/bands.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenpath.config.assumptions import FITTED_ON_KEYS
from tokenpath.engine.release import release_number, written_release
from tokenpath.sim.bands import Record, unseen_pair

if TYPE_CHECKING:
    from tokenpath.sim.scenario import Scenario

# Marks, in a table of runs (levers, a sweep's frontier), one whose scenario lies outside the envelope.
OUTSIDE_MARK = "*"

# (the regime's key, the row's field, its name in the line), in the order the line names them.
_DIMENSIONS = (("chip", "chip", "chip"), ("chip_generation", "chip_generation", "chip generation"),
               ("engine", "engine", "engine profile"), ("model_family", "model_family", "model family"),
               ("load", "load", "load"))


def covers_version(stated: str, wanted: str) -> bool:
    """Whether a row's stated engine release covers the scenario's (module docstring), a tag's "v" and
    trailing zeros aside as the model reads a release ("v0.8.3" and "0.8.3.0" are 0.8.3: engine/release.py)."""
    first = stated.split(" ", 1)[0]
    if stated == wanted or first == wanted or first.startswith(wanted + "."):
        return True
    row, run = written_release(first), written_release(wanted)
    return row is not None and run is not None and (row.startswith(run + ".")
                                                    or release_number(row) == release_number(run))


def fitted_on(scenario: Scenario, model: str, chip: str) -> dict[str, str]:
    """The deployment a run of `scenario` is, as an engine calibration records it (FITTED_ON_KEYS):
    `model` and `chip` the catalog's names of its model and chip."""
    precision = scenario.model.precision
    if scenario.model.expert_precision is not None:
        precision += f", experts {scenario.model.expert_precision}"
    identity = {"model": model, "precision": precision, "chip": chip, "engine": scenario.engine.scheduler,
                "engine_version": scenario.engine.version}
    return {key: value for key, value in identity.items() if value is not None}


def calibrated_elsewhere(files: Mapping[str, Mapping[str, str]], here: Mapping[str, str]) -> list[str]:
    """Each engine calibration of `files` (file -> what it was fitted on) fitted on a deployment other
    than `here`, as the envelope names it: "calibration mine.toml fitted on chip h100"."""
    found = []
    for path, recorded in files.items():
        differ = [f"{key.replace('_', ' ')} {recorded[key]}" for key in FITTED_ON_KEYS
                  if key in recorded and key in here and not _same(key, recorded[key], here[key])]
        if differ:
            found.append(f"calibration {Path(path).name} fitted on {', '.join(differ)}")
    return found


def _same(key: str, recorded: str, here: str) -> bool:
    if key == "engine_version":
        return covers_version(recorded, here) or covers_version(here, recorded)
    return recorded == here


def envelope(regime: dict[str, Any], records: Sequence[Record], elsewhere: Sequence[str] = ()) -> dict[str, Any]:
    """The result document's `envelope`: `validated`, `outside` (what no row covers, e.g. "chip mi300x",
    and `elsewhere`: calibrated_elsewhere's) and `line`, saying so with what the rows cover (None inside)."""
    latency = [r for r in records if "ttft" in r.errors]
    outside, cover = [], []
    for key, field, name in _DIMENSIONS:
        have = sorted({getattr(r, field) for r in latency})
        if regime[key] not in have:
            outside.append(f"{name} {regime[key]}")
            cover.append(f"{name}: {', '.join(have)}")
    each_covered = (regime["engine"] in {r.engine for r in latency}
                    and regime["chip_generation"] in {r.chip_generation for r in latency})
    if each_covered and unseen_pair(latency, regime):  # (else named above, alone)
        paired = sorted({r.chip_generation for r in latency if r.engine == regime["engine"]})
        outside.append(f"engine profile {regime['engine']} on {regime['chip_generation']}")
        cover.append(f"{regime['engine']} on {', '.join(paired)}")
    version = regime.get("engine_version")
    if version is not None:
        stated = sorted({r.engine_version for r in latency if r.engine == regime["engine"]})
        if not any(covers_version(s, version) for s in stated):
            outside.append(f"engine version {version}")
            cover.append(f"{regime['engine']} versions: {', '.join(stated) or 'none'}")
    method = regime.get("speculative")
    if method is not None:
        methods = sorted({r.speculative for r in latency if r.speculative})
        if method not in methods:
            outside.append(f"speculative decoding ({method})")
            cover.append(f"speculative decoding: {', '.join(methods) or 'none'}")
    if regime.get("attention_dp"):
        profiles = sorted({r.engine for r in latency if r.attention_dp})
        if regime["engine"] not in profiles:
            outside.append(f"attention data-parallel under {regime['engine']}")
            cover.append(f"attention data-parallel: {', '.join(profiles) or 'none'}")
    if regime.get("locked_loop"):
        outside.append("a closed loop of fixed lengths through a front end or network")
        cover.append("such loops at the engine only")
    if elsewhere:
        outside.extend(elsewhere)
        cover.append("a calibration: only the deployment it was fitted on")
    line = (f"outside the validated envelope: {', '.join(outside)} (rows cover {'; '.join(cover)})"
            if outside else None)
    return {"validated": not outside, "outside": outside, "line": line}
