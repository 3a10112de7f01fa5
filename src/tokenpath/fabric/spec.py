"""The `[deployment.fabric]` table: how the chips of a deployment are connected."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tokenpath.units import Bandwidth, Duration


class FabricSpec(BaseModel):
    """A single switched scale-up domain; link figures default to the chip's own scale-up port."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["switch"] = "switch"
    link_bw: Bandwidth | None = Field(None, description="per chip and direction; default: the chip's scale-up bandwidth")
    link_latency: Duration | None = Field(None, description="per hop; default: NVLink's, from NCCL's tuning model")
    algorithm: Literal["auto", "ring", "nvls"] = "auto"
    nvls: bool = Field(True, description="the switch can reduce in the network (NVLink SHARP)")
