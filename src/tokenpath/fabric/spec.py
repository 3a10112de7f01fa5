"""The fabric table (`[deployment.fabric]` in a scenario, or a topology file): one `kind` and its parameters.

A preset name can stand for the whole table (`fabric = "dgx-h100"`), or a table can start from one
(`preset = "dgx-h100"` plus overrides). Bandwidth and latency are per link and direction; where a
scale-up table leaves `link_bw` out, the chip's scale-up bandwidth is shared over its ports.
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import tomllib
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from tokenpath.config import files
from tokenpath.config.config_errors import explain
from tokenpath.config.errors import UserError, quoted
from tokenpath.config.units import Bandwidth, Duration

Algorithm = Literal["auto", "ring", "tree", "halving_doubling", "nvls", "nvls_tree", "bucket", "hierarchical"]

# Size limits of a fabric, so that building one never takes absurd memory or time. Hosts: 2^17 =
# 131,072 chips, more than any one model is served on. Routers: link loads are
# computed on a routers x routers demand matrix, so direct networks (tori, meshes, full meshes and
# hierarchies, where every chip is a router) and DragonFly groups are held to 2^14 = 16,384 routers
# (a 2 GiB matrix; a TPU v5p pod is 8,960 chips). A full mesh has a cable per pair of chips: 1,024
# chips is 1,023 ports each, beyond any chip.
MAX_FABRIC_HOSTS = 2**17
MAX_ROUTERS = 2**14
MAX_FULLMESH_HOSTS = 1024
# NCCL's tuner rates the in-switch reduction (NVLS) of each GPU generation at this share of its NVLink
# bandwidth: src/graph/tuning.cc, nvlsEfficiency (Volta 0, Ampere 0, Hopper 0.85, Blackwell 0.74); a generation
# it rates at 0, or one NCCL does not run on, reduces in no switch. A switch's GPUs' generation is its chip's
# (catalog/chips.toml `generation`, which fabric/build.py hands the topology); a table built with no chip may
# name it (`nvls_generation`), else Hopper, the generation NVLS arrived with.
NVLS_TUNER_EFFICIENCY = {"Hopper": 0.85, "Blackwell": 0.74}
NvlsGeneration = Literal["Hopper", "Blackwell"]


def _check_size(kind: str, hosts: int, routers: int) -> None:
    def count(n: int) -> str:
        return f"{n:,}" if n < 10**18 else "more than 10^18"

    if hosts > MAX_FABRIC_HOSTS:
        raise ValueError(f"this {kind} has {count(hosts)} hosts; fabrics are limited to {MAX_FABRIC_HOSTS:,}")
    if routers > MAX_ROUTERS:
        raise ValueError(f"this {kind} has {count(routers)} routers; fabrics are limited to {MAX_ROUTERS:,} "
                         "(link loads are computed on a routers x routers matrix)")


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    algorithm: Algorithm = Field("auto", description="collective algorithm; auto picks the fastest per size, as NCCL")


class _Fabric(_Common):
    link_bw: Bandwidth | None = Field(None, description="per link and direction")
    link_latency: Duration | None = Field(None, description="per link; default: a scale-up step's under the chips' "
                                                            "runtime (a switch's two links share it), or in a "
                                                            "scale-out network a network link's (fabric/build.py)")


class SwitchFabric(_Fabric):
    """One non-blocking switched domain (NVSwitch, NVL72)."""

    kind: Literal["switch"] = "switch"
    hosts: int | None = Field(None, ge=1, le=MAX_FABRIC_HOSTS, description="default: the deployment's chips")
    nvls: bool = Field(True, description="the switch reduces in the network (NVLink SHARP)")
    nvls_generation: NvlsGeneration | None = Field(
        None, description="its GPUs' generation, whose in-switch reduction NCCL rates at 0.85 (Hopper) or 0.74 "
        "(Blackwell) of the links (default: the chip's, catalog/chips.toml; with no chip, Hopper)")


class FullMeshFabric(_Fabric):
    """A cable between every pair of chips (xGMI, UB-Mesh-style)."""

    kind: Literal["fullmesh"] = "fullmesh"
    hosts: int | None = Field(None, ge=2, le=MAX_FULLMESH_HOSTS, description="default: the deployment's chips")


class TorusFabric(_Fabric):
    """k-ary n-cube with per-dimension sizes; a 1-D torus is a ring."""

    kind: Literal["torus"] = "torus"
    dims: list[int]
    wraparound: bool = True

    @model_validator(mode="after")
    def _size(self) -> TorusFabric:
        _check_size(self.kind, _chips(self.dims), _chips(self.dims))
        return self


class MeshFabric(_Fabric):
    """A torus without wraparound links."""

    kind: Literal["mesh"] = "mesh"
    dims: list[int]

    @model_validator(mode="after")
    def _size(self) -> MeshFabric:
        _check_size(self.kind, _chips(self.dims), _chips(self.dims))
        return self


def _chips(dims: list[int]) -> int:
    """Chips of a torus or mesh (a dimension below 1 is left to the topology's own check)."""
    return math.prod(max(1, k) for k in dims)


class FatTreeFabric(_Fabric):
    """k-ary fat tree: 3 levels (k^3/4 hosts) or a 2-tier leaf-spine (k^2/2 hosts)."""

    kind: Literal["fattree"] = "fattree"
    k: int = Field(le=MAX_FABRIC_HOSTS)
    levels: int = 3
    oversubscription: list[float] | None = Field(
        None, description="one ratio per switch tier, bottom up; 1 = non-blocking")

    @model_validator(mode="after")
    def _size(self) -> FatTreeFabric:
        half = max(1, self.k // 2)
        hosts = self.k * half * half if self.levels == 3 else self.k * half
        _check_size(self.kind, hosts, hosts // half)
        return self


class DragonFlyFabric(_Fabric):
    """Groups of all-to-all routers joined by global links; balanced a = 2p = 2h by default."""

    kind: Literal["dragonfly"] = "dragonfly"
    p: int = Field(le=MAX_FABRIC_HOSTS)
    a: int | None = Field(None, le=MAX_ROUTERS)
    h: int | None = Field(None, le=MAX_ROUTERS)
    g: int | None = Field(None, le=MAX_ROUTERS)
    routing: Literal["min", "valiant", "ugal"] = "min"
    global_bw: Bandwidth | None = Field(None, description="default: link_bw")
    global_latency: Duration | None = Field(None, description="default: link_latency")

    @model_validator(mode="after")
    def _size(self) -> DragonFlyFabric:
        # The defaults of fabric.dragonfly.DragonFly: a = 2p, h = p, g = a*h + 1.
        a = 2 * self.p if self.a is None else self.a
        h = self.p if self.h is None else self.h
        g = a * h + 1 if self.g is None else self.g
        routers = max(1, a) * max(1, g)
        _check_size(self.kind, max(1, self.p) * routers, routers)
        return self


ScaleUp = Annotated[SwitchFabric | FullMeshFabric | TorusFabric | MeshFabric, Field(discriminator="kind"),
                    BeforeValidator(lambda value: _expand_preset(value))]
ScaleOut = Annotated[FatTreeFabric | DragonFlyFabric | TorusFabric | MeshFabric | SwitchFabric,
                     Field(discriminator="kind"), BeforeValidator(lambda value: _expand_preset(value))]


class HierarchyFabric(_Common):
    """`nodes` scale-up domains, every chip with its own NIC on a scale-out network; link figures
    belong to the `node` and `network` tables."""

    kind: Literal["hierarchy"] = "hierarchy"
    nodes: int = Field(ge=1, le=MAX_ROUTERS)
    node: ScaleUp
    network: ScaleOut
    rails: bool = Field(True, description="NIC i of every node on rail i (rail-optimized)")

    @property
    def chips_per_node(self) -> int | None:
        """The chips of one node (one scale-up domain); None where its table leaves the count out."""
        return _chips(self.node.dims) if isinstance(self.node, (TorusFabric, MeshFabric)) else self.node.hosts

    @model_validator(mode="after")
    def _size(self) -> HierarchyFabric:
        per_node = self.chips_per_node
        if per_node is not None:  # every chip of a hierarchy is a router
            _check_size(self.kind, self.nodes * per_node, self.nodes * per_node)
        return self


def _expand_preset(value: Any) -> Any:
    """A preset name, or a table with `preset = NAME` and overrides, becomes the full table; a table
    without a kind is a switched domain. (ValueError, so the error names where the name was given.)"""
    try:
        if isinstance(value, str):
            return preset_table(value)
        if isinstance(value, dict) and "preset" in value:
            overrides = {k: v for k, v in value.items() if k != "preset"}
            return {**preset_table(value["preset"]), **overrides}
    except UserError as error:
        raise ValueError(str(error).removeprefix("fabric: ")) from None
    if isinstance(value, dict) and "kind" not in value:
        return {"kind": "switch", **value}
    return value


FabricSpec = Annotated[
    SwitchFabric | FullMeshFabric | TorusFabric | MeshFabric | FatTreeFabric | DragonFlyFabric | HierarchyFabric,
    Field(discriminator="kind"),
    BeforeValidator(_expand_preset),
]


def _presets_dir():
    return resources.files("tokenpath.catalog") / "fabrics"


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".toml") for p in _presets_dir().iterdir() if p.name.endswith(".toml"))


def preset_table(name: str) -> dict[str, Any]:
    if name not in preset_names():
        raise UserError(f"fabric: unknown preset {quoted(name)}; use one of {', '.join(preset_names())}")
    path = _presets_dir() / f"{name}.toml"
    table = tomllib.loads(path.read_text(encoding="utf-8"))
    table.pop("description", None)
    table.pop("source", None)
    return table


def preset_description(name: str) -> str:
    table = tomllib.loads((_presets_dir() / f"{name}.toml").read_text(encoding="utf-8"))
    return table.get("description", "")


def _read_topology(path: Path) -> dict[str, Any]:
    return files.parse_toml(files.read_text(path, "topology file"), files.shown(path))


def read_topology_file(path: Path) -> dict[str, Any]:
    """A topology TOML file's table, without its description and source."""
    table = _read_topology(path)
    table.pop("description", None)
    table.pop("source", None)
    return table


def load_fabric(ref: str) -> tuple[Any, str]:
    """A fabric spec from a preset name or a topology TOML file: (spec, its description)."""
    path = Path(ref)
    if ref.endswith(".toml") or files.exists(ref) or files.path_problem(ref):
        table = _read_topology(path)
        description = table.pop("description", "")
        table.pop("source", None)
        source = files.shown(path)
    else:
        description = preset_description(ref) if ref in preset_names() else ""
        table, source = ref, f"fabric preset {quoted(ref)}"
    try:
        return TypeAdapter(FabricSpec).validate_python(table), description
    except ValidationError as error:
        raise UserError(explain(error, source, FabricSpec)) from None
