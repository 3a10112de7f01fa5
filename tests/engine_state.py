"""What an idle engine replica still holds that a request left behind: `replica_leftovers(replica)` names each
thing with its values, an empty list being a replica in the state a fresh one is in, but for its clocks and the
per-request columns that only grow (engine/requests.py)."""


def replica_leftovers(replica) -> list[str]:
    """What an idle `Replica` still holds: requests, KV blocks, sequence slots, reservations, prefix cache
    references, a multi-step window, attention ranks' counts."""
    found = []

    def held(name, value, empty):
        if value != empty:
            found.append(f"{name}: {value!r}")

    held("arrivals (on their way to the engine)", list(replica.arrivals), [])
    held("at the front end", list(replica.at_front), [])
    queues = replica.waiting.queues if replica.ranks > 1 else [replica.waiting]
    held("waiting", [i for queue in queues for i in queue], [])
    held("decoding", list(replica.decoding), [])
    held("prefilling", [prefill.request for prefill in replica.prefills], [])
    held("finished, outputs not taken in", replica.unseen, [])
    held("free KV blocks", replica.free_blocks, replica.cache_blocks)
    if replica.reserve:
        held("unreserved KV blocks", replica.unreserved_blocks, replica.cache_blocks)
    held("ranks admitting none", replica.shut_ranks, set())
    held("multi-step window steps left", replica.window_left, 0)
    held("multi-step window's tokens and events", (replica.window_host.emitted, replica.window_host.events), (0, 0))
    decoders = replica.decoders
    held("decoding sums (context, last ticks, outputs)",
         (decoders.context_sum, decoders.last_tick_sum, decoders.out_sum), (0, 0, 0))
    held("sequences due a block per tick", sum(decoders.block_due), 0)
    held("sequences due an event per tick", sum(decoders.event_due), 0)
    held("multi-step sequences done in the window", decoders.zombies, [])
    held("long outputs to come", (decoders.long_last, decoders.long_last_sum), ({}, 0))
    held("drafts' holds of finishing or completing sequences", (replica.finish_blocks, replica.completing_blocks),
         ({}, {}))
    if replica.held is not None:
        drafts = replica.held
        held("drafts' holds counted alone", (drafts.counted, drafts.need, drafts.trimmed, drafts.out),
             ({}, {}, {}, set()))
    if replica.ranks > 1:
        ranks = replica.waiting
        held("attention ranks' requests", ranks.rank_of, {})
        held("attention ranks' running counts", ranks.running, [0] * replica.ranks)
        held("attention ranks' prompt tokens", ranks.tokens, [0] * replica.ranks)
    prefix = replica.prefix
    if prefix is not None:
        held("prefix cache references", {key: refs for key, (_, refs) in prefix.entries.items() if refs}, {})
        held("prefix cache holders", (prefix.held, prefix.shared, prefix.next_segment), ({}, {}, {}))
        prefix._sync(replica.free_blocks)  # (the blocks taken since its last look)
        held("prefix cache's free queue", prefix.queued, replica.cache_blocks)
    return found
