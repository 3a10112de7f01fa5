"""Sweeps: one scenario simulated at many points of a design space, each point a full simulation.

spec.py reads a sweep spec and lists its points; point.py simulates one point into a flat row;
store.py keeps finished rows durably and writes the table; run.py runs the missing points on local
processes or a Ray cluster; pareto.py finds the frontier of two metrics.
"""
