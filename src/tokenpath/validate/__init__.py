"""Predictions against published measurements: the validation groups, the latency rows and their cross-validation."""
