"""Kernels behind the ops: ``registry`` says which kernel runs an op; ``cpu/`` holds them by op.

Nothing here imports numba at import time. See docs/dev/OPS.md for how to add a kernel.
"""
