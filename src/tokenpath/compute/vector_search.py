"""One query's time on a vector index (a retrieval stage's `index`, application/index.py): a small
roofline of the scan, and for HNSW a count of distance computations times each one's cost.

- flat: every stored vector is read and compared: vectors x code bytes over the bandwidth, or
  2 x vectors x dim FLOPs (PQ codes: a table look-up per code byte), whichever takes longer.
- IVF: the coarse quantizer (a flat scan of nlist fp32 centroids), then nprobe of the nlist lists:
  that fraction of a flat scan, times the lists' imbalance (a query falls in the dense regions).
- HNSW (CPU only): distances = fraction x ef x 2m on the bottom layer + m x log_m(vectors) above it,
  each costing a random visit, its bytes at one core's share of the bandwidth, and its FLOPs.

On the CPU a query's scan gets `threads` cores' shares of the socket's sustained bandwidth (the share a
core has when every core is serving a query, as a loaded index server runs: FAISS and hnswlib search
one query on one thread), so an idle server answers one query faster than this. On a chip: the
catalog's sustained HBM bandwidth and bf16 GEMM rate, plus a fixed cost per query (the query's copy in
and the results' copy out, and the kernels). docs/application.md compares the model with published
FAISS measurements.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tokenpath.compute.chip import ChipSpec, load_chip
from tokenpath.compute.efficiency import EAGER_KERNEL_LAUNCH_S, KERNEL_FIXED_S
from tokenpath.config.assumptions import assumed, default

if TYPE_CHECKING:
    from tokenpath.application.index import IndexSpec

CPU_MEMORY_BW_BPS = default("cpu_memory_bw_Bps")
"""Sustained memory bandwidth of the CPU socket that serves the index: one Intel Xeon Platinum 8480C,
the host CPU of NVIDIA's DGX H100 (two of them, 56 cores each). Eight channels of DDR5-4800 peak at
307.2 GB/s; multi-threaded STREAM sustains 75-85% of peak DRAM bandwidth in each generation (John
McCalpin), so 0.8 of it."""

CPU_CORES = default("cpu_cores")
"""Cores of that socket: a loaded server gives each core this share of the bandwidth."""

CPU_CORE_FLOPS = default("cpu_core_flops")
"""FP32 FLOP/s of one core: two 512-bit FMA units (32 FP32 FLOPs each a cycle) at the 2.0 GHz base
clock. A scan of fp32 vectors needs 0.5 FLOP a byte and the core's share of bandwidth carries about 4
GB/s, so the FLOPs bind only for narrow codes at many threads."""

IVF_IMBALANCE = default("ivf_imbalance")
"""How much more a query's probed lists hold than the mean list: FAISS's imbalance factor of the
k-means that made them (n x sum of squared list sizes over their squared sum), the expected size of
the list a vector drawn like the data falls in, over the mean. 1.235 for SIFT1M into 16,384 lists."""

HNSW_DISTANCE_FRACTION = default("hnsw_distance_fraction")
"""Distances computed on HNSW's bottom layer, per unit of ef, as a fraction of its 2m links: the
search expands about ef candidates and computes the distance to each link not visited yet."""

HNSW_VISIT_S = default("hnsw_visit_s")
"""A distance's cost beyond its bytes and FLOPs: fetching a vector at a random place in memory, the
visited-set check of every link and the candidate heaps."""

PQ_LOOKUP_S = default("pq_lookup_s")
"""One byte of a PQ code scanned on one core: a look-up in the query's distance table and an add."""

# Kernels a GPU launches for one query, about (FAISS's GPU search: the distances, then the k-selection;
# IVF selects the lists to probe first, then scans them and selects again).
GPU_SEARCH_KERNELS = {"flat": 2, "ivf": 4}
# A copy between host and chip, each way: the query in, the top-k out. The delivery layer's host-link
# latency (delivery/spec.py, whose reasoning it is), bound here from the registry: a layer imports no other.
D2H_COPY_LATENCY_S = default("host_link_latency_s")


