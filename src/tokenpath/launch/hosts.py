"""How a launch lays a pool's GPUs over hosts (machines of the chip's `chips_per_host`, compute/chip.py):
as few as hold them, each running the same number of GPUs, each either whole replicas or an equal part
of every replica. vLLM's --nnodes asks for that: it splits a deployment's ranks evenly over its nodes
(`world_size % nnodes`, EngineArgs.create_engine_config, vllm/engine/arg_utils.py in 0.34.0)."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpath.launch.command import ShellVariable

# What a script over several hosts reads from each host's environment: its index among them, and the
# address of host 0 (launch/scripts.py checks both are set).
NODE_RANK_VARIABLE, HEAD_ADDR_VARIABLE = "NODE_RANK", "HEAD_ADDR"
NODE_RANK, HEAD_ADDR = ShellVariable(NODE_RANK_VARIABLE), ShellVariable(HEAD_ADDR_VARIABLE)


@dataclass(frozen=True)
class Hosts:
    count: int            # the hosts a pool takes
    gpus_per_host: int    # the GPUs it runs on each (all of them, or fewer where the replicas divide no other way)
    chips_per_host: int   # the GPUs a host has

    @property
    def one(self) -> bool:
        return self.count == 1


def hosts(replicas: int, gpus_per_replica: int, chips_per_host: int) -> Hosts:
    """The fewest hosts of `chips_per_host` GPUs that hold `replicas` replicas of `gpus_per_replica` GPUs
    evenly: each the same number of GPUs, a multiple of a replica's or a whole share of one."""
    total = replicas * gpus_per_replica
    count = -(-total // chips_per_host)
    while True:  # ends by count = total at the latest: one GPU a host, a whole share of every replica
        local = total // count
        if total % count == 0 and (local % gpus_per_replica == 0 or gpus_per_replica % local == 0):
            return Hosts(count, local, chips_per_host)
        count += 1
