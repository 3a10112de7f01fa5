"""A replica's pipeline stages, shared by its batches in flight.

Pipeline parallelism runs `pp` batches in flight per replica, each simulated as an engine of its own
whose step crosses every stage (sim/deployment.py). The stages are the replica's chips: each runs one
batch's part of a step at a time, in the order the steps were launched (vLLM's and SGLang's
micro-batches, TensorRT-LLM's batches in flight: a stage's stream takes the work it is given in turn).
A step enters its first stage when that stage is free, and each later stage when its part before is
done and the stage is free: a permutation flow shop. Batches of equal steps overlap as a pipeline does,
each stage busy with one batch while the next stage runs another, and a batch's steps come as often as
they would alone; a long step in one batch (a prompt) holds each stage in turn, and the other batches'
steps wait behind it at every stage, their tokens later for it.

A step's time (compute and traffic, the hand-offs between stages among it) is split evenly over the
stages: they hold the same layers, one apart at most (compute/roofline.py, `pipeline_stage_layers`). A
speculative-decoding drafter runs on the last stage alone, after its part of the step: it reads the target's
last hidden states, which only that stage has (vLLM builds its drafter there: gpu_model_runner.py, "we put
the entire draft model on the last PP rank").
"""

from __future__ import annotations


class Pipeline:
    """The stages of one replica's pipeline: when each is next free."""

    def __init__(self, stages: int) -> None:
        if stages < 2:
            raise ValueError("a pipeline has two stages or more")
        self.free_ns = [0] * stages

    def run(self, start_ns: int, busy_ns: int, last_only_ns: int = 0) -> int:
        """When a step launched at `start_ns`, which takes `busy_ns` over all the stages alone and
        `last_only_ns` more on the last (a drafter's passes), ends; each stage is taken for its part."""
        free = self.free_ns
        last = len(free) - 1
        part, rest = divmod(busy_ns, last + 1)
        end_ns = start_ns
        for stage, free_ns in enumerate(free):
            end_ns = (free_ns if free_ns > end_ns else end_ns) + part + (rest + last_only_ns if stage == last else 0)
            free[stage] = end_ns
        return end_ns
