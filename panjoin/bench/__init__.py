"""Benchmark runners shared by ``panjoin bench`` and the sweep scripts in ``benchmarks/``."""
