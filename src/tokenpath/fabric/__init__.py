"""Traffic layer: how long bytes take between chips on a topology."""

from tokenpath.fabric.switched import SwitchedDomain

__all__ = ["SwitchedDomain"]
