"""`tokenpath fabric`: a topology's structure, its collective times across sizes, and its worst links."""

from __future__ import annotations

from typing import Any

import numpy as np
import typer
from rich.table import Table

from tokenpath.cli.app import app, console, write_json
from tokenpath.config.errors import UserError, quoted

FABRIC_EXAMPLE = """
Examples:

  tokenpath fabric --preset dgx-h100

  tokenpath fabric my-torus.toml --pattern tornado --json -

  tokenpath fabric --preset h100-4x8-rail --ranks 16 --op all_reduce --algorithm hierarchical

  tokenpath fabric --list
"""

# nccl-tests sweeps -b 8 -e 8G; every 8x keeps the table short.
SIZES_BYTES = [8 * 8**i for i in range(11)]
PATTERNS = ("all-to-all", "tornado", "adversarial")
PATTERN_BYTES_PER_HOST = 2**20
WORST_LINKS = 10


def fabric_document(topology, collectives, ops: list[str], ranks: int, pattern: str | None) -> dict[str, Any]:
    """Structure, collective sweep and (optionally) a traffic pattern's busiest links, as one document."""
    from tokenpath.fabric.collectives import bus_bandwidth_factor

    group = [list(range(ranks))]
    rows = []
    for op in ops:
        for size in SIZES_BYTES:
            chosen = collectives.choose(op, size, group, collectives.algorithm)
            time_s = collectives.time_s(op, size, group, chosen)
            algbw = size / time_s
            rows.append({"op": op, "algorithm": chosen, "protocol": collectives.protocol(op, size, group, chosen),
                         "ranks": ranks, "size_bytes": size, "time_s": time_s,
                         "algbw_Bps": algbw, "busbw_Bps": algbw * bus_bandwidth_factor(op, ranks)})
    document = {
        "kind": topology.kind, "hosts": topology.hosts, "switches": topology.switches, "links": topology.cables,
        "diameter": topology.diameter(), "avg_hops": topology.avg_hops(),
        "bisection_bw_Bps": topology.bisection_bw_Bps(), "collectives": rows,
    }
    if pattern:
        document["pattern"] = pattern_document(topology, pattern)
    return document


def pattern_traffic(topology, pattern: str):
    from tokenpath.fabric.topology import Traffic

    if pattern == "all-to-all":
        return Traffic.all_to_all(topology, PATTERN_BYTES_PER_HOST / max(1, topology.hosts - 1))
    if pattern == "tornado":
        return topology.tornado_traffic(PATTERN_BYTES_PER_HOST)
    return topology.adversarial_traffic(PATTERN_BYTES_PER_HOST)


def pattern_document(topology, pattern: str) -> dict[str, Any]:
    """Every host sends PATTERN_BYTES_PER_HOST in `pattern`; the busiest links and the completion bound."""
    loads = topology.link_loads(pattern_traffic(topology, pattern))
    links = topology.links
    busy_s = loads / links.bw_Bps
    worst = np.argsort(-busy_s, kind="stable")[:WORST_LINKS]
    return {
        "name": pattern, "bytes_per_host": PATTERN_BYTES_PER_HOST,
        "completion_time_s": float(busy_s.max()) + topology.longest_route_latency_s(),
        "mean_link_utilization": float(busy_s.mean() / busy_s.max()) if busy_s.max() > 0 else 0.0,
        "worst_links": [{"link": int(i), "from": _node(topology, int(links.src[i])),
                         "to": _node(topology, int(links.dst[i])), "tier": topology.tier_names[links.tier[i]],
                         "bytes": float(loads[i]), "busy_s": float(busy_s[i])}
                        for i in worst if loads[i] > 0],
    }


def _node(topology, node: int) -> str:
    return f"host {node}" if node < topology.hosts else f"switch {node - topology.hosts}"


