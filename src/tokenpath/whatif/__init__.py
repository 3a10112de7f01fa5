"""What-ifs of a scenario: overrides simulated in full, the lever catalog and its ranking, capacity at an SLO."""
