"""How fast the fabric computes all-to-all link loads on large networks, against igraph and networkx.

Usage: python benchmarks/fabric_scale.py [--repeats 3] [--peer-budget-s 60] [--json PATH]
Needs the peers installed: pip install igraph networkx

The work: every host sends one byte to every other host; report the load on every link. tokenpath
builds the topology, folds the demand per router and routes it with the topology's own rule (ECMP on
the fat tree, MIN on the DragonFly). The peers do what a graph library offers for the same question:
edge betweenness from every host to every host on the host-level graph, i.e. loads under shortest-path
routing with ECMP splitting (Brandes). On a fat tree that is exactly ECMP, so the loads are checked
equal (a cable's two directions against twice the unordered-pair betweenness). On a DragonFly,
shortest paths are not MIN routes, so the peers answer a slightly different question at the same
cost; only time is compared there.

Sizes grow until a peer's run exceeds --peer-budget-s; the ratio is taken at the largest size both
finished. Times are medians of --repeats runs (the machine is shared and noisy); a peer that takes
longer than the budget runs once.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from functools import partial

import numpy as np

from tokenpath.fabric.dragonfly import DragonFly
from tokenpath.fabric.fattree import FatTree
from tokenpath.fabric.topology import Traffic

FAT_TREE_KS = [8, 16, 24, 32, 48, 64]      # 128 ... 65,536 hosts
DRAGONFLY_PS = [2, 3, 4, 6, 8, 12]         # balanced, g = a*h + 1: 72 ... 83,232 hosts


def tokenpath_loads(build) -> tuple[float, object, np.ndarray]:
    start = time.perf_counter()
    topology = build()
    loads = topology.link_loads(Traffic.all_to_all(topology, 1.0))
    return time.perf_counter() - start, topology, loads


def cables(topology) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Undirected cables of the topology and the sum of their two directions' indices."""
    links = topology.links
    a, b = np.minimum(links.src, links.dst), np.maximum(links.src, links.dst)
    keys, inverse = np.unique(a * (topology.hosts + topology.switches) + b, return_inverse=True)
    n = topology.hosts + topology.switches
    return [(int(k // n), int(k % n)) for k in keys], inverse


def igraph_loads(topology, edges) -> tuple[float, np.ndarray]:
    import igraph

    start = time.perf_counter()
    graph = igraph.Graph(n=topology.hosts + topology.switches, edges=edges)
    hosts = range(topology.hosts)
    between = graph.edge_betweenness(directed=False, sources=hosts, targets=hosts)
    return time.perf_counter() - start, np.asarray(between)


def networkx_loads(topology, edges) -> tuple[float, np.ndarray]:
    import networkx as nx

    start = time.perf_counter()
    graph = nx.Graph()
    graph.add_edges_from(edges)
    hosts = range(topology.hosts)
    between = nx.edge_betweenness_centrality_subset(graph, sources=hosts, targets=hosts, normalized=False)
    values = np.array([between[e] if e in between else between[(e[1], e[0])] for e in edges])
    return time.perf_counter() - start, values


def median_time(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        elapsed, *result = fn()
        times.append(elapsed)
        if elapsed > 30:
            break
    return statistics.median(times), result


def run_family(name: str, sizes: list[int], build, exact: bool, repeats: int, budget_s: float) -> list[dict]:
    rows = []
    peers_alive = {"igraph": True, "networkx": True}
    for size in sizes:
        ours_s, (topology, loads) = median_time(partial(tokenpath_loads, partial(build, size)), repeats)
        row = {"family": name, "param": size, "hosts": topology.hosts, "routers": topology.routers,
               "links": len(topology.links), "tokenpath_s": ours_s}
        edges, cable_of_link = cables(topology) if any(peers_alive.values()) else (None, None)
        if edges is not None:
            ours_per_cable = np.bincount(cable_of_link, weights=loads)
        for peer, fn in (("igraph", igraph_loads), ("networkx", networkx_loads)):
            if not peers_alive[peer]:
                continue
            peer_s, (between,) = median_time(partial(fn, topology, edges), repeats)
            row[f"{peer}_s"] = peer_s
            row[f"{peer}_ratio"] = peer_s / ours_s
            if exact:
                row[f"{peer}_max_load_diff"] = float(np.abs(ours_per_cable - 2 * between).max())
            if peer_s > budget_s:
                peers_alive[peer] = False
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _line(row: dict) -> str:
    text = (f"{row['family']:>9} {row['param']:>3}  {row['hosts']:>7,} hosts  {row['links']:>9,} links  "
            f"tokenpath {row['tokenpath_s']:8.3f} s")
    for peer in ("igraph", "networkx"):
        if f"{peer}_s" in row:
            text += f"  {peer} {row[f'{peer}_s']:8.2f} s ({row[f'{peer}_ratio']:7.0f}x)"
            if f"{peer}_max_load_diff" in row:
                text += f" diff {row[f'{peer}_max_load_diff']:.1e}"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peer-budget-s", type=float, default=60.0)
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, repeats {args.repeats}")
    rows = run_family("fattree", FAT_TREE_KS, lambda k: FatTree(k, 50e9, 0.7e-6), True, args.repeats,
                      args.peer_budget_s)
    rows += run_family("dragonfly", DRAGONFLY_PS, lambda p: DragonFly(p, 25e9, 0.7e-6), False, args.repeats,
                       args.peer_budget_s)
    for family in ("fattree", "dragonfly"):
        mine = [r for r in rows if r["family"] == family]
        largest = mine[-1]
        print(f"{family}: {largest['hosts']:,} hosts in {largest['tokenpath_s']:.2f} s (target <= 2 s)")
        for peer in ("igraph", "networkx"):
            both = [r for r in mine if f"{peer}_s" in r]
            if both:
                r = both[-1]
                print(f"  vs {peer} at its largest finished size ({r['hosts']:,} hosts): "
                      f"{r[f'{peer}_s']:.2f} s vs {r['tokenpath_s']:.3f} s, {r[f'{peer}_ratio']:.0f}x")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(rows, out, indent=2)


if __name__ == "__main__":
    main()