def _print(document: dict[str, Any], description: str) -> None:
    from tokenpath.config.units import format_bytes, format_duration

    if description:
        console.print(description, highlight=False)
    structure = Table(show_header=False)
    structure.add_column("", style="bold")
    structure.add_column("", justify="right")
    for label, value in (("kind", document["kind"]), ("hosts", f"{document['hosts']:,}"),
                         ("switches", f"{document['switches']:,}"), ("links", f"{document['links']:,}"),
                         ("diameter", f"{document['diameter']} links"), ("average hops", f"{document['avg_hops']:.3f}"),
                         ("bisection", f"{document['bisection_bw_Bps'] / 1e9:,.1f} GB/s")):
        structure.add_row(label, value)
    console.print(structure)
    table = Table(title="Collectives (nccl-tests columns: size per rank, algbw and busbw in GB/s)",
                  title_justify="left")
    for column in ("op", "ranks", "size", "algorithm", "time", "algbw", "busbw"):
        table.add_column(column, justify="left" if column in ("op", "algorithm") else "right", no_wrap=True)
    for row in document["collectives"]:
        table.add_row(row["op"], str(row["ranks"]), format_bytes(row["size_bytes"]),
                      f"{row['algorithm']} {row['protocol']}",
                      format_duration(row["time_s"]), f"{row['algbw_Bps'] / 1e9:,.2f}",
                      f"{row['busbw_Bps'] / 1e9:,.2f}")
    console.print(table)
    pattern = document.get("pattern")
    if pattern:
        worst = Table(title=f"{pattern['name']}: {format_bytes(pattern['bytes_per_host'])} from every host; "
                            f"done in {format_duration(pattern['completion_time_s'])} at best; the busiest links",
                      title_justify="left")
        for column in ("link", "from", "to", "tier", "bytes", "busy"):
            worst.add_column(column, justify="right" if column in ("link", "bytes", "busy") else "left")
        for row in pattern["worst_links"]:
            worst.add_row(str(row["link"]), row["from"], row["to"], row["tier"], format_bytes(row["bytes"]),
                          format_duration(row["busy_s"]))
        console.print(worst)


@app.command(help="Structure, collective times and worst links of a topology (a TOML file or a preset)."
                     + FABRIC_EXAMPLE)
def fabric(
    topology_file: str | None = typer.Argument(None, help="a topology TOML file (kind + parameters)"),
    preset: str | None = typer.Option(None, "--preset", help="a named topology; see --list"),
    list_presets: bool = typer.Option(False, "--list", help="list the presets and exit"),
    ops: list[str] | None = typer.Option(None, "--op", help="collective(s) to sweep; default all_reduce, "
                                                                "all_gather, reduce_scatter, all_to_all"),
    ranks: int | None = typer.Option(None, "--ranks", help="the first N hosts form the group; default all"),
    algorithm: str = typer.Option("auto", "--algorithm", help="collective algorithm; auto picks per size"),
    chip: str | None = typer.Option(None, "--chip", help="fill unset scale-up bandwidth, and the chips' "
                                                          "generation, from this chip"),
    pattern: str | None = typer.Option(None, "--pattern",
                                       help="all-to-all | tornado | adversarial: show the busiest links"),
    json_out: str | None = typer.Option(None, "--json", help="write the result to PATH, or '-' for stdout"),
) -> None:
    from tokenpath.config.files import check_writable
    from tokenpath.fabric.build import build_topology
    from tokenpath.fabric.collectives import OPS, Collectives
    from tokenpath.fabric.spec import load_fabric, preset_description, preset_names

    if json_out is not None:
        check_writable(json_out, "--json")
    if list_presets:
        for name in preset_names():
            console.print(f"[bold]{name}[/bold]  {preset_description(name)}", highlight=False)
        return
    if (topology_file is None) == (preset is None):
        raise UserError("fabric: give a topology file or --preset NAME (one of them); --list shows the presets")
    if pattern is not None and pattern not in PATTERNS:
        raise UserError(f"--pattern: unknown {quoted(pattern)}; use one of {', '.join(PATTERNS)}")
    ops = ops or ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
    for op in ops:
        if op not in OPS:
            raise UserError(f"--op: unknown {quoted(op)}; use one of {', '.join(OPS)}")
    spec, description = load_fabric(topology_file or preset)
    scaleup_bw_Bps = generation = None
    if chip is not None:
        from tokenpath.compute.chip import load_chip

        chip_spec = load_chip(chip)
        scaleup_bw_Bps, generation = chip_spec.scaleup_bw_Bps, chip_spec.generation
    topology = build_topology(spec, scaleup_bw_Bps, None, generation)
    if topology.hosts < 2:
        raise UserError(f"fabric {topology_file or preset}: {topology.hosts} host, and a collective needs 2 or more; "
                        "give the fabric more hosts")
    ranks = topology.hosts if ranks is None else ranks
    if not 2 <= ranks <= topology.hosts:
        raise UserError(f"--ranks: must be from 2 to the {topology.hosts} hosts of this fabric, got {ranks}")
    if algorithm == "auto":
        algorithm = spec.algorithm  # the file's choice, itself auto by default
    collectives = Collectives(topology, algorithm)
    document = fabric_document(topology, collectives, ops, ranks, pattern)
    if json_out == "-":
        write_json(document, "-")
        return
    _print(document, description)
    if json_out:
        write_json(document, json_out)
