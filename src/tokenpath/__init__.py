"""tokenpath: where the time goes between an LLM request and readable text on the user's screen.

The public API (docs/api.md): `load_scenario`, `Scenario`, `simulate`, `Simulation` (its `summary` is the
result document) and `load_summary`. Everything else is internal and may change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Scenario", "Simulation", "load_scenario", "load_summary", "simulate"]

if TYPE_CHECKING:
    from tokenpath.sim.scenario import Scenario, load_scenario
    from tokenpath.sim.simulate import Simulation, simulate
    from tokenpath.sim.summary import load_summary


def __getattr__(name: str) -> Any:
    """The public names, each imported on first use: `import tokenpath` (and so the CLI) stays cheap."""
    if name in ("Scenario", "load_scenario"):
        from tokenpath.sim import scenario as home
    elif name in ("Simulation", "simulate"):
        from tokenpath.sim import simulate as home
    elif name == "load_summary":
        from tokenpath.sim import summary as home
    else:
        raise AttributeError(f"module 'tokenpath' has no attribute {name!r}")
    value = getattr(home, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
