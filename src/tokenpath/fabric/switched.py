"""A single-hop switched scale-up domain (NVSwitch, NVL72) with alpha-beta collective times.

Every chip has one port of `link_bw_Bps` per direction into a non-blocking switch. Collective times
follow NCCL's tuning model (src/graph/tuning.cc): time = latency + bytes_on_the_busiest_link / bw.

Constants below are named, with their source, and shared by every scenario.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenpath.errors import UserError

# NCCL tuning.cc: ring base latency (LL protocol) and the per-hop NVLink latency (LL), in seconds.
RING_BASE_LATENCY_S = 6.6e-6
NVLINK_HOP_LATENCY_S = 0.6e-6
# NVLS (in-switch reduction) small-message all-reduce latency: ~6 us measured with CUDA graphs on H100
# (NVIDIA/nccl issue 1259).
NVLS_LATENCY_S = 6.0e-6
# Achieved fraction of the per-direction link bandwidth at large sizes, from nccl-tests on 8x H100 SXM:
# ring all-reduce busbw 370 GB/s of 450 GB/s (nccl-tests issues 212, 309);
# NVLS all-reduce busbw 480 GB/s: algbw 480 / (2*7/8) = 274 GB/s of 450 GB/s (nccl-tests issue 212).
RING_BW_EFFICIENCY = 370.0 / 450.0
NVLS_BW_EFFICIENCY = (480.0 / (2 * 7 / 8)) / 450.0

ALGORITHMS = ("auto", "ring", "nvls")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True)
class SwitchedDomain:
    """`hosts` chips behind one switch, each with `link_bw_Bps` per direction."""

    hosts: int
    link_bw_Bps: float
    link_latency_s: float = NVLINK_HOP_LATENCY_S
    nvls: bool = True
    algorithm: str = "auto"

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise UserError(f"fabric.algorithm: unknown {self.algorithm!r}; use one of {', '.join(ALGORITHMS)}")
        if self.algorithm == "nvls" and not self.nvls:
            raise UserError("fabric.algorithm: 'nvls' needs a switch with in-network reduction; use 'ring'")
        if self.link_bw_Bps <= 0:
            raise UserError("fabric.link_bw: must be positive, e.g. '450 GB/s'")

    def _ring_s(self, op: str, size_bytes: float, ranks: int) -> float:
        # All-reduce is a reduce-scatter then an all-gather: 2(n-1) steps, each moving size/n per link.
        steps = 2 * (ranks - 1) if op == "all_reduce" else ranks - 1
        latency_s = RING_BASE_LATENCY_S + steps * self.link_latency_s
        return latency_s + steps * (size_bytes / ranks) / (self.link_bw_Bps * RING_BW_EFFICIENCY)

    def _nvls_s(self, op: str, size_bytes: float, ranks: int) -> float:
        # The switch reduces: each chip sends its whole buffer up once and receives the result once.
        if op != "all_reduce":
            return self._ring_s(op, size_bytes, ranks)
        return NVLS_LATENCY_S + size_bytes / (self.link_bw_Bps * NVLS_BW_EFFICIENCY)

    def collective_time_s(self, op: str, size_bytes: float, ranks: int) -> float:
        """Time of one collective of `size_bytes` per rank over `ranks` chips of this domain."""
        if op not in COLLECTIVES:
            raise ValueError(f"unknown collective {op!r}")
        if ranks > self.hosts:
            raise UserError(f"fabric: a group of {ranks} chips does not fit a {self.hosts}-chip switched domain")
        if ranks <= 1 or size_bytes <= 0:
            return 0.0
        if self.algorithm == "ring" or not self.nvls:
            return self._ring_s(op, size_bytes, ranks)
        if self.algorithm == "nvls":
            return self._nvls_s(op, size_bytes, ranks)
        return min(self._ring_s(op, size_bytes, ranks), self._nvls_s(op, size_bytes, ranks))

    def bus_bandwidth_Bps(self, op: str, size_bytes: float, ranks: int) -> float:
        """nccl-tests busbw: algbw scaled so it compares with the link bandwidth (0 when nothing moves)."""
        time_s = self.collective_time_s(op, size_bytes, ranks)
        if time_s == 0:
            return 0.0
        algbw = size_bytes / time_s
        factor = 2 * (ranks - 1) / ranks if op == "all_reduce" else (ranks - 1) / ranks
        return algbw * factor
