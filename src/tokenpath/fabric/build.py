"""Turn a fabric table into a topology, filling defaults from the chip.

Defaults, shared by every scenario:
- scale-up link bandwidth: the chip's scale-up bandwidth per direction, shared over its ports
  (`scaleup_ports`: one into a switch; hosts-1 in a full mesh; 2 per dimension in a torus or mesh);
- scale-up link latency: NVLink's 0.6 us per chip-to-chip hop (NCCL src/graph/tuning.cc, LL), i.e.
  0.3 us on each of the two links through a switch; for chips RCCL runs on, xGMI's 0.8 us (RCCL's tuning.cc);
- scale-out link latency: NCCL's 2.7 us per network hop (tuning.cc, LL) over the four links a
  leaf-spine route crosses, 0.675 us per link. Scale-out bandwidth has no default: give the NIC's.

A deployment that names no fabric gets `default_fabric`: its chip's scale-up fabric when the chips fit
one scale-up domain, else nodes of that domain on a rail-optimized leaf-spine of the chip's NICs.
"""

from __future__ import annotations

from pydantic import TypeAdapter, ValidationError

from tokenpath.config.assumptions import assumed, default
from tokenpath.config.config_errors import explain
from tokenpath.config.errors import UserError
from tokenpath.fabric.spec import (
    DragonFlyFabric,
    FabricSpec,
    FatTreeFabric,
    FullMeshFabric,
    HierarchyFabric,
    MeshFabric,
    SwitchFabric,
    TorusFabric,
)
from tokenpath.fabric.topology import Topology
from tokenpath.fabric.tuner import runs_rccl

# NCCL's latency per NVLink step of a ring (src/graph/tuning.cc hwLatencies NVLINK, Ring / LL: 0.6 us);
# a switch's two links (host up, switch down) share it.
NVLINK_HOP_LATENCY_S = default("nvlink_hop_latency_s")
# RCCL's per xGMI step of a ring, for the scale-up links of the chips RCCL runs on (tuner.runs_rccl):
# ROCm/rccl src/graph/tuning.cc tuning_model_5 hwLat NVLINK (its row for xGMI), Ring / LL: 0.8 us.
XGMI_HOP_LATENCY_S = default("xgmi_hop_latency_s")
# NCCL's latency per network step of a ring (tuning.cc hwLatencies NET, Ring / LL: 2.7 us), spread over
# the 4 links of a route between two leaves of a fat tree (host up, leaf up, spine down, leaf down).
SCALEOUT_LINK_LATENCY_S = default("scaleout_link_latency_s")


def build_topology(spec, scaleup_bw_Bps: float | None = None, chips: int | None = None,
                   generation: str | None = None, scaleout: bool = False) -> Topology:
    """The topology of `spec`; `scaleup_bw_Bps` (the chip's) and `chips` (the deployment's) fill
    unset scale-up bandwidth and host counts, and `generation` (the chip's, catalog/chips.toml) is its
    chips' generation, by which the runtime's tuner rates them (tuner.py). A switch table built with no
    chip names it (`nvls_generation`) or takes Hopper; one that names another than the chip's is an error.
    `scaleout`: it is a hierarchy's network, whose switch, torus or mesh links NICs, not NVLink: their
    links' latency where the table gives none is a scale-out link's."""
    from tokenpath.fabric.dragonfly import DragonFly
    from tokenpath.fabric.fattree import FatTree
    from tokenpath.fabric.hierarchy import Hierarchy
    from tokenpath.fabric.single_hop import FullMesh, Switch
    from tokenpath.fabric.torus import Mesh, Torus

    def scaleup_bw() -> float:
        return scaleup_link_bw_Bps(spec, scaleup_bw_Bps, chips)

    def scaleout_bw() -> float:
        if spec.link_bw is None:
            raise UserError(f"fabric.link_bw: a {spec.kind} network needs its link bandwidth, e.g. '50 GB/s' "
                            "for a 400 Gb/s NIC")
        return spec.link_bw

    def latency(default_s: float) -> float:
        return default_s if spec.link_latency is None else spec.link_latency

    def hop_s(links: int = 1) -> float:
        """A link's latency where the table gives none: a hierarchy's network's (`scaleout`), a scale-out
        link's, as a fat tree's; else a scale-up step's under the runtime of the chips, shared by the
        `links` links it crosses (a switch's two)."""
        if scaleout:
            return assumed("scaleout_link_latency_s", SCALEOUT_LINK_LATENCY_S)
        if runs_rccl(generation):
            return assumed("xgmi_hop_latency_s", XGMI_HOP_LATENCY_S) / links
        return assumed("nvlink_hop_latency_s", NVLINK_HOP_LATENCY_S) / links

    def hosts() -> int:
        if spec.hosts is not None:
            return spec.hosts
        if chips is None or (chips < 2 and spec.kind != "switch"):
            raise UserError(f"fabric.hosts: a {spec.kind} needs at least 2 hosts; set fabric.hosts")
        return chips

    if isinstance(spec, SwitchFabric):
        if generation is not None and spec.nvls_generation not in (None, generation):
            raise UserError(f"fabric.nvls_generation: {spec.nvls_generation!r}, but the deployment's chips are "
                            f"{generation!r} (catalog/chips.toml); leave it out to take the chip's")
        return Switch(hosts(), scaleup_bw(), latency(hop_s(links=2)),
                      nvls=spec.nvls, generation=generation or spec.nvls_generation or "Hopper")
    if isinstance(spec, FullMeshFabric):
        return FullMesh(hosts(), scaleup_bw(), latency(hop_s()),
                        generation or "")
    if isinstance(spec, MeshFabric):
        return _of(Mesh(tuple(spec.dims), scaleup_bw(),
                        latency(hop_s())), generation)
    if isinstance(spec, TorusFabric):
        return _of(Torus(tuple(spec.dims), scaleup_bw(),
                         latency(hop_s()), wraparound=spec.wraparound),
                   generation)
    if isinstance(spec, FatTreeFabric):
        ratios = None if spec.oversubscription is None else tuple(spec.oversubscription)
        return _of(FatTree(spec.k, scaleout_bw(),
                           latency(assumed("scaleout_link_latency_s", SCALEOUT_LINK_LATENCY_S)),
                           levels=spec.levels, oversubscription=ratios), generation)
    if isinstance(spec, DragonFlyFabric):
        return _of(DragonFly(spec.p, scaleout_bw(),
                             latency(assumed("scaleout_link_latency_s", SCALEOUT_LINK_LATENCY_S)),
                             a=spec.a, h=spec.h, g=spec.g, routing=spec.routing, global_bw_Bps=spec.global_bw,
                             global_latency_s=spec.global_latency), generation)
    if isinstance(spec, HierarchyFabric):
        node = _part(spec.node, "node", scaleup_bw_Bps, generation)
        network = _part(spec.network, "network", None, None, scaleout=True)
        return Hierarchy(spec.nodes, node, network, rails=spec.rails)
    raise AssertionError(spec)


