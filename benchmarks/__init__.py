"""Benchmarks: per-index sweeps (Figures 10-13 of the PanJoin paper) and targets."""
