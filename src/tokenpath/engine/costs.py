"""One step's cost on a replica: compute on each chip, then the traffic its parallelism puts on the fabric.

Traffic of one step, not overlapped with compute (as in eager TP all-reduces):
- tensor parallel: two all-reduces of the hidden state per layer, run by every TP group of every stage
  and replica at once, so groups that share links slow each other down (with attention data-parallel,
  one: an all-gather before the MLP and a reduce-scatter after it, ComputeModel.allreduces_per_layer);
- expert parallel (MoE, whole experts spread over each replica's tp chips): by default each MoE layer's
  hidden states are gathered over the experts' chips before the experts and reduce-scattered after, the
  all-reduce the layer has anyway (vLLM's default all2all_backend
  allgather_reducescatter, vllm/config/parallel.py; SGLang's --moe-a2a-backend none; TensorRT-LLM's
  allgather and reducescatter wherever WideEPMoE.select_alltoall_method_type picks no all-to-all, as on
  one NVLink domain with no more expert ranks than a token's experts, tensorrt_llm/_torch/modules/fused_moe/).
  With `moe_all_to_all` (DeepEP) each MoE layer's all-reduce becomes an all-to-all dispatch and an
  all-to-all combine of the routed token copies, the tokens split over the TP ranks. Decode-only steps
  run them with low-latency kernels, which send a token once for each of its experts, and steps with
  prompt tokens with the bandwidth-oriented ones, which send it once to each rank holding any of its
  experts (`distinct_ranks_per_token`), as SGLang's DeepEP mode auto does;
- pipeline parallel: the hidden state handed from each stage to the next, each TP rank its slice;
- disaggregated serving: a prefilled request's KV cache sent from the prefill replica to the decode
  replica, each TP rank its own heads to the same rank there (`kv_transfer_s`; the pipeline queues
  transfers that share a replica).
"""

from __future__ import annotations

from functools import lru_cache
from math import prod

from tokenpath.compute.drafter import DraftCost
from tokenpath.compute.roofline import ComputeModel
from tokenpath.config.errors import UserError
from tokenpath.engine.placement import Placement
from tokenpath.engine.speculative import Speculation
from tokenpath.fabric.collectives import AffineCost, Collectives, fastest_s

# What a pipeline stage hands the next, per token: the hidden states and the residual stream, each of the
# hidden size (vLLM's models return IntermediateTensors({"hidden_states", "residual"}) on every stage but the last, e.g.
# vllm/model_executor/models/llama.py, LlamaModel.forward; SGLang's PPProxyTensors hold the same two), each TP
# rank sending its 1/tp share, gathered again on the next stage (GroupCoordinator.send_tensor_dict's
# all_gather_group).
PP_HANDOFF_TENSORS = 2


def distinct_ranks_per_token(experts: int, per_token: int, ranks: int) -> float:
    """The ranks a token's `per_token` routed experts are on, expected over routings that draw them at
    random without replacement from `experts` spread evenly over `ranks`: each rank is missed with the chance
    that every draw falls elsewhere. DeepEP's normal dispatch sends a token's hidden state once to each such
    rank (`is_token_in_rank` in get_dispatch_layout, deep_ep's csrc/kernels/layout.cu) and its combine sends
    one back from each; its low-latency kernels send a copy for each expert. DeepSeek-V3's 8 of 256 experts
    over 8 ranks: 5.29 ranks, not 8 copies. (Across nodes DeepEP sends a token once to each node, then over
    NVLink: the fabric's all-to-all here spreads the ranks' copies over every link, the network's included.)"""
    per_rank = experts / ranks
    missed = prod((experts - per_rank - i) / (experts - i) for i in range(per_token))
    return ranks * (1.0 - max(missed, 0.0))


