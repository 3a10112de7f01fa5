"""k-ary n-cubes: tori (TPU ICI, Trainium, Blue Gene style) and meshes, with per-dimension sizes.

A direct network: every chip is a router wired to its neighbours, so there are no switches and no host
links. Hosts are numbered row-major with the LAST dimension fastest (numpy's C order):
host = ravel_multi_index(coords, dims), so `np.arange(hosts).reshape(dims)[coords]` is the host at
`coords`.

Cables. Dimension d of size k gets one block of cables (so a link's index is arithmetic): cable
(a, c, b) joins the chip at coords (a, c, b) to the one at (a, c + 1 mod k, b), where a ravels the
coordinates before d and b those after it; the block is in C order over (a, c, b). Its "plus" link
(c -> c + 1) is start_d + cable and its "minus" link (c + 1 -> c) is start_d + cables_d + cable.
A mesh dimension has c = 0..k-2; a torus dimension adds the wrap cable c = k-1 (k-1 <-> 0).

Ports. `link_bw` is per link and direction, and every chip of a torus has two ports per dimension
(plus and minus), each cabled: a torus dimension of size 2 is a ring of two, whose two cables (c = 0
and the wrap c = 1) both join the same pair of chips, as the E dimension of Blue Gene/Q's 5D torus
does (10 links per node, +-A..+-E, E of size 2; IBM Redbook "Blue Gene/Q Hardware Overview", ch. 2).
So a chip has 2n links whatever its sizes, and shapes with the same chips and sizes in any order are
the same graph. A mesh dimension of 2 (`kind = "mesh"`, or `wraparound = false`) is one cable.

Routing is dimension order: fix dimension 0 first, then 1, ...; along a ring go the shorter way round,
and when both ways are equally short (even k, distance k/2) split the bytes 50/50 between them; along
a line there is one way. While a packet crosses dimension d it sits at (dst[:d], *, src[d+1:]), which
is what lets `router_link_loads` aggregate the demand of a whole dimension at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tokenpath.config.errors import UserError, quoted
from tokenpath.fabric.topology import LinkTable, Topology, Traffic, check_latency, check_positive

_DIMS_EXAMPLE = "e.g. [8, 8] for a 64-chip 2D torus, or [16] for a ring of 16"


def _check_dims(dims: Sequence[int]) -> tuple[int, ...]:
    if isinstance(dims, (int, np.integer)) or not isinstance(dims, (Sequence, np.ndarray)):
        raise UserError(f"fabric.dims: must be a list of dimension sizes, got {quoted(dims)}; {_DIMS_EXAMPLE}")
    if len(dims) == 0:
        raise UserError(f"fabric.dims: must list at least one dimension size; {_DIMS_EXAMPLE}")
    for k in dims:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
            raise UserError(f"fabric.dims: every dimension must be >= 2 (a whole number), got {quoted(list(dims))}; "
                            f"{_DIMS_EXAMPLE}")
    return tuple(int(k) for k in dims)


def _toeplitz(w: np.ndarray) -> np.ndarray:
    """Read-only k x k view T[s, t] = w[t - s + k] of a vector w of length 2k (w[0] is unused)."""
    k = len(w) // 2
    return np.lib.stride_tricks.sliding_window_view(w, k)[k:0:-1]


def _arc_diffs(line: np.ndarray, first: np.ndarray, last: np.ndarray, w: np.ndarray, wraps: np.ndarray,
               shape: tuple[int, int, int]) -> np.ndarray:
    """Difference arrays `shape` = (before, after, k) of arcs over cables first..last-1 of their line,
    each adding w at `first`, taking it off at `last`, and adding it at 0 if it wraps past k-1."""
    idx = np.concatenate([line + first, line + last, line[wraps]])
    weights = np.concatenate([w, -w, w[wraps]])
    return np.bincount(idx, weights, math.prod(shape)).reshape(shape)


class Torus(Topology):
    """A k-ary n-cube of `dims` chips with per-direction links of `link_bw_Bps`; wraparound makes every
    dimension a ring (1D: a ring; size 2: two cables), without it every dimension is a line (a mesh)."""

    kind = "torus"
    direct = True
    scale_up = True
    single_hop = False
    switches = 0

    def __init__(self, dims: Sequence[int], link_bw_Bps: float, link_latency_s: float,
                 wraparound: bool = True) -> None:
        self.dims = _check_dims(dims)
        check_positive(link_bw_Bps, "fabric.link_bw", "'100 GB/s'")
        check_latency(link_latency_s, "fabric.link_latency")
        self.wraparound = bool(wraparound)
        self.kind = "torus" if wraparound else "mesh"
        self.link_bw_Bps = float(link_bw_Bps)
        self.link_latency_s = float(link_latency_s)
        self.hosts = self.routers = math.prod(self.dims)
        self.host_router = np.arange(self.hosts)
        self.tier_names = tuple(f"dim{d}" for d in range(len(self.dims)))

        # Per dimension: is it a ring, chips before/after it (a, b), cables along it, first link index.
        self.rings = (self.wraparound,) * len(self.dims)
        self._before = tuple(math.prod(self.dims[:d]) for d in range(len(self.dims)))
        self._after = tuple(math.prod(self.dims[d + 1:]) for d in range(len(self.dims)))
        self._span = tuple(k if ring else k - 1 for k, ring in zip(self.dims, self.rings))  # cables per line
        self._start: list[int] = []
        grid = np.arange(self.hosts).reshape(self.dims)
        table = LinkTable()
        for d in range(len(self.dims)):
            a = np.moveaxis(grid, d, 0)[: self._span[d]]
            b = np.roll(np.moveaxis(grid, d, 0), -1, axis=0)[: self._span[d]]
            # C order over (before, c, after): move axis d back before raveling.
            a, b = np.moveaxis(a, 0, d).ravel(), np.moveaxis(b, 0, d).ravel()
            self._start.append(table.add_cables(a, b, link_bw_Bps, link_latency_s, d))
        self.links = table.build()

    # -- coordinates ----------------------------------------------------------------------------
    def coords(self, host: int) -> tuple[int, ...]:
        """Coordinates of `host` (last dimension fastest)."""
        self.check_hosts(np.array([host]), "host")
        return tuple(int(c) for c in np.unravel_index(host, self.dims))

    def _link(self, d: int, a: int, c: int, b: int, plus: bool) -> int:
        """Index of dimension d's link leaving (a, c, b) upward (plus) or arriving there downward."""
        cable = (a * self._span[d] + c) * self._after[d] + b
        return self._start[d] + cable + (0 if plus else self._before[d] * self._span[d] * self._after[d])

    # -- structure ------------------------------------------------------------------------------
    def diameter(self) -> int:
        return sum(k // 2 if ring else k - 1 for k, ring in zip(self.dims, self.rings))

    def avg_hops(self) -> float:
        """Per dimension the mean distance over all k^2 ordered coordinate pairs (identical ones
        included): ring k/4 (even k) or (k^2-1)/(4k) (odd k), line (k^2-1)/(3k). Route lengths add up
        over dimensions, so their sum is the mean over all N^2 host pairs; the N identical pairs add 0,
        so the mean over distinct pairs is that times N/(N-1)."""
        total = 0.0
        for k, ring in zip(self.dims, self.rings):
            if ring:
                total += k / 4 if k % 2 == 0 else (k * k - 1) / (4 * k)
            else:
                total += (k * k - 1) / (3 * k)
        n = self.hosts
        return total * n / (n - 1)

    def bisection_bw_Bps(self) -> float:
        """The cheapest cut into equal halves: across one dimension it cuts every line of that dimension
        once (a mesh line) or every ring twice (a ring of 2's two cables), N/k or 2N/k cables. An odd
        dimension leaves the middle slice (N/k hosts) to split as well, which costs that slice's own
        bisection (halves then differ by at most one host). Checked against every split of small
        machines in the tests."""
        return _bisection_cables(self.dims, self.rings) * self.link_bw_Bps

    # -- routing --------------------------------------------------------------------------------
    def _ways(self, d: int, s: int, t: int) -> list[tuple[bool, float]]:
        """Directions (plus?) and shares from coordinate s to t along dimension d."""
        k = self.dims[d]
        if not self.rings[d]:
            return [(t > s, 1.0)]
        forward = (t - s) % k
        if 2 * forward < k:
            return [(True, 1.0)]
        if 2 * forward > k:
            return [(False, 1.0)]
        return [(True, 0.5), (False, 0.5)]

    def route(self, src: int, dst: int) -> dict[int, float]:
        self.check_hosts(np.array([src, dst]), "route")
        here, there = self.coords(src), self.coords(dst)
        out: dict[int, float] = {}
        for d, k in enumerate(self.dims):
            s, t = here[d], there[d]
            if s == t:
                continue
            a = int(np.ravel_multi_index(there[:d], self.dims[:d])) if d else 0
            b = int(np.ravel_multi_index(here[d + 1:], self.dims[d + 1:])) if d + 1 < len(self.dims) else 0
            for plus, share in self._ways(d, s, t):
                c = s
                while c != t:
                    if plus:
                        link, c = self._link(d, a, c, b, True), (c + 1) % k
                    else:
                        c = (c - 1) % k
                        link = self._link(d, a, c, b, False)
                    out[link] = out.get(link, 0.0) + share
        return out

    def _shares(self, d: int, s: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Share of each s -> t move along dimension d that goes plus and that goes minus (0 if s == t)."""
        if not self.rings[d]:
            return (t > s).astype(np.float64), (t < s).astype(np.float64)
        forward = 2 * ((t - s) % self.dims[d])
        k = self.dims[d]
        tie = np.where(forward == k, 0.5, 0.0)
        return ((forward > 0) & (forward < k)) + tie, (forward > k) + tie

    def _loads_from_diffs(self, d: int, plus: np.ndarray, minus: np.ndarray) -> np.ndarray:
        """Link loads of dimension d from difference arrays (before, after, k) over each line's cables:
        an arc of cables c0..c1-1 adds w at c0 and takes it off at c1; one that wraps past k-1 also adds
        w at 0. Returns plus then minus links, in link order."""
        span = self._span[d]
        out = []
        for diff in (plus, minus):
            load = np.cumsum(diff, axis=-1)[..., :span]               # (before, after, cable)
            out.append(np.maximum(load, 0.0).transpose(0, 2, 1).ravel())  # cancellation can leave -1e-12
        return np.concatenate(out)

    def router_link_loads(self, router_bytes: np.ndarray) -> np.ndarray:
        """Per dimension d: sum the (N x N) demand, viewed as (a_s, s, b_s, a_t, t, b_t), over the
        source's earlier coordinates a_s and the destination's later ones b_t, because the packet moves
        along d at (a_t, *, b_s). That leaves a k x k demand per line; a plus arc s -> t covers cables
        s..t-1 (mod k) and a minus arc covers t..s-1, so each line's loads are a cumulative sum of row
        sums minus column sums, plus the wrapping arcs' total at cable 0. O(n N^2) for dense demand."""
        demand = self.demand(router_bytes)
        n = self.hosts
        loads = np.zeros(len(self.links))
        for d, k in enumerate(self.dims):
            before, after = self._before[d], self._after[d]
            # (a_s, s, b_s, a_t, t, b_t) -> sum a_s and b_t -> (s, b_s, a_t, t) -> (a_t, b_s, s, t)
            line = demand.reshape(before, k * after * n)
            line = line[0] if before == 1 else line.sum(axis=0)  # summing one row would copy N^2 floats
            line = line.reshape(k, after, before, k, after).sum(axis=-1).transpose(2, 1, 0, 3)
            # Shares depend on t - s only: k x k Toeplitz views of 2k-long vectors, no k^2 temporaries.
            delta = np.arange(2 * k) - k
            up, down = self._shares(d, np.zeros_like(delta), delta)
            up_wraps, down_wraps = _toeplitz(up * (delta < 0)), _toeplitz(down * (delta > 0))
            up, down = _toeplitz(up), _toeplitz(down)
            ahead, back = line * up, line * down                       # (a_t, b_s, s, t), N x k each
            plus = ahead.sum(axis=-1) - ahead.sum(axis=-2)
            plus[..., 0] += np.einsum("abst,st->ab", line, up_wraps)
            minus = back.sum(axis=-2) - back.sum(axis=-1)
            minus[..., 0] += np.einsum("abst,st->ab", line, down_wraps)
            start = self._start[d]
            loads[start: start + 2 * before * self._span[d] * after] = self._loads_from_diffs(d, plus, minus)
        return loads

    def flow_link_loads(self, src: np.ndarray, dst: np.ndarray, size_bytes: np.ndarray | float) -> np.ndarray:
        """Bytes on every directed link from explicit host-to-host flows: O(flows x dims + links), for
        sparse or structured traffic on machines too large for a dense N x N demand (16k chips: 2 GB)."""
        src = np.asarray(src, np.int64)
        dst = np.asarray(dst, np.int64)
        size = np.broadcast_to(np.asarray(size_bytes, np.float64), src.shape)
        self.check_hosts(src, "flow_link_loads")
        self.check_hosts(dst, "flow_link_loads")
        here = np.unravel_index(src, self.dims)
        there = np.unravel_index(dst, self.dims)
        loads = np.zeros(len(self.links))
        for d, k in enumerate(self.dims):
            before, after = self._before[d], self._after[d]
            a = np.ravel_multi_index(there[:d], self.dims[:d]) if d else np.zeros_like(src)
            b = (np.ravel_multi_index(here[d + 1:], self.dims[d + 1:]) if d + 1 < len(self.dims)
                 else np.zeros_like(src))
            line = (a * after + b) * k                                 # first bin of each flow's line
            s, t = here[d], there[d]
            up, down = self._shares(d, s, t)
            shape = (before, after, k)
            plus = _arc_diffs(line, s, t, up * size, t < s, shape)
            minus = _arc_diffs(line, t, s, down * size, s < t, shape)
            start = self._start[d]
            loads[start: start + 2 * before * self._span[d] * after] = self._loads_from_diffs(d, plus, minus)
        return loads

    # -- named patterns -------------------------------------------------------------------------
    def _shifted(self, bytes_per_host: float, move) -> Traffic:
        src = np.arange(self.hosts)
        here = np.unravel_index(src, self.dims)
        there = tuple(move(c, k) for c, k in zip(here, self.dims))
        return Traffic.from_flows(self, src, np.ravel_multi_index(there, self.dims), bytes_per_host)

    def tornado_traffic(self, bytes_per_host: float) -> Traffic:
        """Each chip sends to the chip ceil(k/2)-1 ahead (mod k) in every dimension: the longest move
        that still goes one way round a ring, so every flow piles onto the plus links. Dimensions of size
        2 move 0 (a chip whose every dimension is 2 sends nothing). On a mesh the same permutation wraps
        in the numbering, so its last chips travel back the long way."""
        return self._shifted(bytes_per_host, lambda c, k: (c + (k + 1) // 2 - 1) % k)

    def adversarial_traffic(self, bytes_per_host: float) -> Traffic:
        """Torus: tornado. Mesh: reflection c -> k-1-c in every dimension, so every chip (but the middle
        one of an odd line) crosses the middle cut of every dimension: the middle cables of a line of k
        carry floor(k/2) flows each way, which saturates the bisection."""
        if self.wraparound:
            return self.tornado_traffic(bytes_per_host)
        return self._shifted(bytes_per_host, lambda c, k: k - 1 - c)


class Mesh(Torus):
    """A torus without wraparound: every dimension is a line (2D mesh is the common case)."""

    kind = "mesh"

    def __init__(self, dims: Sequence[int], link_bw_Bps: float, link_latency_s: float) -> None:
        super().__init__(dims, link_bw_Bps, link_latency_s, wraparound=False)


def _bisection_cables(dims: tuple[int, ...], rings: tuple[bool, ...]) -> int:
    """Cables across the cheapest equal cut of a box of `dims` (ring or line per dimension)."""
    hosts = int(np.prod(dims))
    best = None
    for d, (k, ring) in enumerate(zip(dims, rings)):
        cut = (2 if ring else 1) * hosts // k
        if k % 2:  # split the middle slice too
            rest_dims, rest_rings = dims[:d] + dims[d + 1:], rings[:d] + rings[d + 1:]
            cut += _bisection_cables(rest_dims, rest_rings) if rest_dims else 0
        best = cut if best is None else min(best, cut)
    return best
