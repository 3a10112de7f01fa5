"""The simulation: a scenario resolved into a deployment, run through the engines and the last mile, and
summarized in the shared schema."""
