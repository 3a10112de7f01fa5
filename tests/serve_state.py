"""What a `tokenpath serve` app holds once every request has ended: nothing a request left behind.

`leftovers(app)` reads the server's engines and front end directly (no endpoint exposes them) and names
each thing still held, with its values: an empty list is an idle server in the state a fresh one is in,
but for the clocks and the per-request columns that only grow (engine/requests.py).
"""

from engine_state import replica_leftovers
from tokenpath.serve.app import CONNECTIONS, SERVER


def leftovers(app) -> list[str]:
    """What a serve app holds once idle, per engine replica, its output slots and the connections."""
    found = []
    for k, engine in enumerate(app[SERVER].engines):
        where = f"engine {k}: "
        found += [where + item for item in replica_leftovers(engine.replica)]
        if engine.responses:
            found.append(where + f"responses: {sorted(engine.responses)}")
        if engine.unreleased:
            found.append(where + f"steps not released: {[step for step, *_ in engine.unreleased]}")
        for b, bank in enumerate(engine.output.banks):
            if len(bank.free) != bank.ids.size or bank.flushed:
                found.append(where + f"output bank {b}: {bank.ids.size - len(bank.free)} slots held, "
                                     f"flushed {sorted(bank.flushed)}")
    busy = [guard for guard in app[CONNECTIONS].open if guard.state == "busy"]
    if busy:
        found.append(f"connections with a request in progress: {len(busy)}")
    return found


def settled(app) -> bool:
    """Every engine idle, its clock behind the wall clock (a request sent now starts its own steps) and every
    step's tokens released, and every handler returned (a client can read a stream's end before its handler
    has): what `leftovers` and a timing comparison need."""
    return all(not engine.responses and engine.replica.idle and not engine.unreleased
               and engine.elapsed_ns() > engine.replica.now for engine in app[SERVER].engines) and \
        not any(guard.state == "busy" for guard in app[CONNECTIONS].open)


class SimulatedTimes:
    """Each request's simulated times in a serve app, by its response id: for each step that released tokens of
    it, when they left the server, in ns from when the request reached its engine. Two requests alike, each
    served by an idle engine, have the same times unless the engine kept something of the requests before."""

    def __init__(self, app) -> None:
        self.by_id: dict[str, list[int]] = {}
        for engine in app[SERVER].engines:
            self._watch(engine)

    def _watch(self, engine) -> None:
        replica, handles = engine.replica, {}
        submit, step = engine.submit, replica.step

        def submitted(response, upload_ns=0):
            submit(response, upload_ns)
            handles[response.handle] = self.by_id.setdefault(response.request_id, [])

        def stepped():
            finished = step()
            for emitters in replica.rows.released:
                for handle in emitters:
                    if handle in handles:
                        handles[handle].append(replica.last_leave_ns - replica.requests.arrival[handle])
            return finished

        engine.submit, replica.step = submitted, stepped