def _of(topology: Topology, generation: str | None) -> Topology:
    """`topology`, its chips of `generation` where one is given."""
    if generation is not None:
        topology.generation = generation
    return topology


def scaleup_link_bw_Bps(spec, scaleup_bw_Bps: float | None, chips: int | None) -> float:
    """A scale-up table's link bandwidth: its own `link_bw`, else the chip's `scaleup_bw_Bps` shared
    over the chip's ports (`scaleup_ports`)."""
    if spec.link_bw is not None:
        return spec.link_bw
    if scaleup_bw_Bps is None:
        raise UserError("fabric.link_bw: not set and no chip to take it from; give it, e.g. '450 GB/s'")
    return scaleup_bw_Bps / scaleup_ports(spec, chips)


def scaleup_ports(spec, chips: int | None) -> int:
    """Ports a chip of the scale-up table `spec` shares its scale-up bandwidth over: one into a switch,
    one per other chip in a full mesh (of `chips`, the deployment's, where the table leaves hosts
    out), two per dimension (plus and minus) in a torus or mesh."""
    if isinstance(spec, FullMeshFabric):
        return max(1, (spec.hosts or chips or 1) - 1)
    if isinstance(spec, (TorusFabric, MeshFabric)):
        return 2 * max(1, len(spec.dims))
    return 1


def _part(spec, name: str, scaleup_bw_Bps: float | None, generation: str | None, scaleout: bool = False) -> Topology:
    """A hierarchy's node or network; its errors name the sub-table (fabric.node.hosts, ...)."""
    try:
        return build_topology(spec, scaleup_bw_Bps, None, generation, scaleout)
    except UserError as error:
        raise UserError(str(error).replace("fabric.", f"fabric.{name}.", 1)) from None


def default_fabric(chip: str, chips: int, domain: int, scaleup: dict, nic_bw_Bps: float) -> tuple[object, str]:
    """The fabric of `chips` chips named `chip` when the scenario gives none, and a line saying what it is.

    Up to `domain` chips (the chip's scale-up domain), its `scaleup` fabric: a switch of the chips
    used, or a full mesh of the whole domain (its links are per pair, whatever the chips used). Beyond
    that, as the h100-4x8-rail preset builds and NVIDIA's DGX SuperPOD reference architecture cables
    it: ceil(chips / domain) such nodes, every chip with a `nic_bw_Bps` NIC, NIC i of every node on
    rail i of a non-blocking leaf-spine sized to hold them, each rail within one leaf.
    """
    def spec(table: dict, where: str):
        try:
            return TypeAdapter(FabricSpec).validate_python(table)
        except ValidationError as error:
            raise UserError(explain(error, where, FabricSpec)) from None

    node = dict(scaleup)
    kind = node.get("kind", "switch")
    if kind == "fullmesh":
        node["hosts"] = domain
    if chips <= domain:
        size = domain if kind == "fullmesh" else chips
        return (spec(node, f"catalog chips.toml [{chip}] scaleup"),
                f"one {size}-chip {kind} (default for {chips} {chip})")
    if not nic_bw_Bps:
        raise UserError(f"deployment.fabric: {chips} {chip} are more than one scale-up domain ({domain} chips) and the "
                        f"catalog has no NIC bandwidth for {chip}; give deployment.fabric (`tokenpath fabric --list`)")
    node["hosts"] = domain
    nodes = -(-chips // domain)
    rails_per_leaf = 1  # the smallest leaf-spine of k = 2 * rails_per_leaf * nodes ports that holds every NIC
    while 2 * rails_per_leaf ** 2 * nodes < domain:
        rails_per_leaf += 1
    network = {"kind": "fattree", "levels": 2, "k": 2 * rails_per_leaf * nodes, "link_bw": nic_bw_Bps}
    table = {"kind": "hierarchy", "nodes": nodes, "rails": True, "node": node, "network": network}
    nic = f"{nic_bw_Bps * 8 / 1e9:g}G"
    return (spec(table, f"default fabric for {chips} {chip}"),
            f"{nodes} x {domain}-chip nodes on {nic} rails (default for {chips} {chip})")
