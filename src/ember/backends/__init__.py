"""Backends: cpu (numpy + numba kernels) and meta (shape-only arrays)."""
