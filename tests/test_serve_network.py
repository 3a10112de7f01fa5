"""serve's emulated network: each event reaches the client half a round trip plus its bytes after it
was sent, in order, as simulate's delivery model charges it."""

import asyncio

from tokenpath.delivery.lastmile import LastMile
from tokenpath.delivery.spec import DeliverySpec
from tokenpath.serve.network import Network


def test_events_are_delayed_by_the_delivery_model_and_never_overtake():
    spec = DeliverySpec(network_rtt=0.020, network_bw=1e6)  # 1 MB/s: 1 us per byte
    last_mile = LastMile(spec)
    now = [0]
    queue = Network(last_mile).queue(clock_ns=lambda: now[0])
    queue.put_nowait(b"x" * 1000)        # 10 ms + 1 ms
    now[0] = 100_000
    queue.put_nowait(b"y" * 10)          # would arrive at 10.11 ms: not before the first
    now[0] = 5_000_000
    queue.put_nowait(None)               # the end: with the last event
    due = [item[0] for item in queue.items._queue]
    assert due == [11_000_000, 11_000_000, 11_000_000]
    assert last_mile.network_ns(1000) == 11_000_000
    # the model is simulate's: an event of k tokens is event_overhead + 4 k bytes
    event_bytes = spec.event_overhead_bytes + spec.bytes_per_token * 3
    assert last_mile.network_ns(event_bytes) == last_mile.event_network_ns(3)
    assert last_mile.network_ns(spec.request_overhead_bytes + spec.bytes_per_token * 50) == last_mile.upload_ns(50)


def test_the_client_never_gets_an_item_before_its_time_and_nothing_is_delayed_when_off():
    async def main():
        loop = asyncio.get_running_loop()
        clock = lambda: int(loop.time() * 1e9)  # noqa: E731  (the event loop's own clock)
        queue = Network(LastMile(DeliverySpec(network_rtt=0.040))).queue(clock_ns=clock)
        sent = clock()
        queue.put_nowait(b"event")
        queue.put_nowait(None)
        got = [await queue.get(), await queue.get()]
        return got, clock() - sent

    got, waited_ns = asyncio.run(main())
    assert got == [b"event", None]
    assert waited_ns >= 20_000_000   # half the 40 ms round trip, at least
    off = Network(LastMile(DeliverySpec(network_rtt=0.040)), enabled=False)
    assert off.delay_ns(10_000) == 0
