"""What a simulation assumed rather than measured, for every report to name.

Today that is the last mile's host costs: either a calibration file (`tokenpath calibrate delivery`)
or the built-in constants of delivery/spec.py, each of which a scenario may override. Engine
calibration files join here when the scenario has them.
"""

from __future__ import annotations

from typing import Any

from tokenpath.delivery.spec import DeliverySpec
from tokenpath.scenario import Scenario
from tokenpath.units import format_bandwidth, format_duration, format_number

# The delivery fields that are assumed costs (not a choice of deployment, such as detokenize or
# stream_interval), each with how it prints.
_ASSUMED_DELIVERY = {
    "host_link_bw": format_bandwidth, "host_link_latency": format_duration,
    "detokenize_per_token": format_duration, "frame_per_event": format_duration,
    "bytes_per_token": format_number, "event_overhead_bytes": lambda v: f"{format_number(v)} B",
    "request_overhead_bytes": lambda v: f"{format_number(v)} B",
    "invisible_token_fraction": lambda v: f"{v:.1%}",
}


def assumptions(scenario: Scenario) -> dict[str, Any]:
    """{"calibration": {"delivery": path or None}, "overrides": {dotted key: value as people write it}}:
    the calibration files a run used and the assumed constants its scenario set to other values."""
    defaults, given = DeliverySpec(), scenario.delivery
    overrides = {
        f"delivery.{name}": show(getattr(given, name))
        for name, show in _ASSUMED_DELIVERY.items() if getattr(given, name) != getattr(defaults, name)
    }
    calibration = str(given.calibration) if given.calibration is not None else None
    return {"calibration": {"delivery": calibration}, "overrides": overrides}


def assumption_line(block: dict[str, Any] | None) -> str:
    """The assumptions block in one line for people."""
    if not block:
        return "not recorded"
    delivery = block.get("calibration", {}).get("delivery")
    parts = [f"delivery costs from {delivery}" if delivery else
             "built-in last-mile costs (no delivery calibration file)"]
    overrides = block.get("overrides") or {}
    if overrides:
        parts.append("overridden: " + ", ".join(f"{key} = {value}" for key, value in overrides.items()))
    else:
        parts.append("no assumed constant overridden")
    return "; ".join(parts)