def retrieval_latency_s(index: IndexSpec) -> float:
    """One query's time on `index`, in seconds, under the active assumptions (a scenario's
    `[assumptions]` overrides any constant above)."""
    if index.on == "cpu":
        return _hnsw_s(index) if index.method == "hnsw" else _cpu_scan_s(index)
    return _chip_s(index, load_chip(index.on))


def hnsw_distances(index: IndexSpec) -> float:
    """Distance computations of one HNSW query: ef (at least top_k) x 2m x the fraction on the bottom
    layer, and about m on each of the log_m(vectors) layers above it (the HNSW paper: a node's top
    layer is drawn with mL = 1 / ln m, so log_m(vectors) layers). At most every stored vector once: the
    search keeps a visited set (hnswlib's VisitedList), so a small index, or an ef near its size, is
    scanned whole and no more."""
    ef = max(index.ef_search, index.top_k)
    upper = index.m * math.log(index.vectors) / math.log(index.m)
    return min(float(index.vectors),
               assumed("hnsw_distance_fraction", HNSW_DISTANCE_FRACTION) * ef * 2 * index.m + upper)


def _core_share_Bps() -> float:
    return assumed("cpu_memory_bw_Bps", CPU_MEMORY_BW_BPS) / assumed("cpu_cores", CPU_CORES)


def _code_compute_s(index: IndexSpec, cores: float) -> float:
    """Time to compare the query with one stored vector on `cores` cores."""
    if index.pq_bytes is not None:
        return index.pq_bytes * assumed("pq_lookup_s", PQ_LOOKUP_S) / cores
    return 2 * index.dim / (cores * assumed("cpu_core_flops", CPU_CORE_FLOPS))


def _scanned(index: IndexSpec) -> float:
    """Stored vectors one query compares with: all of them, or IVF's probed lists."""
    if index.method == "flat":
        return float(index.vectors)
    fraction = index.nprobe / index.nlist * assumed("ivf_imbalance", IVF_IMBALANCE)
    return min(float(index.vectors), index.vectors * fraction)


def _scan_s(index: IndexSpec, bw_Bps: float, compare_s: float, flops: float) -> float:
    """The stored vectors one query compares with (each over `bw_Bps` or taking `compare_s`), after,
    for IVF, its coarse quantizer: a flat scan of nlist fp32 centroids at `flops`."""
    total = _scanned(index) * max(index.code_bytes / bw_Bps, compare_s)
    if index.method == "ivf":
        total += index.nlist * max(index.dim * 4 / bw_Bps, 2 * index.dim / flops)
    return total


def _cpu_scan_s(index: IndexSpec) -> float:
    cores = min(index.threads or 1, assumed("cpu_cores", CPU_CORES))
    flops = cores * assumed("cpu_core_flops", CPU_CORE_FLOPS)
    return _scan_s(index, cores * _core_share_Bps(), _code_compute_s(index, cores), flops)


def _hnsw_s(index: IndexSpec) -> float:
    per_distance = (assumed("hnsw_visit_s", HNSW_VISIT_S) + index.code_bytes / _core_share_Bps()
                    + _code_compute_s(index, 1))
    return hnsw_distances(index) * per_distance


def _chip_s(index: IndexSpec, chip: ChipSpec) -> float:
    """A scan on the chip: HBM-bound (PQ codes too: their look-up table sits in on-chip memory), its
    FLOPs at the bf16 GEMM rate, and a fixed cost: the query's copy in, the results' copy out, and
    each kernel's launch and fixed time. The chip's efficiencies are the registry's (`load_chip`'s
    default), not a scenario's override of them."""
    flops = chip.effective_flops("bf16")
    compare_s = 0.0 if index.pq_bytes is not None else 2 * index.dim / flops
    kernel_s = assumed("kernel_fixed_s", KERNEL_FIXED_S) + assumed("eager_kernel_launch_s", EAGER_KERNEL_LAUNCH_S)
    fixed_s = GPU_SEARCH_KERNELS[index.method] * kernel_s + 2 * assumed("host_link_latency_s", D2H_COPY_LATENCY_S)
    return _scan_s(index, chip.effective_hbm_bw_Bps, compare_s, flops) + fixed_s
