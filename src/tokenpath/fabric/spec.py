"""The fabric table (`[deployment.fabric]` in a scenario, or a topology file): one `kind` and its parameters.

A preset name can stand for the whole table (`fabric = "dgx-h100"`), or a table can start from one
(`preset = "dgx-h100"` plus overrides). Bandwidth and latency are per link and direction; where a
scale-up table leaves `link_bw` out, the chip's scale-up bandwidth is shared over its ports.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError

from tokenpath.config_errors import explain

from tokenpath.errors import UserError
from tokenpath.units import Bandwidth, Duration

Algorithm = Literal["auto", "ring", "tree", "halving_doubling", "nvls", "nvls_tree", "bucket", "hierarchical"]


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: Algorithm = Field("auto", description="collective algorithm; auto picks the fastest per size, as NCCL")


class _Fabric(_Common):
    link_bw: Bandwidth | None = Field(None, description="per link and direction")
    link_latency: Duration | None = Field(None, description="per link")


class SwitchFabric(_Fabric):
    """One non-blocking switched domain (NVSwitch, NVL72)."""

    kind: Literal["switch"] = "switch"
    hosts: int | None = Field(None, ge=1, description="default: the deployment's chips")
    nvls: bool = Field(True, description="the switch reduces in the network (NVLink SHARP)")


class FullMeshFabric(_Fabric):
    """A cable between every pair of chips (xGMI, UB-Mesh-style)."""

    kind: Literal["fullmesh"] = "fullmesh"
    hosts: int | None = Field(None, ge=2, description="default: the deployment's chips")


class TorusFabric(_Fabric):
    """k-ary n-cube with per-dimension sizes; a 1-D torus is a ring."""

    kind: Literal["torus"] = "torus"
    dims: list[int]
    wraparound: bool = True


class MeshFabric(_Fabric):
    """A torus without wraparound links."""

    kind: Literal["mesh"] = "mesh"
    dims: list[int]


class FatTreeFabric(_Fabric):
    """k-ary fat tree: 3 levels (k^3/4 hosts) or a 2-tier leaf-spine (k^2/2 hosts)."""

    kind: Literal["fattree"] = "fattree"
    k: int
    levels: int = 3
    oversubscription: list[float] | None = Field(None, description="one ratio per switch tier, bottom up; 1 = non-blocking")


class DragonFlyFabric(_Fabric):
    """Groups of all-to-all routers joined by global links; balanced a = 2p = 2h by default."""

    kind: Literal["dragonfly"] = "dragonfly"
    p: int
    a: int | None = None
    h: int | None = None
    g: int | None = None
    routing: Literal["min", "valiant", "ugal"] = "min"
    global_bw: Bandwidth | None = Field(None, description="default: link_bw")
    global_latency: Duration | None = Field(None, description="default: link_latency")


ScaleUp = Annotated[Union[SwitchFabric, FullMeshFabric, TorusFabric, MeshFabric], Field(discriminator="kind"),
                    BeforeValidator(lambda value: _expand_preset(value))]
ScaleOut = Annotated[Union[FatTreeFabric, DragonFlyFabric, TorusFabric, MeshFabric, SwitchFabric],
                     Field(discriminator="kind"), BeforeValidator(lambda value: _expand_preset(value))]


class HierarchyFabric(_Common):
    """`nodes` scale-up domains, every chip with its own NIC on a scale-out network; link figures
    belong to the `node` and `network` tables."""

    kind: Literal["hierarchy"] = "hierarchy"
    nodes: int = Field(ge=1)
    node: ScaleUp
    network: ScaleOut
    rails: bool = Field(True, description="NIC i of every node on rail i (rail-optimized)")


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
    Union[SwitchFabric, FullMeshFabric, TorusFabric, MeshFabric, FatTreeFabric, DragonFlyFabric, HierarchyFabric],
    Field(discriminator="kind"),
    BeforeValidator(_expand_preset),
]


def _presets_dir():
    return resources.files("tokenpath.catalog") / "fabrics"


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".toml") for p in _presets_dir().iterdir() if p.name.endswith(".toml"))


def preset_table(name: str) -> dict[str, Any]:
    path = _presets_dir() / f"{name}.toml"
    if not path.is_file():
        raise UserError(f"fabric: unknown preset {name!r}; use one of {', '.join(preset_names())}")
    table = tomllib.loads(path.read_text(encoding="utf-8"))
    table.pop("description", None)
    table.pop("source", None)
    return table


def preset_description(name: str) -> str:
    table = tomllib.loads((_presets_dir() / f"{name}.toml").read_text(encoding="utf-8"))
    return table.get("description", "")


def read_topology_file(path: Path) -> dict[str, Any]:
    """A topology TOML file's table, without its description and source."""
    try:
        table = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"{path}: cannot read the topology file ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML ({exc})") from None
    table.pop("description", None)
    table.pop("source", None)
    return table


def load_fabric(ref: str) -> tuple[Any, str]:
    """A fabric spec from a preset name or a topology TOML file: (spec, its description)."""
    path = Path(ref)
    if path.suffix == ".toml" or path.exists():
        table = read_topology_file(path)
        source = str(path)
        description = tomllib.loads(path.read_text(encoding="utf-8")).get("description", "")
    else:
        table, source, description = ref, f"fabric preset {ref!r}", preset_description(ref) if ref in preset_names() else ""
    try:
        return TypeAdapter(FabricSpec).validate_python(table), description
    except ValidationError as error:
        raise UserError(explain(error, source, FabricSpec)) from None
