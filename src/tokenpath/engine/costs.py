"""One step's cost on a tensor-parallel group: compute on each chip, then the all-reduces between them."""

from __future__ import annotations

from functools import lru_cache

from tokenpath.compute.roofline import ComputeModel
from tokenpath.fabric.switched import SwitchedDomain


class GroupStepCosts:
    """Compute from the roofline model; traffic as the TP all-reduces of the hidden state, not overlapped."""

    def __init__(self, compute: ComputeModel, fabric: SwitchedDomain, tp: int) -> None:
        self.compute = compute
        self.fabric = fabric
        self.tp = tp
        # Both run once per engine step: bind them directly.
        self.compute_s = compute.step_time_s
        self.traffic_s = lru_cache(maxsize=65536)(self._traffic_s)

    def _traffic_s(self, num_tokens: int) -> float:
        if self.tp <= 1 or self.compute.allreduces_per_step == 0:
            return 0.0
        one_s = self.fabric.collective_time_s("all_reduce", self.compute.allreduce_bytes(num_tokens), self.tp)
        return self.compute.allreduces_per_step * one_s