class GroupStepCosts:
    def __init__(self, compute: ComputeModel, collectives: Collectives, placement: Placement,
                 expert_parallel: bool = False, speculation: Speculation | None = None,
                 draft: DraftCost | None = None, moe_all_to_all: bool = False) -> None:
        """`speculation`: speculative decoding's drafts and acceptance (engine/speculative.py); `draft`: the
        drafter's cost on the chip (compute/drafter.py; None for one that does no GPU work)."""
        model = compute.model
        if expert_parallel and not model.is_moe:
            raise UserError(f"deployment.expert_parallel: {model.name} has no experts; set it to false")
        if expert_parallel and placement.pp > 1:
            raise UserError("deployment.expert_parallel: not modelled together with pp > 1; use pp = 1")
        if moe_all_to_all and not expert_parallel:
            raise UserError("deployment.moe_all_to_all: all-to-all dispatch needs the experts spread over the chips; "
                            "set deployment.expert_parallel = true or moe_all_to_all = false")
        self.compute = compute
        self.collectives = collectives
        self.placement = placement
        tp = placement.tp
        # the MoE layers whose all-reduce all-to-alls replace
        moe_layers = model.num_layers - model.dense_layers if expert_parallel and moe_all_to_all else 0
        collective_layers = model.num_layers - compute.rank_local_layers
        self.allreduces_per_step = (compute.allreduces_per_layer * collective_layers - moe_layers) if tp > 1 else 0
        self.all_to_alls_per_step = 2 * moe_layers if tp > 1 else 0
        self._tp_groups = placement.tp_groups()  # (the experts' chips too: each replica's)
        self._handoffs = [placement.stage_handoffs(s) for s in range(placement.pp - 1)]
        # What each collective can cost at any size (Collectives.candidates), read once: a step's size is
        # new most steps, and at each the fastest of them runs.
        self._all_reduce = collectives.candidates("all_reduce", self._tp_groups) if self.allreduces_per_step else ()
        self._all_to_all = {kernels: collectives.candidates("all_to_all", self._tp_groups, kernels)
                            for kernels in ("low_latency", "direct")} if self.all_to_alls_per_step else {}
        # The copies of a token each kind of kernel sends (`distinct_ranks_per_token`)
        self._routed_copies = {"low_latency": float(model.experts_per_token),
                               "direct": distinct_ranks_per_token(model.num_experts, model.experts_per_token, tp)
                               if self.all_to_alls_per_step else 0.0}
        self._send_recv = [collectives.candidates("send_recv", pairs) for pairs in self._handoffs]
        # They run once per engine step: bind them directly.
        self.compute_s = compute.step_time_s
        self.decode_steps_s = compute.decode_steps_s
        # (None where no step's time depends on how far ahead its host launches: the engine keeps no lead then)
        self.host_busy_s = compute.host_busy_s if compute.host_lead_matters else None
        self.speculation = speculation
        self.attention_ranks = tp if compute.attention_dp else 1
        # The drafter's time in a step (None: no drafter on the chip, or no speculative decoding).
        self.draft_s = None if draft is None else draft.step_s
        self.traffic_s = lru_cache(maxsize=65536)(self._traffic_s)
        # Per instance, so a deployment's paths die with it (a cache on the method would hold every
        # instance it saw, keyed by it, for the life of the process).
        self._kv_path = lru_cache(maxsize=None)(self._kv_path_uncached)

    def traffic_parts_s(self, num_tokens: int, decode_only: bool = False) -> dict[str, float]:
        """Per-step traffic time by kind, for a step of `num_tokens` tokens (`decode_only`: one for each
        decoding sequence, no prompt tokens)."""
        hidden_bytes = self.compute.allreduce_bytes(num_tokens)
        tp = self.placement.tp
        parts = {"tp_all_reduce": 0.0, "ep_all_to_all": 0.0, "pp_send_recv": 0.0}
        if num_tokens <= 0:
            return parts
        if self.allreduces_per_step:
            parts["tp_all_reduce"] = self.allreduces_per_step * fastest_s(self._all_reduce, hidden_bytes)
        if self.all_to_alls_per_step:
            kernels = "low_latency" if decode_only else "direct"
            routed_bytes = hidden_bytes / tp * self._routed_copies[kernels]
            parts["ep_all_to_all"] = self.all_to_alls_per_step * fastest_s(self._all_to_all[kernels], routed_bytes)
        for costs in self._send_recv:  # (each TP rank its share, gathered again on the next stage's ranks)
            parts["pp_send_recv"] += fastest_s(costs, PP_HANDOFF_TENSORS * hidden_bytes / tp)
        return parts

    def kv_transfer_s(self, prompt_tokens: int, src_replica: int, dst_replica: int) -> float:
        """Time to move `prompt_tokens` tokens of KV cache from one replica to another."""
        size = self.compute.kv_cache_bytes_per_chip(prompt_tokens)
        return self._kv_path(src_replica, dst_replica).time_s(size)

    def _kv_path_uncached(self, src_replica: int, dst_replica: int) -> AffineCost:
        """Rank t of one replica to rank t of the other, all ranks at once."""
        hosts = self.placement.hosts
        pairs = [[int(a), int(b)] for a, b in zip(hosts[src_replica].ravel(), hosts[dst_replica].ravel())]
        return self.collectives.cost("send_recv", pairs)

    def _traffic_s(self, num_tokens: int, decode_only: bool) -> float:
        return sum(self.traffic_parts_s(num_tokens, decode_only).values())
