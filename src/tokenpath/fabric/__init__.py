"""Traffic layer: topologies, their routing and link loads, and collectives on them."""
