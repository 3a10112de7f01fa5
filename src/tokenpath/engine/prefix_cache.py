"""Automatic prefix caching: KV blocks of shared prefixes kept after use and reused, as vLLM V1's
KVCacheManager and BlockPool do (vllm/v1/core/kv_cache_manager.py, block_pool.py).

What it follows from vLLM:
- A block is named by the hash chain of its tokens (here: the workload's prefix keys, see
  prefixes.py); it becomes reusable once it is full and allocated for computing (vLLM caches
  blocks in allocate_slots, for the tokens about to be computed).
- A request that arrives looks up the longest run of cached blocks from its start (whole blocks), up
  to its length less one token: the last token is always computed, to sample from. Those blocks are
  shared (a reference count each) and their prefill is skipped; they still take their place in memory.
- All free blocks wait in one queue, least recently freed first; a freed request puts its blocks at
  the tail, its last blocks first (so they go before its earlier ones). A block taken for new tokens
  comes off the head, and if it held a cached prefix that prefix is forgotten (evicted). A cached
  block that gets a new reference leaves the queue.

- A server may hold prefixes before the run's first request (prefixes.py's `warm`: what earlier runs
  left cached): they lie in the free queue behind the never-used blocks, least recently used first,
  as the blocks earlier requests freed would; those the cache cannot hold are the least recent.
- A preempted request leaves its blocks as a finished one does, named: the engine's scheduler
  (engine/profiles.py, Profile.preempted_keeps) says how many of its tokens stay cached, and when it
  is admitted again it finds them, from its start, unless they were evicted meanwhile. vLLM's
  `_preempt_request` (vllm/v1/core/sched/scheduler.py) frees the request's blocks and sets its
  num_computed_tokens to 0, and the waiting loop then looks the request up as any new one
  (`get_computed_blocks`): it finds every full block it had computed.

Approximated: blocks are handled per prefix segment (a Mooncake hash id is 512 tokens, 32 blocks of
16): a segment is reused whole or not at all, and evicting any of its blocks forgets all of it (its
other blocks count as plain free blocks). Named segments past the prompt (a session turn's answer)
become cached when the request finishes. Beyond the workload's shared prefixes a request's own
tokens are named only when it is preempted: its kept blocks after its prefix segments are one run,
found again by it alone; blocks taken from the run come off its end (vLLM frees a request's last
blocks first), so what is left of it is still found.

Bookkeeping, so that the engine stays O(1) per step: the engine keeps its count of free blocks
(cached ones included) and takes blocks by lowering it; what those takings evicted is worked out only
when a lookup needs to know (`_sync`): the queue is first in, first out, so the blocks taken since
come off its head in the same order either way.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

_PLAIN = -1  # a queue item of plain free blocks (no cached prefix)


class PrefixCache:
    def __init__(self, block_size: int, free_blocks: int, warm: Sequence[tuple[int, int]] = ()) -> None:
        """A cache of `free_blocks` free blocks of `block_size` tokens; `warm`: the segments it holds
        already, (key, blocks) each, least recently used first."""
        self.block = block_size
        self.entries: dict[int, list[int]] = {}  # key -> [blocks, references]
        # The free-block queue, head first: item id -> [key or _PLAIN, blocks]. A cached segment's id
        # is its key; runs of plain blocks get negative ids.
        self.queue: OrderedDict[int, list[int]] = OrderedDict()
        self._plain_id = -1
        self.queued = 0  # blocks in the queue
        self._append_plain(free_blocks)
        # Per request with a prefix: its keys and the block each segment ends at, the keys it
        # references, the blocks in them, and its next segment to cache.
        self.segments: dict[int, tuple[list[int], list[int]]] = {}
        self.held: dict[int, list[int]] = {}
        self.shared: dict[int, int] = {}
        self.next_segment: dict[int, int] = {}
        self.hit_tokens: dict[int, int] = {}  # at each request's first admission
        # Per preempted request: the run of its own blocks it left cached, (first block, end block, key);
        # a run's key, ("run", request, serial), is one no other entry or queue item has had.
        self.runs: dict[int, tuple[int, int, tuple]] = {}
        self._runs_made = 0
        if warm:
            self._hold_warm(warm, free_blocks)

    def _hold_warm(self, warm: Sequence[tuple[int, int]], free_blocks: int) -> None:
        """Turn free blocks at the queue's tail into the warm segments, the most recent that fit."""
        kept: list[tuple[int, int]] = []
        room = free_blocks
        for key, blocks in reversed(warm):
            if key in self.entries or blocks > room:
                continue
            self.entries[key] = [blocks, 0]
            kept.append((key, blocks))
            room -= blocks
        if not kept:
            return
        plain_id = next(iter(self.queue))  # the one run of never-used blocks
        self.queue[plain_id][1] = room
        if not room:
            del self.queue[plain_id]
        for key, blocks in reversed(kept):
            self.queue[key] = [key, blocks]

    def add(self, i: int, keys: list[int], end_tokens: list[int]) -> None:
        """Request i's prefix: its segment keys and the token each segment ends at."""
        self.segments[i] = (keys, [end // self.block for end in end_tokens])

    # -- lookups -------------------------------------------------------------------------------------

    def lookup(self, i: int, target: int, free_blocks: int) -> tuple[int, int, int]:
        """Request i (needing `target` tokens in its cache) against the cache: (segments found, blocks
        found, blocks of theirs now in the free queue). Changes nothing but pending evictions.

        Blocks are found up to (target - 1) // block, as vLLM's get_computed_blocks
        (v1/core/kv_cache_manager.py: max_cache_hit_length = num_tokens - 1) and
        find_longest_cache_hit (v1/core/single_type_kv_cache_manager.py: max_length // block_size
        blocks) find them: a segment that holds the last token is found up to that block (cut), not
        dropped whole."""
        self._sync(free_blocks)
        keys, ends = self.segments[i]
        cap, entries = (target - 1) // self.block, self.entries
        found = queued = hit = 0
        for key, end in zip(keys, ends):
            entry = entries.get(key)
            if entry is None or (end > cap and hit == cap):
                break
            if not entry[1]:
                queued += entry[0]
            found += 1
            if end > cap:  # it holds the last token: found up to the cap (a cut segment), the rest computed
                hit = cap
                break
            hit = end
        if hit == (ends[found - 1] if found else 0):  # (a run follows whole segments only)
            run = self._reachable_run(i, found)  # (it ends within cap: its tokens were computed, target one more)
            if run is not None:
                queued += run[1] - run[0]
                hit = run[1]
        return found, hit, queued

    def _reachable_run(self, i: int, found: int) -> tuple[int, int, tuple] | None:
        """Request i's kept run, if it follows the prefix segments found, every one of them whole."""
        run = self.runs.get(i)
        keys, ends = self.segments[i]
        if run is None or found < len(keys) or run[0] != (ends[-1] if ends else 0):
            return None
        return run

    def cached_blocks(self, keys: list[int], ends: list[int], free_blocks: int) -> int:
        """Blocks of this prefix that are cached (for a router's look)."""
        self._sync(free_blocks)
        blocks = 0
        for key, end in zip(keys, ends):
            if key not in self.entries:
                break
            blocks = end
        return blocks

    def acquire(self, i: int, found: int, hit: int, first: bool) -> None:
        """Request i is admitted with its first `found` segments from the cache, `hit` blocks in all
        (lookup's answer). The last segment may be cut at the hit: it is held whole, but the request
        computes its blocks past the hit into blocks of its own, so they do not count as shared."""
        keys, ends = self.segments[i]
        held, shared = [], 0
        for key in keys[:found]:
            entry = self.entries[key]
            if not entry[1]:
                del self.queue[key]
                self.queued -= entry[0]
            entry[1] += 1
            held.append(key)
            shared += entry[0]
        segments_hit = min(hit, ends[found - 1]) if found else 0
        cut = (ends[found - 1] if found else 0) - segments_hit  # blocks of a cut segment it computes again
        shared -= cut
        run = self.runs.get(i)
        if run is not None:  # its own run, kept when it was preempted
            key, reachable = run[2], not cut and self._reachable_run(i, found) is not None
            del self.entries[key], self.runs[i]
            if reachable:
                self.queued -= self.queue.pop(key)[1]  # its blocks are its own again
            else:  # plain free blocks where they lie
                self.queue[key][0] = _PLAIN
        self.held[i], self.shared[i], self.next_segment[i] = held, shared, found
        if first:
            self.hit_tokens[i] = segments_hit * self.block

    def computed(self, i: int, tokens: int) -> None:
        """Request i has blocks for its first `tokens` tokens: its full prefix segments among them
        become cached (unless another request cached the same one meanwhile: then its copy stays its own)."""
        k = self.next_segment.get(i)
        if k is None:
            return
        keys, ends = self.segments[i]
        full = tokens // self.block
        while k < len(keys) and ends[k] <= full:
            if keys[k] not in self.entries:
                blocks = ends[k] - (ends[k - 1] if k else 0)
                self.entries[keys[k]] = [blocks, 1]
                self.held[i].append(keys[k])
                self.shared[i] += blocks
            k += 1
        self.next_segment[i] = k

    # -- freeing -------------------------------------------------------------------------------------

    def release(self, i: int, blocks: int, kept_tokens: int = 0) -> int:
        """Request i gives back its `blocks` blocks (finished or preempted): its own go to the queue's
        tail, then the prefix segments nobody else references, deepest first. A preempted request
        keeps its first `kept_tokens` cached: the whole blocks of them past its prefix segments are
        its run, queued before the segments. Returns the blocks that became free (cached ones
        included)."""
        held = self.held.pop(i, None)
        shared = 0
        if held is not None:
            shared = self.shared.pop(i)
            del self.next_segment[i]
        own = blocks - shared
        run = 0
        if kept_tokens:
            ends = self.segments.setdefault(i, ([], []))[1]
            start, end = (ends[-1] if ends else 0), kept_tokens // self.block
            run = max(end - start, 0)
        self._append_plain(own - run)
        if run:
            key = ("run", i, self._runs_made)
            self._runs_made += 1
            self.entries[key] = [run, 0]
            self.queue[key] = [key, run]
            self.queued += run
            self.runs[i] = (start, end, key)
        freed = own
        for key in reversed(held or ()):
            entry = self.entries[key]
            entry[1] -= 1
            if not entry[1]:
                self.queue[key] = [key, entry[0]]
                self.queued += entry[0]
                freed += entry[0]
        return freed

    def give_back(self, blocks: int) -> None:
        """Blocks the engine took and did not use (a sequence that finished inside a verify step of
        speculative decoding): free again, at the queue's tail."""
        self._append_plain(blocks)

    def _append_plain(self, blocks: int) -> None:
        if blocks <= 0:
            return
        self.queued += blocks
        if self.queue:
            last = self.queue[next(reversed(self.queue))]
            if last[0] == _PLAIN:
                last[1] += blocks
                return
        self.queue[self._plain_id] = [_PLAIN, blocks]
        self._plain_id -= 1

    def _sync(self, free_blocks: int) -> None:
        """Take off the queue's head the blocks the engine took since the last look, evicting the
        cached segments they held."""
        taken = self.queued - free_blocks
        queue = self.queue
        while taken > 0:
            item_id, item = next(iter(queue.items()))
            if item[0] == _PLAIN or isinstance(item[0], tuple):  # plain, or a run: taken from its end
                step = min(taken, item[1])
                item[1] -= step
                if not item[1]:
                    queue.popitem(last=False)
                if item[0] != _PLAIN:
                    i = item[0][1]
                    start, end, key = self.runs[i]
                    if item[1]:
                        self.entries[key][0] = item[1]
                        self.runs[i] = (start, end - step, key)
                    else:
                        del self.entries[key], self.runs[i]
            else:  # the whole segment is forgotten; what was not taken stays as plain free blocks
                queue.popitem(last=False)
                del self.entries[item[0]]
                step = min(taken, item[1])
                if item[1] > step:
                    queue[self._plain_id] = [_PLAIN, item[1] - step]
                    queue.move_to_end(self._plain_id, last=False)
                    self._plain_id -= 1
            taken -= step
            self.queued -= step
