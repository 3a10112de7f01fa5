"""Where each chip of a deployment sits on the fabric, and the groups that talk to each other.

Chips are ordered replica by replica, stage by stage, tensor-parallel rank by rank; `hosts[r, s, t]` is
the fabric host of rank t of stage s of replica r.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenpath.config.errors import UserError


@dataclass(frozen=True)
class Placement:
    hosts: np.ndarray  # (replicas, pp, tp) fabric host ids

    @property
    def replicas(self) -> int:
        return self.hosts.shape[0]

    @property
    def pp(self) -> int:
        return self.hosts.shape[1]

    @property
    def tp(self) -> int:
        return self.hosts.shape[2]

    def tp_groups(self) -> list[list[int]]:
        """Every tensor-parallel group of every stage and replica (they run at the same time)."""
        return self.hosts.reshape(-1, self.tp).tolist()

    def stage_handoffs(self, stage: int) -> list[list[int]]:
        """Pairs (rank t of `stage`, rank t of the next stage) of every replica: the activations' path."""
        pairs = np.stack([self.hosts[:, stage, :], self.hosts[:, stage + 1, :]], axis=-1)
        return pairs.reshape(-1, 2).tolist()


def place(placement: str | list[int], replicas: int, pp: int, tp: int, fabric_hosts: int) -> Placement:
    """Lay out `replicas * pp * tp` chips on a fabric of `fabric_hosts` hosts.

    packed: each group on consecutive hosts (a TP group stays inside a node or a torus row);
    spread: rank t of every group side by side, so one group's ranks are `replicas * pp` hosts apart;
    a list: the host of every chip, in the order above.
    """
    chips = replicas * pp * tp
    if chips > fabric_hosts:
        raise UserError(f"deployment.chips: {chips} chips do not fit the fabric's {fabric_hosts} hosts; "
                        f"lower deployment.chips or enlarge deployment.fabric")
    groups = replicas * pp
    if placement == "packed":
        hosts = np.arange(chips)
    elif placement == "spread":
        hosts = (np.arange(tp)[None, :] * groups + np.arange(groups)[:, None]).ravel()
    else:
        hosts = np.asarray(placement, np.int64)
        if hosts.ndim != 1 or len(hosts) != chips:
            raise UserError(f"deployment.placement: give one host per chip ({chips}), got {len(hosts)}")
        if len(hosts) and (hosts.min() < 0 or hosts.max() >= fabric_hosts):
            raise UserError(f"deployment.placement: hosts must be in 0..{fabric_hosts - 1}, got {int(hosts.max())}"
                            if hosts.max() >= fabric_hosts else
                            f"deployment.placement: hosts must be in 0..{fabric_hosts - 1}, got {int(hosts.min())}")
        if len(np.unique(hosts)) != len(hosts):
            raise UserError("deployment.placement: a host appears twice; give each chip its own host")
    return Placement(hosts.reshape(replicas, pp, tp))
