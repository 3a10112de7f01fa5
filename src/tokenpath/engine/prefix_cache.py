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

Approximated: blocks are handled per prefix segment (a Mooncake hash id is 512 tokens, 32 blocks of
16): a segment is reused whole or not at all, and evicting any of its blocks forgets all of it (its
other blocks count as plain free blocks). Named segments past the prompt (a session turn's answer)
become cached when the request finishes. Only the workload's shared prefixes carry names; a
request's own tokens are never found again (vLLM names them too, so a request preempted and
recomputed can find its own earlier blocks: here it finds only the shared ones).

Bookkeeping, so that the engine stays O(1) per step: the engine keeps its count of free blocks
(cached ones included) and takes blocks by lowering it; what those takings evicted is worked out only
when a lookup needs to know (`_sync`): the queue is first in, first out, so the blocks taken since
come off its head in the same order either way.
"""

from __future__ import annotations

from collections import OrderedDict

_PLAIN = -1  # a queue item of plain free blocks (no cached prefix)


class PrefixCache:
    def __init__(self, block_size: int, free_blocks: int) -> None:
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

    def add(self, i: int, keys: list[int], end_tokens: list[int]) -> None:
        """Request i's prefix: its segment keys and the token each segment ends at."""
        self.segments[i] = (keys, [end // self.block for end in end_tokens])

    # -- lookups -------------------------------------------------------------------------------------

    def lookup(self, i: int, target: int, free_blocks: int) -> tuple[int, int, int]:
        """Request i (needing `target` tokens in its cache) against the cache: (segments found, blocks
        they hold, blocks of theirs now in the free queue). Changes nothing but pending evictions."""
        self._sync(free_blocks)
        keys, ends = self.segments[i]
        cap, entries = (target - 1) // self.block, self.entries
        found = queued = 0
        for key, end in zip(keys, ends):
            entry = entries.get(key)
            if entry is None or end > cap:
                break
            if not entry[1]:
                queued += entry[0]
            found += 1
        return found, ends[found - 1] if found else 0, queued

    def cached_blocks(self, keys: list[int], ends: list[int], free_blocks: int) -> int:
        """Blocks of this prefix that are cached (for a router's look)."""
        self._sync(free_blocks)
        blocks = 0
        for key, end in zip(keys, ends):
            if key not in self.entries:
                break
            blocks = end
        return blocks

    def acquire(self, i: int, found: int, first: bool) -> None:
        """Request i is admitted with its first `found` segments from the cache."""
        keys = self.segments[i][0]
        held, shared = [], 0
        for key in keys[:found]:
            entry = self.entries[key]
            if not entry[1]:
                del self.queue[key]
                self.queued -= entry[0]
            entry[1] += 1
            held.append(key)
            shared += entry[0]
        self.held[i], self.shared[i], self.next_segment[i] = held, shared, found
        if first:
            self.hit_tokens[i] = (self.segments[i][1][found - 1] if found else 0) * self.block

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

    def release(self, i: int, blocks: int) -> int:
        """Request i gives back its `blocks` blocks (finished or preempted): its own go to the queue's
        tail, then the prefix segments nobody else references, deepest first. Returns the blocks that
        became free (cached ones included)."""
        held = self.held.pop(i, None)
        if held is None:
            self._append_plain(blocks)
            return blocks
        own = blocks - self.shared.pop(i)
        del self.next_segment[i]
        self._append_plain(own)
        freed = own
        for key in reversed(held):
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
            if item[0] == _PLAIN:
                step = min(taken, item[1])
                item[1] -= step
                if not item[1]:
                    queue.popitem(last=False)
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
